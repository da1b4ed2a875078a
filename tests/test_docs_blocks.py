"""Every fenced ```bash / ```sh / ```python / ```toml block of docs/*.md either runs here as
written, in order, in a fresh directory holding a copy of configs/, or is listed in SKIP (or
COVERED, run by another test) with its reason. A block in neither fails the test, so a new
block in docs/ is run or explained.

A block is named by its page and its first line. A bash line runs as
``reroll.cli.main(ARGS + SHORTER[subcommand])`` in this process (no interpreter start per
line): the only change to a line is the overrides in SHORTER, so that it takes seconds.
A toml block listed in FILES is saved under that name (the page says to save it so) before
the page's commands run. Each run line must exit 0; EFFECTS checks what a block leaves.
"""

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from reroll.cli import main

ROOT = Path(__file__).resolve().parents[1]
LANGS = ("bash", "sh", "python", "toml")

# Overrides appended to each command, by subcommand: few steps, no evaluation. Nothing else
# in a documented line changes.
SHORTER = {
    "sft": ["sft.steps=2", "eval.n_examples=0"],
    "train": ["train.steps=1", "rollout.batch_groups=2", "eval.every=0", "--no-progress"],
    "sim": ["sim.steps=3"],
}

# Commands another page (README.md) runs first and a doc block continues from.
SETUP = {"README.md": ["reroll sft configs/arithmetic.toml out_dir=runs/a/sft"]}

# toml blocks the page tells the reader to save, and the name it gives them.
FILES = {("runtime.md", "[sim]"): "h100_8b.toml"}

# Blocks run here, in page order, and what each leaves (a check on the working dir and the
# block's stdout).
RUN = {
    ("algorithms.md", "reroll sft   configs/mixed.toml out_dir=runs/mixed_sft"):
        lambda d, out: all((d / "runs/mixed" / r / "metrics.jsonl").is_file()
                           for r in ("ar3po", "dots")),
    ("algorithms.md", "reroll train configs/mixed.toml init=runs/mixed_sft out_dir=runs/mixed/rr "
                      "replay.buffer_size=256   # DOTS+RR"):
        lambda d, out: all((d / r / "metrics.jsonl").is_file()
                           for r in ("runs/mixed/rr", "runs/mixed/reuse", "runs/a/das")),
    ("configuration.md", "reroll config configs/arithmetic.toml algo        # every key of "
                         "[algo]: type, value, default, docstring"):
        lambda d, out: "algo.surrogate" in out and "ppo_clip" in out,
    ("runtime.md", "reroll sim configs/arithmetic.toml rollout.batch_groups=64 "
                   "rollout.group_size=16 \\"):
        lambda d, out: set(json.loads((d / "sim.json").read_text())["results"])
        == {f"max_staleness={k}" for k in (0, 1, 2, 4)},
    ("runtime.md", "[sim]"): lambda d, out: (d / "h100_8b.toml").is_file(),
    # a python block's "out" is the namespace it ran in: "2" right at 0.01 a character
    ("extending.md", "# my_rewards.py (in the working directory, or any importable package)"):
        lambda d, ns: ns["short_and_right"](["q", "q"], [" 2 ", "3"], ["2", "2"])
        == [1.0 - 0.03, 0.0 - 0.01],
}

# Blocks another test runs as written (the test named).
COVERED = {
    ("configuration.md", "reroll train configs/arithmetic.toml out_dir=runs/b init=runs/a/sft "
                         "preset=dapo runtime.max_staleness=2"):
        "README.md's block holds the same line: tests/test_readme_commands.py",
    ("extending.md", "# configs/my_data.toml"): "tests/test_readme_data_example.py",
    ("extending.md", "from reroll.verifiers import VERIFIERS, judged"):
        "tests/test_user_plugins.py",
    ("extending.md", "from reroll.rollout import Example"): "tests/test_user_plugins.py",
    ("extending.md", "from reroll.envs import ENVIRONMENTS, StepResult"):
        "tests/test_user_plugins.py",
    ("extending.md", "# my_env.toml, next to my_components.py"): "tests/test_user_plugins.py",
    ("extending.md", "reroll train my_env.toml                 # from the directory that holds "
                     "my_components.py"): "tests/test_user_plugins.py",
    ("extending.md", '[project.entry-points."reroll.plugins"]'):
        "tests/test_user_plugins.py installs a distribution whose entry_points.txt declares "
        "this group and module (what pip writes from this pyproject table)",
}

# Blocks not run, with the reason.
SKIP = {
    ("extending.md", "reroll sft   configs/my_data.toml out_dir=runs/my/sft"):
        "needs the user's data/problems.jsonl, which the page describes but does not hold "
        "(its config loads in tests/test_readme_data_example.py)",
    ("extending.md", "[reward]"): "a fragment of the user's config for my_rewards.py above",
    ("reasoning.md", "bash scripts/reasoning.sh                 # SFT (two stages), "
                     "evaluation, lengths, GRPO, evaluation, report"):
        "about 75 minutes on a 2-core CPU (two SFT stages, then GRPO); the task, the verifier "
        "and the micro-batched SFT have their own tests (tests/tasks/test_countdown_search.py, "
        "tests/verifiers/test_search_trace.py, tests/trainer/test_sft.py)",
    ("runs.md", "reroll import SmolLM2-135M-Instruct.Q4_1.gguf hf/smollm2"):
        "needs a downloaded GGUF file (network); reroll import is tested in tests/models",
    ("runs.md", "from reroll.recording.store import RolloutStore"):
        "needs README's RL run of 12 recorded steps (minutes); the store's API is tested in "
        "tests/recording",
    ("serving.md", "export REROLL_SERVE_TOKEN=... REROLL_API_KEY=...      # the same secret "
                   "on both sides"):
        "two processes and a secret: reroll serve is run by tests/test_readme_commands.py, "
        "the OpenAI engine against a live server by tests/serve",
}


def doc_blocks() -> list[tuple[str, str, str, str]]:
    """(page, language, first line, text) of every runnable-language block, in page order."""
    out = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for lang, text in re.findall(r"```(\w*)\n(.*?)```", page.read_text(), re.S):
            if lang in LANGS:
                out.append((page.name, lang, text.splitlines()[0], text))
    return out


def test_every_docs_block_is_run_covered_or_skipped_with_a_reason():
    keys = [(page, first) for page, _, first, _ in doc_blocks()]
    tables = {**RUN, **COVERED, **SKIP}
    missing = [k for k in keys if k not in tables]
    assert not missing, f"docs blocks neither run nor listed in tests/test_docs_blocks.py: " \
                        f"{missing}"
    stale = [k for k in tables if k not in keys]
    assert not stale, f"listed blocks no longer in docs/: {stale}"
    assert len(keys) == len(set(keys)), "two blocks of a page start alike: name them apart"
    assert not (set(RUN) & set(COVERED)) and not (set(RUN) & set(SKIP)) \
        and not (set(COVERED) & set(SKIP))
    assert all(reason for reason in {**COVERED, **SKIP}.values())


def _lines(text: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, blank lines dropped."""
    return [x for x in text.replace("\\\n", " ").splitlines() if x.strip()]


def _run_line(line: str, capsys) -> str:
    words = shlex.split(line, comments=True)
    assert words[0] == "reroll", line
    code = main([*words[1:], *SHORTER.get(words[1], [])])
    out, err = capsys.readouterr()
    assert code == 0, f"{line}\n{out[-2000:]}\n{err[-2000:]}"
    return out


@pytest.mark.filterwarnings("ignore")
def test_the_docs_blocks_run_as_written(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    for line in SETUP["README.md"]:
        _run_line(line, capsys)
    blocks = doc_blocks()
    for page, _, first, text in blocks:  # the files a page's commands read, first
        if (page, first) in FILES:
            (tmp_path / FILES[page, first]).write_text(text)
    ran = []
    for page, lang, first, text in blocks:
        if (page, first) not in RUN:
            continue
        out = ""
        if lang in ("bash", "sh"):
            out = "".join(_run_line(line, capsys) for line in _lines(text))
        elif lang == "python":
            out = {"__name__": "docs_block"}
            exec(compile(text, f"docs/{page}", "exec"), out)
        assert RUN[page, first](tmp_path, out), f"docs/{page} block {first!r}: its effect " \
                                               f"is missing\n{str(out)[-2000:]}"
        ran.append((page, first))
    assert sorted(ran) == sorted(RUN)
