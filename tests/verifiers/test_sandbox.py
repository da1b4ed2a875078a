"""The sandbox contains hostile programs and reports each with its reason; the host is
unaffected (no files written, no secrets read, no connections made, no processes left)."""

import os
import socket
import subprocess
import uuid
from dataclasses import replace

import pytest

from reroll.verifiers.sandbox import Limits, isolation, run_python

FAST = Limits(cpu_s=1, wall_s=2.0, memory_mb=256, file_mb=1, nproc=16, output_bytes=4096)


def leftover_sandbox_processes() -> list[str]:
    uid = isolation()["uid"]
    if uid is None:
        return []
    out = subprocess.run(["ps", "-o", "pid=,comm=", "-u", str(uid)], capture_output=True,
                         text=True).stdout
    return [ln for ln in out.splitlines() if ln.strip()]


def test_program_reads_stdin_and_writes_stdout():
    r = run_python("print(input()[::-1])", stdin="abc\n", limits=FAST)
    assert r.ok and r.stdout == "cba\n" and r.reason == ""


def test_nonzero_exit_reports_last_stderr_line():
    r = run_python("raise ValueError('bad input 3')", limits=FAST)
    assert r.exit_code == 1 and r.reason == "exit code 1: ValueError: bad input 3"


def test_infinite_loop_hits_cpu_limit():
    # a wall clock far above the CPU limit, so a busy machine cannot make the wall clock win
    r = run_python("while True: pass", limits=replace(FAST, wall_s=30.0))
    assert not r.ok and r.reason.startswith("CPU time limit of 1s exceeded")


def test_sleeping_program_hits_wall_clock_limit():
    r = run_python("import time; time.sleep(60)", limits=FAST)
    assert r.timed_out and r.exit_code is None and r.reason == "timed out after 2s wall clock"


def test_fork_bomb_is_contained_and_leaves_no_process():
    src = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(src, limits=FAST)
    assert not r.ok and r.reason  # stopped by a limit, with the reason
    assert leftover_sandbox_processes() == []


def test_memory_bomb_gets_memory_error():
    r = run_python("a = []\nwhile True:\n    a.append(' ' * 10**6)", limits=FAST)
    assert not r.ok and r.reason == "exit code 1: MemoryError"


def test_writing_outside_the_work_dir_does_not_reach_the_host(tmp_path):
    name = f"reroll-escape-{uuid.uuid4().hex}"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    targets = [f"/tmp/{name}", str(tmp_path / name), os.path.join(repo, name)]
    src = f"import sys\nfor p in sys.argv[1:] or {targets!r}:\n" + (
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('denied', p, type(e).__name__)\n"
        "open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())\n")
    r = run_python(src, limits=FAST)
    assert r.ok and r.stdout.rstrip().endswith("ok")  # its own work dir is writable
    for t in targets:
        assert not os.path.exists(t), t


def test_child_cannot_see_the_parents_secret_environment(monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("REROLL_TEST_SECRET", secret)
    src = (
        "import glob, os\n"
        f"s = {secret!r}.encode()\n"
        "print('env', any(s in v.encode() for v in os.environ.values()))\n"
        "hits = []\n"
        "for p in glob.glob('/proc/*/environ'):\n"
        "    try:\n        hits += [p] if s in open(p, 'rb').read() else []\n"
        "    except OSError:\n        pass\n"
        "print('proc', hits)\n"
        "print(sorted(os.environ))\n"
    )
    r = run_python(src, limits=FAST)
    assert r.ok
    lines = r.stdout.splitlines()
    assert lines[0] == "env False" and lines[1] == "proc []"
    assert "REROLL_TEST_SECRET" not in lines[2]


def test_network_socket_cannot_reach_a_host_listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        src = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n" \
              "print('connected')"
        r = run_python(src, limits=FAST)
        assert not r.ok and "connected" not in r.stdout
        assert ("unreachable" in r.reason or "network is disabled" in r.reason
                or "refused" in r.reason), r.reason
        with pytest.raises(BlockingIOError):
            server.accept()  # nobody connected
    finally:
        server.close()


def test_stdout_flood_is_capped():
    r = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", limits=FAST)
    assert not r.ok and r.output_truncated
    assert len(r.stdout) == 4096  # output_bytes
    assert "File too large" in r.reason or "file size limit" in r.reason


def test_segfault_is_reported_by_signal():
    r = run_python("import ctypes\nctypes.string_at(0)", limits=FAST)
    assert r.exit_code == -11 and r.reason == "killed by SIGSEGV"


def test_each_run_starts_in_an_empty_directory():
    r1 = run_python("open('left.txt','w').write('1')\nimport os; print(sorted(os.listdir('.')))",
                    limits=FAST)
    r2 = run_python("import os; print(sorted(os.listdir('.')))", limits=FAST)
    assert r1.stdout.strip() == "['left.txt', 'main.py']"
    assert r2.stdout.strip() == "['main.py']"


def test_no_sandbox_processes_remain_after_the_suite():
    assert leftover_sandbox_processes() == []


def test_fallback_without_namespaces_blocks_sockets_with_audit_hook(monkeypatch):
    from reroll.verifiers import sandbox

    iso = dict(isolation(), namespaces=False, unshare=None, network="audit-hook")
    monkeypatch.setattr(sandbox, "isolation", lambda: iso)
    r = run_python("import socket\nsocket.socket()\nprint('made a socket')", limits=FAST)
    assert not r.ok and "made a socket" not in r.stdout
    assert r.reason == ("exit code 1: PermissionError: network is disabled in the reroll "
                        "sandbox")
