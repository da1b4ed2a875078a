"""The scoring pool: results equal in-process scoring; a verifier that raises, hangs or
kills its worker yields an error Score with the reason, the pool recovers, stats count it."""

import sys

import pytest

from reroll.rollout import Example, Rollout
from reroll.verifiers import ScoringPool, build_reward

EX = Example("p", "q", "ok")
HOSTILE = "verifier 'python' (fn='reroll_test_rewards:hostile')"  # how errors name it


def rollout(text: str) -> Rollout:
    return Rollout("p", "g", [0], 0, completion=text)


@pytest.fixture()
def specs(rewards_module):
    return [{"name": "python", "args": {"fn": f"{rewards_module}:hostile"}},
            {"name": "exact", "weight": 2.0}]


def run(pool: ScoringPool, text: str):
    return pool.submit(rollout(text), EX).result(timeout=120)


def test_pool_results_equal_in_process_scoring():
    specs = [{"name": "math"}, {"name": "numeric", "args": {"tolerance": 0.01}, "weight": 0.5}]
    texts = [r"\boxed{0.5}", "0.499", "1/3", "none"]
    ex = Example("p", "q", "1/2")
    reward = build_reward(specs, {})
    with ScoringPool(specs, {}, workers=2, timeout_s=30) as pool:
        futs = [pool.submit(rollout(t), ex) for t in texts]
        got = [f.result(timeout=120) for f in futs]
    want = [reward(rollout(t), ex) for t in texts]
    assert [[(s.name, s.value) for s in g] for g in got] == \
        [[(s.name, s.value) for s in w] for w in want]
    # math 1/0, numeric |x - 0.5| <= 0.01: 0.5 -> 1+0.5; 0.499 -> 0+0.5; 1/3 -> 0+0; none -> 0+0
    assert [pool.combine(g) for g in got] == [1.5, 0.5, 0.0, 0.0]
    assert pool.stats()["calls"] == 4 and pool.stats()["error_total"] == 0


def test_raising_verifier_is_an_error_and_worker_survives(specs):
    with ScoringPool(specs, {}, workers=1, timeout_s=20) as pool:
        bad = run(pool, "raise")
        good = run(pool, "ok")
        st = pool.stats()
    assert not bad[0].ok and "raised RuntimeError: asked to raise" in bad[0].error
    assert bad[1].ok  # the other component still ran
    assert [s.value for s in good] == [1.0, 1.0] and pool.combine(good) == 3.0
    assert st["errors"] == {"python": 1} and st["worker_restarts"] == 0 and st["crashes"] == 0


def test_hanging_verifier_times_out_and_worker_is_replaced(specs):
    with ScoringPool(specs, {}, workers=1, timeout_s=2.0) as pool:
        hung = run(pool, "hang")
        good = run(pool, "ok")
        st = pool.stats()
    assert hung[0].error == f"{HOSTILE}: timed out after 2s"
    assert hung[1].error == "not run: verifier 'python' timed out after 2s"
    assert pool.combine(hung) is None and pool.combine(good) == 3.0
    assert st["timeouts"] == 1 and st["worker_restarts"] == 1
    assert st["errors"] == {"python": 1} and st["skipped"] == 1


@pytest.mark.parametrize(("text", "reason"), [("die", "exit code 7"),
                                              ("segv", "killed by SIGSEGV")])
def test_verifier_that_kills_its_worker_is_an_error_and_pool_recovers(specs, text, reason):
    with ScoringPool(specs, {}, workers=1, timeout_s=20) as pool:
        dead = run(pool, text)
        good = run(pool, "ok")
        st = pool.stats()
    assert dead[0].error == f"{HOSTILE}: scoring worker died ({reason})"
    assert [s.value for s in good] == [1.0, 1.0]
    assert st["crashes"] == 1 and st["worker_restarts"] == 1 and st["calls"] == 2


def test_thread_mode_captures_errors_and_abandons_hangs(specs):
    with ScoringPool(specs, {}, workers=0, timeout_s=1.0) as pool:
        bad = run(pool, "raise")
        hung = run(pool, "hang")
        good = run(pool, "ok")
        st = pool.stats()
    assert "asked to raise" in bad[0].error
    assert hung[0].error == (f"{HOSTILE}: timed out after 1s "
                             "(thread abandoned: it cannot be killed)")
    assert pool.combine(good) == 3.0
    assert st["timeouts"] == 1 and st["errors"] == {"python": 2} and st["worker_restarts"] == 0


def test_workers_do_not_import_torch_and_prints_do_not_break_protocol(rewards_module):
    import torch  # noqa: F401  (the parent has torch loaded; workers must not)

    assert "torch" in sys.modules
    specs = [{"name": "python", "args": {"fn": f"{rewards_module}:has_torch"}},
             {"name": "python", "args": {"fn": f"{rewards_module}:noisy"}}]
    with ScoringPool(specs, {}, workers=1, timeout_s=20) as pool:
        scores = run(pool, "x")
    assert pool.names == ["python", "python_2"]
    assert [s.value for s in scores] == [0.0, 2.0]


def test_submit_after_close_and_bad_arguments_raise():
    pool = ScoringPool([], {"name": "exact"}, workers=0)
    pool.close()
    with pytest.raises(RuntimeError, match="after close"):
        pool.submit(rollout("x"), EX)
    with pytest.raises(ValueError, match="workers must be >= 0"):
        ScoringPool([], {"name": "exact"}, workers=-1)
    with pytest.raises(KeyError, match="unknown verifier 'nope'"):
        ScoringPool([{"name": "nope"}], {}, workers=1)


def test_inline_scoring_answers_at_once_with_the_pools_values_and_errors(specs):
    """inline=True: the Future is already resolved when submit returns (scored in the
    caller's thread, no process), with the same values as the pool; a raising verifier is
    still an error Score, and the stats count the calls."""
    import threading

    cheap = [{"name": "exact", "weight": 2.0}, {"name": "numeric", "weight": 0.5}]
    ex = Example("p", "q", "12")
    texts = ["12", " 12 ", "12.0", "13", ""]
    with ScoringPool(cheap, {}, workers=1, timeout_s=30) as pool:
        want = [pool.submit(rollout(t), ex).result(timeout=120) for t in texts]
    before = set(threading.enumerate())
    with ScoringPool(cheap, {}, workers=1, timeout_s=30, inline=True) as pool:
        assert set(threading.enumerate()) == before  # no dispatcher thread, no worker
        futs = [pool.submit(rollout(t), ex) for t in texts]
        assert all(f.done() for f in futs)
        got = [f.result() for f in futs]
        assert pool.stats()["calls"] == 5 and pool.stats()["inline"] is True
    assert [[(s.name, s.value) for s in g] for g in got] == \
        [[(s.name, s.value) for s in w] for w in want]
    # exact (weight 2) then numeric (weight 0.5): "12" 2.5; " 12 " 2.5 (normalised);
    # "12.0" 0 + 0.5; "13" 0; "" 0
    assert [pool.combine(g) for g in got] == [2.5, 2.5, 0.5, 0.0, 0.0]
    with ScoringPool(specs, {}, inline=True) as pool:
        s = pool.submit(rollout("raise"), EX).result()
    assert not s[0].ok and "RuntimeError: asked to raise" in s[0].error and s[1].ok


@pytest.mark.parametrize("verifiers, inline, expect", [
    ([], "auto", True),  # the arithmetic task's numeric verifier is cheap
    ([{"name": "exact"}, {"name": "numeric"}], "auto", True),
    ([{"name": "math"}], "auto", False),  # math-verify can hang: the pool keeps a timeout
    ([{"name": "exact"}, {"name": "format", "args": {"pattern": "x"}}], "auto", False),
    ([{"name": "math"}], "always", True),
    ([], "never", False),
])
def test_reward_inline_auto_scores_inline_only_when_every_verifier_is_cheap(verifiers, inline,
                                                                            expect):
    from reroll import build_rollout
    from reroll.config import RunConfig
    from reroll.tasks import TASKS

    cfg = RunConfig()
    cfg.reward.verifiers, cfg.reward.inline = verifiers, inline
    task = TASKS.get("arithmetic")(0, n_train=4, n_test=2)
    assert build_rollout.score_inline(cfg, task) is expect
    pool = build_rollout.build_scorer(cfg, task)
    try:
        assert pool.inline is expect
    finally:
        pool.close()
