"""Shared by this folder's tests (importable by name: pytest puts the folder on sys.path):
the token of the shared servers, and starting servers in subprocesses."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

TOKEN = "sekrit"  # the bearer token the shared servers want
AUTH = {"Authorization": f"Bearer {TOKEN}"}


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


def ready(proc: subprocess.Popen, timeout_s: float = 120.0, probe: str = "/health") -> Served:
    """Read the URL the server prints ('... on http://...'), then wait until ``probe``
    answers 200."""
    deadline = time.monotonic() + timeout_s
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the server exited ({proc.wait()}):\n{''.join(lines)}")
        lines.append(line)
        if " on http://" in line:
            served = Served(line.rsplit(" on ", 1)[1].strip(), proc)
            break
    while time.monotonic() < deadline:
        try:
            if httpx.get(served.url + probe, timeout=2).status_code == 200:
                return served
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    served.kill()
    raise RuntimeError(f"the server at {served.url} did not answer {probe} in {timeout_s} s")
