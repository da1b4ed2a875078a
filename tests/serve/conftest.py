"""`reroll serve` in a subprocess on a free port: ``spawn(model_dir, *args)`` returns a
`Served` (its URL and process), terminated when the test (or module) that asked ends."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
from serve_helpers import TOKEN

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


@dataclass
class Served:
    url: str
    proc: subprocess.Popen

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def launch(model_dir, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "reroll.cli", "serve", str(model_dir),
                             "--port", "0", "--threads", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def ready(proc: subprocess.Popen, timeout_s: float = 120.0) -> Served:
    """Read the URL the server prints, then wait until its /health answers."""
    deadline = time.monotonic() + timeout_s
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"reroll serve exited ({proc.wait()}):\n{''.join(lines)}")
        lines.append(line)
        if " on http://" in line:
            served = Served(line.rsplit(" on ", 1)[1].strip(), proc)
            break
    while time.monotonic() < deadline:
        try:
            if httpx.get(served.url + "/health", timeout=2).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    served.kill()
    raise RuntimeError(f"reroll serve at {served.url} did not answer /health in {timeout_s} s")


def start(model_dir, *args: str) -> Served:
    """``reroll serve MODEL_DIR --port 0 --threads 1 ARGS``, answering."""
    return ready(launch(model_dir, *args))


def _spawner():
    """``spawn(model_dir, *args)`` starts one server; ``spawn.many(n, model_dir, *args)``
    starts n at once (their imports overlap). All are stopped at the end."""
    started: list[Served] = []
    procs: list[subprocess.Popen] = []

    def go(model_dir, *args: str) -> Served:
        return go.many(1, model_dir, *args)[0]

    def many(n: int, model_dir, *args: str) -> list[Served]:
        new = [launch(model_dir, *args) for _ in range(n)]
        procs.extend(new)
        started.extend(ready(p) for p in new)
        return started[-n:]

    go.many = many
    yield go
    for p in procs:
        Served("", p).stop()


spawn = pytest.fixture()(_spawner)
spawn_module = pytest.fixture(scope="module")(_spawner)



@pytest.fixture(scope="session")
def tiny_servers(tiny_dir):
    """Three `reroll serve` of the tiny model, shared by this folder's modules: S (index 0)
    serves every test; T1 and T2 are killed by one test each. All want ``TOKEN``."""
    gen = _spawner()
    spawn = next(gen)
    yield spawn.many(3, tiny_dir, "--token", TOKEN, "--max-batch", "16", "--max-body-mb",
                     "0.05", "--stream-interval-ms", "5")
    gen.close()
