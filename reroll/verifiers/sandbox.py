"""A subprocess sandbox for untrusted Python programs (the ``code`` verifier's engine).

Owns running one program with stdin and collecting its exit status and capped output.
Must not know about tests, scores or rewards.

Each run gets a fresh empty working directory and a scrubbed environment (PATH, LANG,
HOME=the working directory, nothing inherited). A small bootstrap (``_BOOT``) forks the
program and then:

- sets resource limits in the child: RLIMIT_CPU (seconds), RLIMIT_AS (address space),
  RLIMIT_FSIZE (largest file; stdout/stderr go to files, so this also caps output),
  RLIMIT_NPROC (processes), RLIMIT_CORE 0;
- when running as root, drops the child to an unprivileged uid/gid (``nobody``): it can
  then write only in its working directory and cannot read other users' ``/proc/*/environ``
  (RLIMIT_NPROC is not enforced for root, so this is also what makes it bite);
- enforces the wall-clock limit itself and kills the child's process group, so a program
  is stopped even if the process that started the sandbox dies.

Where ``unshare`` is permitted (root, CI), the bootstrap runs in new network, PID and mount
namespaces (``unshare -n -p -m -f --kill-child``): no network interface but loopback-down,
every process of the run dies with the bootstrap (fork bombs included), and ``/tmp``,
``/var/tmp`` and ``/dev/shm`` are private empty tmpfs mounts. Without namespaces (an
unprivileged user): the bootstrap is a child subreaper, so descendants that leave the
process group (``setsid`` daemons) are found and killed when the program ends, and where the
kernel has Landlock the program can write only beneath its working directory
(`reroll.verifiers.confine`); network is blocked only by an audit hook prepended to the
program (``socket.__new__`` raises PermissionError), which a determined program can evade
(e.g. with ctypes). ``isolation()`` says which mode is in effect; ``require_isolation``
refuses to score code with neither namespaces nor Landlock unless the user opts in.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import warnings
from dataclasses import dataclass, field

from reroll.errors import ConfigError
from reroll.verifiers.confine import (
    LANDLOCK,
    REAP,
    SECCOMP,
    SUBREAPER,
    landlock_abi,
    landlock_syscalls,
    seccomp_denied,
)

BOOT_FAIL = 121  # the bootstrap's own exit code when it cannot start the program
MARK = "reroll-sandbox:"

_NO_NET = (
    "import sys as _s\n"
    "def _reroll_no_net(event, args):\n"
    "    if event.startswith('socket.'):\n"
    "        raise PermissionError('network is disabled in the reroll sandbox')\n"
    "_s.addaudithook(_reroll_no_net); del _s, _reroll_no_net\n"
)

# Runs as `python -I -S -c _BOOT CONFIG_JSON`; must only use the standard library.
_BOOT = r"""
import json, os, resource, select, signal, sys, time
cfg = json.loads(sys.argv[1])
def fail(msg):
    os.write(2, (cfg["mark"] + " " + msg + "\n").encode()); os._exit(cfg["boot_fail"])
try:
    wd = os.open(cfg["workdir"], os.O_RDONLY | os.O_DIRECTORY)
    status = os.open(cfg["status"], os.O_WRONLY | os.O_TRUNC)  # before /tmp is hidden
    if cfg["mount"]:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.mount(b"none", b"/", None, 16384 | (1 << 18), None) != 0:  # MS_REC|MS_PRIVATE
            fail("mount --make-rprivate / failed, errno %d" % ctypes.get_errno())
        for d in cfg["tmpfs"]:
            if os.path.isdir(d) and libc.mount(b"tmpfs", d.encode(), b"tmpfs", 6,  # nosuid,nodev
                                               ("size=%dk,mode=1777" % cfg["tmpfs_kb"]).encode()):
                fail("mounting a private tmpfs on %s failed, errno %d" % (d, ctypes.get_errno()))
        # the host working directory is hidden now: recreate it inside the private /tmp
        src = os.read(os.open("main.py", os.O_RDONLY, dir_fd=wd), 1 << 24)
        os.mkdir("/tmp/work", 0o700)
        if cfg["uid"] is not None:
            os.chown("/tmp/work", cfg["uid"], cfg["gid"])
        with open("/tmp/work/main.py", "wb") as f:
            f.write(src)
        wd = os.open("/tmp/work", os.O_RDONLY | os.O_DIRECTORY)
        cfg["env"]["HOME"] = "/tmp/work"
except OSError as e:
    fail("setup failed: %r" % e)
#SUBREAPER#
t0 = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        os.setpgid(0, 0)
        os.fchdir(wd)
        for name, soft, hard in cfg["limits"]:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        if cfg["uid"] is not None:
            os.setgroups([]); os.setgid(cfg["gid"]); os.setuid(cfg["uid"])
#LANDLOCK#
#SECCOMP#
        os.execve(cfg["python"], [cfg["python"], "-I", "main.py"], cfg["env"])
    except BaseException as e:
        fail("could not start the program: %r" % e)
if hasattr(os, "pidfd_open"):
    timed_out = not select.select([os.pidfd_open(pid)], [], [], cfg["wall_s"])[0]
else:  # Linux < 5.3: poll
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() - t0 > cfg["wall_s"]:
            break
        time.sleep(0.005)
    timed_out = time.monotonic() - t0 > cfg["wall_s"]
if timed_out:
    os.killpg(pid, signal.SIGKILL)
_, st, ru = os.wait4(pid, 0)
try:
    os.killpg(pid, signal.SIGKILL)  # leftovers of the program's process group
except OSError:
    pass
#REAP#
os.write(status, json.dumps({"timed_out": timed_out, "wall_s": time.monotonic() - t0,
    "exit": os.waitstatus_to_exitcode(st), "maxrss_kb": ru.ru_maxrss}).encode())
os._exit(0)
"""


_BOOT = (_BOOT.replace("#SUBREAPER#\n", SUBREAPER)
         .replace("#LANDLOCK#\n", textwrap.indent(LANDLOCK, " " * 8))
         .replace("#SECCOMP#\n", textwrap.indent(SECCOMP, " " * 8))
         .replace("#REAP#\n", REAP))


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): the caller reports an error Score."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits. ``file_mb`` caps any file the program writes, stdout/stderr included;
    ``output_bytes`` is how much of stdout/stderr is read back."""

    cpu_s: int = 2
    wall_s: float = 4.0
    memory_mb: int = 512
    file_mb: int = 8
    nproc: int = 32
    output_bytes: int = 1 << 16


@dataclass
class RunResult:
    exit_code: int | None  # negative: killed by that signal; None: timed out
    stdout: str
    stderr: str
    timed_out: bool
    reason: str  # "" for a clean exit 0, else why it failed
    output_truncated: bool = False
    wall_s: float = 0.0
    isolation: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@functools.lru_cache(maxsize=1)
def isolation() -> dict:
    """What this machine permits: namespaces (unshare) and a uid to drop to (when root)."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    unshare = shutil.which("unshare")
    ns = False
    if unshare and root:
        try:
            ns = subprocess.run([unshare, "-n", "-p", "-m", "-f", "--kill-child", "true"],
                                capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ns = False
    uid = 65534 if root else None
    abi = landlock_abi() if landlock_syscalls() else 0
    level = "namespaces" if ns else ("landlock" if abi else "none")
    return {"namespaces": ns, "unshare": unshare if ns else None, "uid": uid, "gid": uid,
            "network": "netns" if ns else "audit-hook", "python": _interpreter(uid),
            "landlock": abi, "seccomp": bool(seccomp_denied()), "subreaper": True,
            "level": level}


def require_isolation(allow_unisolated: bool) -> dict:
    """The isolation in force, reported once; a ConfigError when programs could write
    outside their directory (no namespaces, no Landlock) unless the user opted in."""
    iso = isolation()
    mechs = [m for m, on in (("namespaces", iso["namespaces"]),
                             (f"landlock ABI {iso['landlock']}", iso["landlock"]),
                             ("seccomp", iso.get("seccomp")),
                             ("uid drop", iso["uid"] is not None), ("subreaper", True),
                             ("rlimits", True)) if on]
    line = f"code sandbox isolation: {iso['level']} ({', '.join(mechs)})"
    if iso["level"] == "none":
        if not allow_unisolated:
            raise ConfigError(f"{line}: policy-written programs could write and delete files "
                              f"outside their directory. Run where namespaces (root) or "
                              f"Landlock are available, or set "
                              f"reward.sandbox.allow_unisolated = true to accept the risk")
        warnings.warn(f"{line}; running unisolated (reward.sandbox.allow_unisolated)",
                      RuntimeWarning, stacklevel=2)
    else:
        print(line, file=sys.stderr)
    return iso


_PROBE = ("import os, sys; os.setgroups([]); os.setgid(int(sys.argv[2])); "
          "os.setuid(int(sys.argv[2])); os.execv(sys.argv[1], [sys.argv[1], '-I', '-c', 'pass'])")


def _interpreter(uid: int | None) -> str:
    """A Python the sandboxed user can execute: ours, else a system one of the same version
    (a venv's interpreter may live under a directory only root can enter)."""
    if uid is None:
        return sys.executable
    v = f"{sys.version_info.major}.{sys.version_info.minor}"
    seen: list[str] = []
    for cand in (sys.executable, os.path.realpath(sys.executable), f"/usr/bin/python{v}",
                 f"/usr/local/bin/python{v}", "/usr/bin/python3"):
        if cand in seen or not os.path.exists(cand):
            continue
        seen.append(cand)
        probe = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE, cand, str(uid)],
                               capture_output=True, timeout=30)
        if probe.returncode == 0:
            return cand
    raise SandboxError(f"no Python interpreter among {seen} can be run by uid {uid}")


def _reason(status: dict, limits: Limits, stderr: str) -> str:
    if status["timed_out"]:
        return f"timed out after {limits.wall_s:g}s wall clock"
    code = status["exit"]
    if code == 0:
        return ""
    if code < 0:
        sig = signal.Signals(-code)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and status["wall_s"] >= limits.cpu_s):
            return f"CPU time limit of {limits.cpu_s}s exceeded ({sig.name})"
        if sig == signal.SIGXFSZ:
            return f"file size limit of {limits.file_mb} MB exceeded (output or a file; SIGXFSZ)"
        return f"killed by {sig.name}"
    last = next((ln for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    return f"exit code {code}" + (f": {last.strip()[:300]}" if last else "")


def _read(path: str, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def run_python(source: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
    """Run ``source`` as ``main.py`` under ``limits``, feeding ``stdin``; never raises for
    anything the program does. Raises SandboxError when the sandbox itself cannot run."""
    limits = limits or Limits()
    iso = isolation()
    private = tempfile.mkdtemp(prefix="reroll-sbx-")  # ours: status, stdin, stdout, stderr
    work = tempfile.mkdtemp(prefix="reroll-run-")  # the program's empty working directory
    try:
        paths = {k: os.path.join(private, k) for k in ("status", "stdin", "stdout", "stderr")}
        with open(paths["stdin"], "w") as f:
            f.write(stdin)
        for k in ("status", "stdout", "stderr"):
            open(paths[k], "wb").close()
        with open(os.path.join(work, "main.py"), "w") as f:
            f.write(source if iso["namespaces"] else _NO_NET + source)
        if iso["uid"] is not None:
            os.chown(work, iso["uid"], iso["gid"])
        mb = 1 << 20
        cfg = {
            "workdir": work, "status": paths["status"], "mark": MARK, "boot_fail": BOOT_FAIL,
            "mount": iso["namespaces"], "tmpfs": ["/tmp", "/var/tmp", "/dev/shm"],
            "tmpfs_kb": limits.file_mb * 1024, "wall_s": limits.wall_s,
            "uid": iso["uid"], "gid": iso["gid"], "python": iso["python"],
            "landlock": iso["landlock"], "landlock_sys": landlock_syscalls(),
            "seccomp": seccomp_denied(),
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work,
                    "PYTHONIOENCODING": "utf-8"},
            "limits": [("RLIMIT_CPU", limits.cpu_s, limits.cpu_s + 1),
                       ("RLIMIT_AS", limits.memory_mb * mb, limits.memory_mb * mb),
                       ("RLIMIT_FSIZE", limits.file_mb * mb, limits.file_mb * mb),
                       ("RLIMIT_NPROC", limits.nproc, limits.nproc),
                       ("RLIMIT_CORE", 0, 0)],
        }
        prefix = [iso["unshare"], "-n", "-p", "-m", "-f", "--kill-child"] if iso["namespaces"] \
            else []
        cmd = prefix + [sys.executable, "-I", "-S", "-c", _BOOT, json.dumps(cfg)]
        with open(paths["stdin"], "rb") as fin, open(paths["stdout"], "wb") as fout, \
                open(paths["stderr"], "wb") as ferr:
            try:
                proc = subprocess.Popen(cmd, stdin=fin, stdout=fout, stderr=ferr, env={},
                                        cwd=private, start_new_session=True)
            except OSError as e:
                raise SandboxError(f"could not start the sandbox: {e}") from e
            try:
                proc.wait(timeout=limits.wall_s + 5.0)
            except subprocess.TimeoutExpired:  # the bootstrap itself is stuck: backstop
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise SandboxError(f"sandbox bootstrap did not finish within "
                                   f"{limits.wall_s + 5.0:g}s") from None
        stdout, trunc_out = _read(paths["stdout"], limits.output_bytes)
        stderr, trunc_err = _read(paths["stderr"], limits.output_bytes)
        with open(paths["status"]) as f:
            raw = f.read()
        status = json.loads(raw) if raw else {}
        if proc.returncode != 0 or not raw or (status["exit"] == BOOT_FAIL and MARK in stderr):
            detail = next((ln for ln in stderr.splitlines() if ln.startswith(MARK)), stderr[-300:])
            raise SandboxError(f"sandbox failed (bootstrap exit {proc.returncode}): {detail}")
        return RunResult(
            exit_code=None if status["timed_out"] else status["exit"], stdout=stdout,
            stderr=stderr, timed_out=status["timed_out"],
            reason=_reason(status, limits, stderr), output_truncated=trunc_out or trunc_err,
            wall_s=status["wall_s"], isolation=iso)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
