"""README.md's block of `reroll` commands (under "The jobs") runs as written, line by line, in a
fresh directory holding a copy of configs/.

Each line is split by shlex (its comment stripped) and run as
``python -m reroll.cli ARGS + SHORTER[command]``: the only changes to a line are the overrides
in SHORTER (so that each command takes seconds, not hours) and the substitutions in SUBSTITUTE.
`reroll serve` is started, asked for its /health, and stopped with Ctrl-C (its exit is then
reroll's for an interrupt, 130 with "interrupted" and no traceback); every other command must
exit 0. Each has one concrete effect checked in EFFECTS (the files it says it writes, or
what it prints)."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST = "reroll sft   configs/arithmetic.toml out_dir=runs/a/sft"

# Overrides appended to each command, by subcommand: fewer steps and held-out examples.
# sft.steps=150 leaves the model accurate enough (a few percent) that DAPO's dynamic sampling
# finds groups whose rewards differ; rollout.batch_groups=4 keeps its refills short.
SHORTER = {
    "sft": ["sft.steps=150", "eval.n_examples=8"],
    "eval": ["eval.n_examples=8"],
    "train": ["train.steps=3", "rollout.batch_groups=4", "eval.every=0", "log_every=1",
              "ckpt_every=3", "--no-progress"],
    "replay": ["eval.every=0", "--no-progress"],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Substitutions in a line's arguments: `reroll serve` takes a free port, not 8000.
SUBSTITUTE = {"--port 8000": lambda: f"--port {_free_port()}"}


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _trained(run: Path, steps: int = 3) -> bool:
    return [r["step"] for r in _metrics(run) if "step" in r][-1] == steps


# One check per README line, in order: (the line's start, its effect in the working dir).
EFFECTS = [
    ("reroll sft", lambda d, out: (d / "runs/a/sft/model/config.json").is_file()),
    ("reroll eval", lambda d, out: "eval/greedy_accuracy" in json.loads(out.splitlines()[-1])),
    ("reroll train", lambda d, out: _trained(d / "runs/a/rl")
     and any((d / "runs/a/rl/rollouts").iterdir())),
    ("reroll train", lambda d, out: _trained(d / "runs/b")),
    ("reroll report", lambda d, out: (d / "report.html").is_file()
     and (d / "runs/a/rl/report.png").is_file() and (d / "runs/b/report.png").is_file()),
    ("reroll export", lambda d, out: (d / "hf/a/config.json").is_file()
     and (d / "hf/a/model.safetensors").is_file()),
    ("reroll replay", lambda d, out: (d / "runs/a/rloo/replay.json").is_file()
     and _trained(d / "runs/a/rloo")),
    ("reroll serve", lambda d, out: json.loads(out)["status"] == "ok"),
    ("reroll sim", lambda d, out: set(json.loads((d / "sim.json").read_text())["results"])
     == {"max_staleness=0", "max_staleness=2"} and (d / "sim.png").is_file()),
    ("reroll config", lambda d, out: "algo.surrogate" in out),
    ("reroll list", lambda d, out: "ppo_clip" in out),
]


def _readme_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    block = next(b for b in blocks if b.startswith(FIRST))
    return [line for line in block.splitlines() if line.strip()]


def _argv(line: str) -> list[str]:
    for old, new in SUBSTITUTE.items():
        line = line.replace(old, new())
    words = shlex.split(line, comments=True)
    assert words[0] == "reroll", line
    return [sys.executable, "-m", "reroll.cli", *words[1:], *SHORTER.get(words[1], [])]


def _serve(argv: list[str], cwd: Path, env: dict) -> str:
    """Start `reroll serve`, return its /health body, stop it with Ctrl-C: a clean interrupt."""
    port = argv[argv.index("--port") + 1]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "reroll serve: no /health in 60 s"
                time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 130 and "reroll serve: interrupted" in out, out
    assert "Traceback" not in out, out
    return body


def test_the_readme_commands_run_as_written(tmp_path):
    lines = _readme_lines()
    assert [line.split()[:2] for line in lines] == [p.split() for p, _ in EFFECTS], lines
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for line, (_, effect) in zip(lines, EFFECTS):
        argv = _argv(line)
        if argv[3] == "serve":
            out = _serve(argv, tmp_path, env)
        else:
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            out = done.stdout
        assert effect(tmp_path, out), f"{line}: its effect is missing\n{out}"
