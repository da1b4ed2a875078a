"""The code sandbox as an unprivileged user (dropped to `nobody`: no namespaces): hostile
programs cannot write or delete the user's files outside their directory (Landlock), the
syscalls escapes are built from fail (seccomp: unshare, ptrace, bpf), and a `setsid` daemon
does not outlive the run (child subreaper). A control shows the same user
can write and delete those files outside the sandbox, so the checks are not vacuous."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY = "/usr/bin/python3"
NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(PY),
    reason="needs root (to drop to nobody) and a system Python nobody can run")

HOSTILE = {
    "write": "open('{victim}/escape.txt', 'w').write('x')",
    "delete": "import os; os.remove('{victim}/victim.txt')",
    "escape_syscalls": (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "for nr, args in ((272, (0x10000000,)), (101, (16, 1, 0, 0)), (321, (0, 0, 0))):\n"
        "    print(libc.syscall(nr, *args), ctypes.get_errno())\n"),  # unshare, ptrace, bpf
    "daemon": (
        "import os, time\n"
        "r, w = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.write(w, str(os.getpid()).encode()); time.sleep(60); os._exit(0)\n"
        "    os._exit(0)\n"
        "print(os.read(r, 32).decode())\n"),
}

DRIVER = """
import json, sys
from reroll.verifiers import sandbox
progs = json.loads(sys.argv[1])
out = {"isolation": sandbox.isolation()}
for name, src in progs.items():
    r = sandbox.run_python(src)
    out[name] = {"exit": r.exit_code, "stdout": r.stdout, "stderr": r.stderr[-300:]}
print(json.dumps(out))
"""


def as_nobody(code: str, *args: str) -> subprocess.CompletedProcess:
    def drop():
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)

    return subprocess.run([PY, "-c", code, *args], capture_output=True, text=True, timeout=120,
                          preexec_fn=drop, cwd="/tmp",
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_an_unprivileged_run_is_confined_to_its_directory_and_leaves_no_process(tmp_path):
    victim = Path("/tmp") / f"reroll-victim-{os.getpid()}"
    victim.mkdir()
    try:
        (victim / "victim.txt").write_text("keep me")
        os.chown(victim, NOBODY, NOBODY)
        os.chown(victim / "victim.txt", NOBODY, NOBODY)
        # control: outside the sandbox, nobody can write and delete there
        ctl = as_nobody(f"open('{victim}/ctl', 'w').write('x'); import os; "
                        f"os.remove('{victim}/ctl')")
        assert ctl.returncode == 0, ctl.stderr
        progs = {k: v.format(victim=victim) for k, v in HOSTILE.items()}
        res = as_nobody(DRIVER, json.dumps(progs))
        assert res.returncode == 0, res.stderr[-2000:]
        out = json.loads(res.stdout)
        iso = out["isolation"]
        if not iso["landlock"]:
            pytest.skip(f"this kernel has no Landlock: {iso}")
        assert iso["namespaces"] is False and iso["level"] == "landlock"
        assert out["write"]["exit"] != 0 and "PermissionError" in out["write"]["stderr"]
        assert not (victim / "escape.txt").exists()
        assert out["delete"]["exit"] != 0 and "PermissionError" in out["delete"]["stderr"]
        assert (victim / "victim.txt").read_text() == "keep me"
        if iso["seccomp"]:  # x86-64: the escape syscalls fail with EPERM (errno 1)
            assert out["escape_syscalls"]["stdout"].split("\n")[:3] == ["-1 1"] * 3, out
        pid = int(out["daemon"]["stdout"].strip())
        assert not Path(f"/proc/{pid}").exists()  # the setsid daemon was killed and reaped
    finally:
        shutil.rmtree(victim, ignore_errors=True)


def test_unisolated_code_scoring_is_refused_unless_opted_in(monkeypatch):
    from reroll.config import ConfigError
    from reroll.verifiers import sandbox

    none = {"namespaces": False, "unshare": None, "uid": None, "gid": None, "landlock": 0,
            "seccomp": False,
            "subreaper": True, "level": "none", "network": "audit-hook", "python": sys.executable}
    monkeypatch.setattr(sandbox, "isolation", lambda: none)
    with pytest.raises(ConfigError, match="allow_unisolated = true"):
        sandbox.require_isolation(False)
    with pytest.warns(RuntimeWarning, match="running unisolated"):
        assert sandbox.require_isolation(True)["level"] == "none"
