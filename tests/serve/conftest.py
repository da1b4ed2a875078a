"""`reroll serve` in a subprocess on a free port: ``spawn(model_dir, *args)`` returns a
`Served` (its URL and process), terminated when the test (or module) that asked ends."""

import subprocess

import pytest
from serve_helpers import TOKEN, Served, launch, ready

pytest.importorskip("uvicorn")
pytest.importorskip("httpx")


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
    try:
        yield go
    finally:  # also when the generator is closed (`tiny_servers`), not only exhausted
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
