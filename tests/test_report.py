"""The run report: the numbers it plots (hand-computed), and the page and PNG of a real short
run (every panel whose metrics exist is drawn, the others say "not recorded", plotly.js is
inline, rollouts are coloured by policy lag)."""

import re
from pathlib import Path

import pytest

from reroll import report_data as rd
from reroll.cli import main
from reroll.report_samples import lag_colour, render_response


def test_wilson_interval_by_hand():
    # p = 0.8, n = 20, z^2 = 3.8416: centre = (0.8 + 3.8416/40) / (1 + 3.8416/20)
    #   = 0.89604 / 1.19208 = 0.751661; half = 1.96 sqrt(0.16/20 + 3.8416/1600) / 1.19208
    #   = 1.96 * 0.1019853 / 1.19208 = 0.167684  ->  (0.583977, 0.919345)
    lo, hi = rd.wilson(0.8, 20)
    assert lo == pytest.approx(0.583977, abs=1e-5) and hi == pytest.approx(0.919345, abs=1e-5)
    # p = 1 keeps a lower bound below 1: centre = (1 + 0.09604)/1.19208 = 0.919435,
    # half = 1.96 sqrt(0.002401)/1.19208 = 1.96 * 0.049 / 1.19208 = 0.080565 -> 0.838870
    lo, hi = rd.wilson(1.0, 20)
    assert lo == pytest.approx(0.838870, abs=1e-5) and hi == 1.0
    assert rd.wilson(0.5, 0) == (0.0, 1.0)


def test_quantile_interpolates_linearly():
    # sorted [1, 2, 4, 10]: q=0.5 at position 1.5 -> 2 + 0.5 * (4 - 2) = 3
    assert rd.quantile([4, 1, 10, 2], 0.5) == 3.0
    # q=0.9 at position 2.7 -> 4 + 0.7 * 6 = 8.2
    assert rd.quantile([4, 1, 10, 2], 0.9) == pytest.approx(8.2)
    assert rd.quantile([7], 0.1) == 7


def test_run_names_are_the_shortest_distinct_suffixes(tmp_path):
    a, b = tmp_path / "a" / "rl", tmp_path / "b" / "rl"
    assert rd.run_names([a, b]) == ["a/rl", "b/rl"]
    assert rd.run_names([a]) == ["rl"]


def fake_run(rows, rollouts=()):
    return rd.Run("r", None, rows, list(rollouts))


def test_lag_shares_time_split_and_counts():
    run = fake_run([
        {"step": 1, "staleness/token_share_lag0": 1.0, "time/train_s": 1.0},
        {"step": 2, "staleness/token_share_lag0": 0.5, "staleness/token_share_lag1": 0.5,
         "time/train_s": 3.0, "pipeline/dropped_zero_variance": 2},
        {"step": 3, "pipeline/dropped_zero_variance": 5, "score_errors/math": 1},
    ])
    # lag 0: (1 + 0.5) / 2 = 0.75; lag 1: (0 + 0.5) / 2 = 0.25 (rows without lag keys skipped)
    assert rd.lag_shares(run) == {0: 0.75, 1: 0.25}
    assert rd.time_split(run) == {"train": 2.0}  # (1 + 3) / 2
    assert rd.last_counts(run, "pipeline/dropped_") == {"zero_variance": 5}
    assert rd.last_counts(run, "score_errors/") == {"math": 1}


def test_reward_keys_and_moving_average():
    # a binary reward: accuracy equals the mean on every row, so one curve
    same = fake_run([{"reward/mean": 0.5, "reward/accuracy": 0.5}, {"reward/mean": 1.0,
                                                                  "reward/accuracy": 1.0}])
    assert rd.reward_keys(same) == [("reward/mean", "reward (= train accuracy)")]
    shaped = fake_run([{"reward/mean": 0.7, "reward/accuracy": 0.5}])
    assert rd.reward_keys(shaped) == [("reward/mean", "reward"),
                                      ("reward/accuracy", "train accuracy")]
    # window 2 over [1, 3, 5, 9]: 1, (1+3)/2, (3+5)/2, (5+9)/2
    assert rd.moving_average([1, 3, 5, 9], 2) == [1.0, 2.0, 4.0, 7.0]
    # window 3: 1, 2, (1+3+5)/3, (3+5+9)/3
    assert rd.moving_average([1, 3, 5, 9], 3) == [1.0, 2.0, 3.0, pytest.approx(17 / 3)]
    assert rd.moving_average([4, 8], 1) == [4.0, 8.0]


def test_plot_runs_script_draws_two_runs(tmp_path, monkeypatch):
    import json
    import runpy
    import sys

    dirs = []
    for name, accs in (("a", [0.2, 0.6]), ("b", [0.3, 0.5])):
        d = tmp_path / name
        d.mkdir()
        rows = [{"step": s, "reward/mean": 0.1 * s} for s in range(1, 5)]
        rows += [{"step": 2 * i, "eval/greedy_accuracy": a, "eval/n_examples": 50}
                 for i, a in enumerate(accs)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        dirs.append(f"{name}={d}")
    out = tmp_path / "curves.png"
    script = Path(__file__).resolve().parents[1] / "scripts" / "plot_runs.py"
    monkeypatch.setattr(sys, "argv", ["plot_runs.py", str(out), *dirs])
    runpy.run_path(str(script), run_name="__main__")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_length_quantiles_and_sample_groups():
    def group(lengths):
        return {"rollouts": [{"tokens": [0] * (2 + n), "loss_mask": [False] * 2 + [True] * n}
                             for n in lengths]}
    run = fake_run([], [(1, group([1, 3])), (1, group([5])), (4, group([2, 2]))])
    # step 1: [1, 3, 5] -> median 3; step 4: [2, 2]
    assert rd.length_quantiles(run, (0.5,)) == ([1, 4], [[3.0, 2.0]])
    # 2 steps asked of 2 recorded: the first group of each
    assert [s for s, _ in rd.sample_groups(run, n_steps=2)] == [1, 4]


def test_response_spans_coloured_by_lag_and_environment_marked():
    r = {"tokens": [5, 6, 7, 8, 9], "prompt_len": 1, "completion": "",
         "spans": [{"start": 0, "end": 1, "source": "prompt", "version": -1},
                   {"start": 1, "end": 3, "source": "sampled", "version": 3},
                   {"start": 3, "end": 4, "source": "env", "version": -1},
                   {"start": 4, "end": 5, "source": "sampled", "version": 4}]}
    out = render_response(r, step=5, decode=lambda ids: "".join(chr(96 + i) for i in ids))
    # step 5 trains from version 4: the first turn lags 1, the second 0
    assert f'background:{lag_colour(1)}" title="sampled, version 3, lag 1, turn 1">fg<' in out
    assert 'title="environment">h<' in out
    assert f'background:{lag_colour(0)}" title="sampled, version 4, lag 0, turn 2">i<' in out


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    from reroll.config_checks import load_checked
    from reroll.runtime import train

    out = tmp_path_factory.mktemp("report") / "run"
    cfg = load_checked(None, [
        "model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
        "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
        "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
        "runtime.threads=1", "train.steps=6", "eval.every=3", "eval.n_examples=10",
        "runtime.max_staleness=1", "algo.kl_coef=0.01", f"out_dir={out}",
        'reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]'])
    train(cfg, progress=False)
    return out


def test_report_of_a_real_run(short_run, capsys):
    assert main(["report", str(short_run)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(short_run / "report.html"), str(short_run / "report.png")]
    page = (short_run / "report.html").read_text()
    assert "<script src" not in page and "Plotly.newPlot" in page  # plotly.js inline
    plotted = re.findall(r'data-panel="(\w+)" data-plotted="1"', page)
    missing = re.findall(r'data-panel="(\w+)" data-plotted="0"', page)
    # nothing was dropped and no score failed in this run; every other panel has data
    assert missing == ["dropped"]
    assert len(plotted) == 12 and page.count('class="plotly-graph-div"') == 12
    assert "not recorded in this run" in page
    assert "n = 10" in page  # the held-out sample size beside its interval
    assert page.count('title="sampled, version') >= 4  # the sample table, span by span
    assert (short_run / "report.png").stat().st_size > 10_000


def test_several_runs_overlay_in_one_page(short_run, tmp_path, capsys):
    import shutil

    other = tmp_path / "other" / "run"
    shutil.copytree(short_run, other, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    out = tmp_path / "both.html"
    assert main(["report", str(short_run), str(other), "--out", str(out), "--no-png"]) == 0
    assert capsys.readouterr().out.split() == [str(out)]
    page = out.read_text().replace("\\u002f", "/")  # plotly's JSON escapes "/"
    names = rd.run_names([short_run, other])
    assert names[0] != names[1]
    for name in names:  # one reward trace per run in the same panel
        assert f'"name":"{name}: reward (= train accuracy)"' in page


def chromium() -> str:
    """Debian's headless Chromium; installed with apt-get when missing and running as root,
    else the test is skipped saying why."""
    import os
    import shutil
    import subprocess

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("headless Chromium is not installed and this is not root with apt-get "
                    "(install Debian's package: apt-get install chromium)")
    for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "chromium"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if done.returncode == 0 and cmd[1] == "install":
            break
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"apt-get install chromium failed: {done.stderr.strip()[-300:]}")
    return found


def headless(browser: str, page, tmp_path, *flags: str):
    import subprocess

    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--virtual-time-budget=10000", *flags, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.browser
def test_report_renders_every_plot_in_headless_chromium(short_run, tmp_path):
    browser = chromium()
    page = short_run / "report.html"
    if not page.exists():
        from reroll.report_html import write_report

        write_report([short_run], page)
    expected = len(re.findall(r'data-plotted="1"', page.read_text()))
    dom = headless(browser, page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    # plotly marks a div it has drawn "js-plotly-plot" and puts its SVG inside
    drawn = re.findall(r'<div id="plot-(\w+)" class="[^"]*js-plotly-plot', dom.stdout)
    assert len(drawn) == expected == 12, drawn
    assert dom.stdout.count('class="main-svg"') >= expected
    console = [x for x in dom.stderr.splitlines() if ":CONSOLE" in x]
    assert console == [], "\n".join(console)  # no errors (nor anything else) logged
    shot = tmp_path / "report.png"
    done = headless(browser, page, tmp_path, "--window-size=1280,2600", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    # a PNG's width and height are big-endian at bytes 16-24 of its IHDR chunk
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (1280, 2600)
