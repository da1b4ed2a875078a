"""`reroll serve` in a subprocess on a free port: ``spawn(model_dir, *args)`` returns a
`Served` (its URL and process), terminated when the test (or module) that asked ends."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

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


def start(model_dir, *args: str, timeout_s: float = 120.0) -> Served:
    """Start ``reroll serve MODEL_DIR --port 0 ARGS`` and wait until /health answers."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "reroll.cli", "serve", str(model_dir),
                             "--port", "0", "--threads", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + timeout_s
    url = None
    lines = []
    while url is None:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"reroll serve exited ({proc.wait()}):\n{''.join(lines)}")
        lines.append(line)
        if " on http://" in line:
            url = line.rsplit(" on ", 1)[1].strip()
    served = Served(url, proc)
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    served.kill()
    raise RuntimeError(f"reroll serve at {url} did not answer /health in {timeout_s} s")


def _spawner():
    started: list[Served] = []

    def go(model_dir, *args: str) -> Served:
        started.append(start(model_dir, *args))
        return started[-1]

    yield go
    for s in started:
        s.stop()


spawn = pytest.fixture()(_spawner)
spawn_module = pytest.fixture(scope="module")(_spawner)
