"""What an unprivileged process can do to confine a sandboxed program, as snippets of the
sandbox bootstrap (`reroll.verifiers.sandbox`; they use only the standard library) plus the
probe of what this kernel offers. Must not know about tests, scores or rewards.

- Child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux >= 3.4): descendants that
  escape the program's process group (double fork, ``setsid`` daemons) are re-parented to
  the bootstrap instead of init, which finds them in ``/proc/self/task/*/children`` and
  kills them when the program ends.
- Landlock (Linux >= 5.13 with Landlock enabled): before exec, the program is confined so
  that it can create, write, truncate, rename or delete files only beneath its working
  directory (reads stay allowed). ``PR_SET_NO_NEW_PRIVS`` is set first, as Landlock needs.
- seccomp (x86-64): a small BPF filter makes the syscalls a sandboxed program has no use
  for and that escapes are built from fail with EPERM (`DENIED`: ptrace, mount, unshare,
  setns, bpf, perf_event_open, keyctl, module and kexec loading, ...), and refuses the x32
  ABI. Other architectures run without it (reported by ``isolation()``).
"""

from __future__ import annotations

import ctypes
import functools
import platform

SYS_LANDLOCK = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}

# Run before forking the program: become the subreaper of everything it starts.
SUBREAPER = r"""
import ctypes as _ct
_libc = _ct.CDLL(None, use_errno=True)
_libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
"""

# Run in the child before exec when cfg["landlock"] (the ABI version) is set.
LANDLOCK = r"""
if cfg["landlock"]:
    import ctypes as _ct
    _libc = _ct.CDLL(None, use_errno=True)
    _create, _add, _restrict = cfg["landlock_sys"]
    _abi = cfg["landlock"]
    _write = sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12))  # write, remove, make_*
    if _abi >= 2: _write |= 1 << 13  # refer (rename/link across directories)
    if _abi >= 3: _write |= 1 << 14  # truncate
    _attr = _ct.c_uint64(_write)
    _rs = _libc.syscall(_create, _ct.byref(_attr), 8, 0)
    if _rs < 0:
        fail("landlock_create_ruleset failed, errno %d" % _ct.get_errno())
    class _Beneath(_ct.Structure):
        _pack_ = 1
        _fields_ = [("allowed", _ct.c_uint64), ("fd", _ct.c_int32)]
    _rule = _Beneath(_write, os.open(".", os.O_PATH | os.O_DIRECTORY))
    if _libc.syscall(_add, _rs, 1, _ct.byref(_rule), 0) != 0:  # LANDLOCK_RULE_PATH_BENEATH
        fail("landlock_add_rule failed, errno %d" % _ct.get_errno())
    if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        fail("no_new_privs failed, errno %d" % _ct.get_errno())
    if _libc.syscall(_restrict, _rs, 0) != 0:
        fail("landlock_restrict_self failed, errno %d" % _ct.get_errno())
"""

DENIED = {"ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
          "swapon": 167, "reboot": 169, "init_module": 175, "delete_module": 176,
          "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
          "unshare": 272, "perf_event_open": 298, "setns": 308, "process_vm_readv": 310,
          "process_vm_writev": 311, "finit_module": 313, "bpf": 321, "userfaultfd": 323,
          "open_by_handle_at": 304, "kexec_file_load": 320}

# Run in the child before exec when cfg["seccomp"] (x86-64 syscall numbers to deny) is set.
SECCOMP = r"""
if cfg["seccomp"]:
    import ctypes as _ct, struct as _st
    _libc = _ct.CDLL(None, use_errno=True)
    _nrs = cfg["seccomp"]
    def _ins(code, jt, jf, k):
        return _st.pack("HBBI", code, jt, jf, k)
    _deny = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
    _prog = [_ins(0x20, 0, 0, 4),  # A = arch
             _ins(0x15, 1, 0, 0xC000003E),  # x86-64? skip the next
             _ins(0x06, 0, 0, 0x7FFF0000),  # another arch: allow (no filter for it)
             _ins(0x20, 0, 0, 0),  # A = syscall number
             _ins(0x35, len(_nrs) + 1, 0, 0x40000000)]  # x32 ABI: deny
    for _i, _nr in enumerate(_nrs):
        _prog.append(_ins(0x15, len(_nrs) - _i, 0, _nr))  # listed: jump to deny
    _prog += [_ins(0x06, 0, 0, 0x7FFF0000), _ins(0x06, 0, 0, _deny)]
    _buf = _ct.create_string_buffer(b"".join(_prog))
    class _Fprog(_ct.Structure):
        _fields_ = [("len", _ct.c_ushort), ("filter", _ct.c_void_p)]
    _fp = _Fprog(len(_prog), _ct.cast(_buf, _ct.c_void_p))
    if _libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        fail("no_new_privs failed, errno %d" % _ct.get_errno())
    if _libc.prctl(22, 2, _ct.byref(_fp), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        fail("seccomp filter failed, errno %d" % _ct.get_errno())
"""


def seccomp_denied() -> list[int]:
    """Syscall numbers the filter denies on this machine ([] where it is not applied)."""
    return sorted(DENIED.values()) if platform.machine() == "x86_64" else []


# Run after the program exited: kill every descendant that is still alive (re-parented here).
REAP = r"""
def _children():
    out = []
    for _t in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/children" % _t) as _f:
                out += [int(x) for x in _f.read().split()]
        except OSError:
            pass
    return out
for _ in range(200):
    _left = _children()
    if not _left:
        break
    for _p in _left:
        try:
            os.kill(_p, signal.SIGKILL)
        except OSError:
            pass
    for _p in _left:
        try:
            os.waitpid(_p, 0)
        except OSError:
            pass
"""


@functools.lru_cache(maxsize=1)
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where Landlock is unavailable."""
    nums = SYS_LANDLOCK.get(platform.machine())
    if nums is None:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    v = libc.syscall(nums[0], None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(0, int(v))


def landlock_syscalls() -> tuple[int, int, int] | None:
    return SYS_LANDLOCK.get(platform.machine())
