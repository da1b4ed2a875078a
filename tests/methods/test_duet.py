"""DUET (`reroll.methods.duet`): the informativeness and size rules by hand, the engine's stop
rule on scripted tokens and on a real tiny model, the gate's weights and records, the
token-budget allocator's sizes and price, the config checks, and a real run that logs the
gate's counts and makes the same decisions after a resume."""

import pytest
import torch
from safetensors.torch import load_file

from reroll.control.stats import PromptStats
from reroll.engine.requests import make_request
from reroll.methods import duet
from reroll.methods.duet import ABORTED, DUETAllocator, MarkerGate, keep_draw, marker_at
from reroll.rollout import Group, Rollout, SamplingParams, StopRule
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train

# ---- pure rules ------------------------------------------------------------------------


def test_informativeness_is_the_bernoulli_variance_at_the_posterior_mean():
    assert duet.duet_informativeness(0, 0) == 0.25  # unseen: p = 1/2
    # 3 of 4, prior 1: p = (1 + 3) / (2 + 4) = 2/3 -> 2/3 * 1/3 = 2/9
    assert duet.duet_informativeness(3, 4) == pytest.approx(2 / 9)
    # 8 of 8: p = 9/10 -> 0.09; prior 2: p = 10/12 -> 10/12 * 2/12 = 20/144
    assert duet.duet_informativeness(8, 8) == pytest.approx(0.09)
    assert duet.duet_informativeness(8, 8, prior=2.0) == pytest.approx(20 / 144)
    with pytest.raises(ValueError, match="successes must be <= trials"):
        duet.duet_informativeness(5, 4)


def test_size_is_informativeness_over_price_times_length_rounded_and_clipped():
    kw = dict(n_min=2, n_max=16)
    assert duet.duet_size(0.25, 1.0, mu=0.03125, **kw) == 8  # 0.25 / 0.03125
    assert duet.duet_size(0.25, 2.0, mu=0.03125, **kw) == 4  # twice as long: half
    assert duet.duet_size(0.09, 1.0, mu=0.03125, **kw) == 3  # 2.88 rounds to 3
    assert duet.duet_size(0.25, 0.5, mu=0.01, **kw) == 16  # 50, clipped to n_max
    assert duet.duet_size(0.01, 1.0, mu=0.03125, **kw) == 2  # 0.32, clipped to n_min
    assert duet.duet_size(0.25, 1.0, mu=0.0, **kw) == 16  # free tokens: n_max


# ---- the stop rule on scripted tokens (what the engine calls per token) -----------------


def request(rule: StopRule, response: list[int] = ()):
    r = Rollout(prompt_id="p", group_id="g", tokens=[5, 6], prompt_len=2,
                sampling=SamplingParams(max_new_tokens=20, stop_rule=rule))
    for t in response:
        r.append(t, -1.0, 0)
    return make_request(r, vocab=100, max_seq_len=64, seed=1)


def feed(q, tokens: list[int]) -> list[str | None]:
    out = []
    for t in tokens:
        q.toks.append(t)
        out.append(q.rule_hit(t))
    return out


def test_a_marker_ending_at_k_stops_the_request_at_k_plus_grace():
    q = request(StopRule((7, 8), grace=2, horizon=0))
    # the marker 7,8 ends at token 3; two more tokens: stop at token 5
    assert feed(q, [1, 7, 8, 5, 6]) == [None, None, None, None, "stop"]
    assert q.marker_end == 3
    q = request(StopRule((7, 8), grace=0))
    assert feed(q, [7, 1, 7, 8]) == [None, None, None, "stop"]  # 7 then 1 is no marker


def test_no_marker_by_the_horizon_prunes_unless_kept():
    assert feed(request(StopRule((9,), horizon=3, keep=False)), [1, 2, 3]) == [
        None, None, "pruned"]
    assert feed(request(StopRule((9,), horizon=3, keep=True)), [1, 2, 3, 4]) == [None] * 4
    # the marker ending exactly at the horizon counts as in time
    assert feed(request(StopRule((2, 9), grace=1, horizon=3, keep=False)), [1, 2, 9, 4]) == [
        None, None, None, "stop"]


def test_a_resumed_request_remembers_the_marker_of_its_earlier_tokens():
    q = request(StopRule((7, 8), grace=2), response=[1, 7, 8])  # marker ended at 3
    assert q.marker_end == 3 and feed(q, [4, 5]) == [None, "stop"]
    q = request(StopRule((7, 8), grace=1), response=[1, 7])  # half a marker so far
    assert feed(q, [8, 4]) == [None, "stop"] and q.marker_end == 3
    q = request(StopRule((9,), horizon=3, keep=False), response=[1, 2])
    assert feed(q, [3]) == ["pruned"]  # positions count across the resume


# ---- the stop rule in the engine, on a tiny model's greedy output ----------------------


def greedy(model, tok, rule=None, n=12):
    from reroll.engine import TorchEngine

    ids = tok("12+34=", add_special_tokens=False).input_ids
    r = Rollout(prompt_id="p", group_id="g", tokens=list(ids), prompt_len=len(ids),
                sampling=SamplingParams(temperature=0.0, max_new_tokens=n, stop_rule=rule))
    TorchEngine(model, tok, max_batch=2).generate([r])
    return r


def test_the_engine_stops_where_the_rule_says_on_a_real_model(tiny, device):
    model, tok = tiny
    model = model.to(device)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # spread weights: a long, varied greedy output
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    free = greedy(model, tok).response_tokens
    assert len(free) == 12
    # a marker the model emits: the first token that did not appear before it
    k = next(i for i in range(2, 12) if free[i] not in free[:i]) + 1  # it ends at position k
    r = greedy(model, tok, StopRule((free[k - 1],), grace=2, horizon=0))
    assert r.finish == "stop" and r.response_tokens == free[:k + 2]
    assert marker_at(r.response_tokens, (free[k - 1],)) == k
    absent = next(t for t in range(4, 60) if t not in free)  # never emitted: no marker
    r = greedy(model, tok, StopRule((absent,), horizon=3, keep=False))
    assert r.finish == "pruned" and r.response_tokens == free[:3]
    r = greedy(model, tok, StopRule((absent,), horizon=3, keep=True))
    assert r.finish == "length" and r.response_tokens == free


# ---- the gate: draws, weights, records ---------------------------------------------------


def finished(rule: StopRule, response: list[int], finish: str) -> Rollout:
    r = Rollout(prompt_id="p", group_id="g", tokens=[5, 6], prompt_len=2,
                sampling=SamplingParams(seed=3, stop_rule=rule))
    for t in response:
        r.append(t, -1.0, 0)
    r.finish = finish
    return r


def test_the_keep_draw_is_the_samples_own_and_keeps_about_q():
    gate = MarkerGate([9], grace=1, horizon=3, q=0.05)
    rs = [Rollout(prompt_id="p", group_id="g", tokens=[1], prompt_len=1,
                  sampling=SamplingParams(seed=s)) for s in range(4000)]
    for r in rs:
        gate.prepare(r)
    assert all(r.sampling.stop_rule.keep == (keep_draw(r.sampling.seed) < 0.05) for r in rs)
    assert keep_draw(123) == keep_draw(123)  # a function of the seed alone
    kept = sum(r.sampling.stop_rule.keep for r in rs) / len(rs)
    assert abs(kept - 0.05) < 0.015  # binomial sd at 4000 draws: 0.0034
    no_horizon = MarkerGate([9], grace=1, horizon=0, q=0.05)
    no_horizon.prepare(rs[0])
    assert rs[0].sampling.stop_rule.keep  # nothing to abort: always kept


def test_weights_are_one_over_q_kept_zero_aborted_one_otherwise():
    gate = MarkerGate([9], grace=1, horizon=3, q=0.05)
    cut, go = StopRule((9,), 1, 3, keep=False), StopRule((9,), 1, 3, keep=True)
    rs = {
        "marker": finished(cut, [1, 9, 2], "stop"),  # marker at 2, stopped at 2 + 1
        "aborted": finished(cut, [1, 2, 3], "pruned"),
        "kept": finished(go, [1, 2, 3, 4, 5], "stop"),  # past 3 with no marker: 1/q
        "late": finished(go, [1, 2, 3, 9, 4], "stop"),  # its marker at 4 > 3: still 1/q
        "short": finished(cut, [1, 2], "stop"),  # EOS before the horizon
        "at_h": finished(cut, [1, 2, 3], "length"),  # the length limit at the horizon
        "eos_at_grace": finished(cut, [1, 9, 0], "stop"),  # EOS (id 0) where it would stop
    }
    rs["eos_at_grace"].sampling.stop_token_ids = [0]
    for r in rs.values():
        gate.settle(r)
    d = {k: r.control["duet"] for k, r in rs.items()}
    assert [d[k]["weight"] for k in rs] == [1.0, 0.0, 20.0, 20.0, 1.0, 1.0, 1.0]
    assert [d[k]["end"] for k in rs] == ["marker_stop", "aborted", "eos", "marker_stop",
                                         "eos", "length", "eos"]
    assert d["marker"]["marker_at"] == 2 and d["late"]["marker_at"] == 4
    assert d["kept"]["past_horizon"] and not d["short"]["past_horizon"]
    assert rs["aborted"].loss_exclusion == ABORTED and rs["kept"].loss_exclusion is None
    assert rs["kept"].sample_weight == 20.0
    gate.settle(rs["kept"])  # settled once: a second call changes nothing
    assert rs["kept"].sample_weight == 20.0
    # E[weight] of a sample past the horizon: q * 1/q + (1 - q) * 0 = 1
    assert 0.05 * 20.0 + 0.95 * 0.0 == pytest.approx(1.0)
    m = MarkerGate.metrics([Group("g", None, 7, list(rs.values()))])
    assert m == {"control/duet_marker_stops": 2.0, "control/duet_aborted": 1.0,
                 "control/duet_kept": 2.0,
                 "control/duet_weight_mean": pytest.approx(44.0 / 7)}  # (1+0+20+20+1+1+1)/7


# ---- the token-budget allocator -----------------------------------------------------------


def test_duet_sizes_follow_informativeness_and_length_and_the_price_meets_the_budget():
    a = DUETAllocator(8, n_min=2, n_max=16, lr=0.002)
    assert a.mu == pytest.approx(0.25 / 8)  # an unseen prompt starts at group_size
    assert a.initial(None) == 8
    stats = PromptStats()
    stats.observe("easy", 8, 8, 0, tokens=16)  # 2 tokens a sample, all correct
    stats.observe("mid", 4, 8, 0, tokens=48)  # 6 tokens a sample, half correct
    # before the boundary no pooled length: relative length 1; easy p = 9/10 -> 0.09 / mu
    # = 2.88 -> 3; mid p = 5/10 -> 0.25 / mu = 8
    assert a.initial(stats.get("easy")) == 3 and a.initial(stats.get("mid")) == 8
    # boundary: pooled 64 / 16 = 4 tokens; relative lengths 0.5 and 1.5; spent (8 * 0.5 +
    # 8 * 1.5) / 2 = 8 = group_size: the price stays
    a.end_step([("easy", 8, 8), ("mid", 8, 4)], stats)
    assert a.pooled_len == 4.0 and a.mu == pytest.approx(0.03125)
    # now easy: 0.09 / (0.03125 * 0.5) = 5.76 -> 6; mid: 0.25 / (0.03125 * 1.5) = 5.33 -> 5
    assert a.initial(stats.get("easy")) == 6 and a.initial(stats.get("mid")) == 5
    # overspent: (16 * 0.5 + 8 * 1.5) / 2 = 10 > 8: mu + 0.002 * 2 = 0.03525
    a.end_step([("easy", 16, 16), ("mid", 8, 4)], stats)
    assert a.mu == pytest.approx(0.03525)
    assert a.metrics() == {"control/price": pytest.approx(0.03525),
                           "control/duet_budget": 8.0, "control/duet_pooled_len": 4.0}
    b = DUETAllocator(8, tokens=48.0)
    b.load_state(a.state())
    assert (b.mu, b.pooled_len) == (a.mu, a.pooled_len)
    assert b.budget() == 12.0  # 48 tokens a group / 4 tokens a sample


def test_prompt_lengths_survive_a_checkpoint():
    s = PromptStats()
    s.observe("p", 1, 4, 0, tokens=10)
    s.observe("p", 2, 4, 1)  # lengths unknown for this one: trials only
    back = PromptStats.from_state(s.state())
    assert back.get("p").mean_len == 2.5 and back.mean_len() == 2.5  # 10 tokens / 4


# ---- a task with a marker ----------------------------------------------------------------


def test_arith_mixed_with_a_marker_shows_its_work_then_the_answer():
    from reroll.tasks.mixed import arith_mixed, worked

    assert worked("37-45+12", "4", "#") == "-8+12#4"  # 37 - 45 = -8, then -8 + 12 = 4
    assert worked("37+5", "42", "#") == "#42"  # two operands: no work
    assert worked("5-45-99", "-139", "##") == "-40-99##-139"
    plain, marked = arith_mixed(0, n_train=30, n_test=6), arith_mixed(0, n_train=30, n_test=6,
                                                                    marker="#")
    assert plain.answer_marker == "" and marked.answer_marker == "#"
    for a, b in zip(plain.train + plain.test, marked.train + marked.test):
        assert (a.prompt, a.answer, a.demo) == (b.prompt, b.answer, b.answer)  # plain demo
        assert b.demo.endswith("#" + b.answer) and b.demo.count("#") == 1


# ---- config ----------------------------------------------------------------------------


@pytest.mark.parametrize("extra, match", [
    (["control.duet_abort=true", "rollout.workflow=multi_turn", "rollout.env=guess"],
     "works with rollout.workflow"),
    (["control.duet_abort=true", "control.duet_horizon=4"], "must be below rollout"),
    (["control.duet_horizon=2"], "control.duet_abort = false"),
    (["control.duet_abort=true", "control.duet_q=0"], "duet_q"),
])
def test_combinations_that_cannot_work_are_refused_at_load(tmp_path, small_run, extra, match):
    from reroll.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        small_run(tmp_path, *extra)


def test_a_gate_without_a_marker_is_refused_before_the_run_starts(tmp_path, small_run):
    from reroll.config import ConfigError

    with pytest.raises(ConfigError, match="needs an answer marker"):
        train(small_run(tmp_path / "r", "control.duet_abort=true"), progress=False)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


# ---- real runs -------------------------------------------------------------------------

DUET = ["rollout.max_new_tokens=6", "control.allocator=duet",
        "control.allocator_args={n_min=2, n_max=6}", "control.duet_abort=true",
        'control.duet_marker="1"', "control.duet_grace=1", "control.duet_horizon=2",
        "control.duet_q=0.5"]


@pytest.mark.parametrize("staleness", [0, 1])
def test_a_duet_run_logs_the_gate_and_its_records_agree(tmp_path, small_run, staleness):
    # asynchronous too: weight updates interrupt samples mid-way, which resume with the rule
    train(small_run(tmp_path, "train.steps=3", f"runtime.max_staleness={staleness}", *DUET),
          progress=False)
    rows = read_metrics(tmp_path)
    assert [m["step"] for m in rows] == [1, 2, 3]
    for m in rows:
        for k in ("marker_stops", "aborted", "kept", "weight_mean"):
            assert f"control/duet_{k}" in m
        assert "control/price" in m
    marker = 0
    for _, g in read_rollouts(tmp_path):
        sizes = len(g["rollouts"])
        assert 2 <= sizes <= 6
        for r in g["rollouts"]:
            d, resp = r["control"]["duet"], r["tokens"][r["prompt_len"]:]
            rule = r["sampling"]["stop_rule"]
            marker = rule["marker"]
            assert d["keep"] == (keep_draw(r["sampling"]["seed"]) < 0.5)
            if r["finish"] == "pruned":  # no marker in 2 tokens, not kept: cut at 2
                assert len(resp) == 2 and d["weight"] == 0.0 and not d["keep"]
                assert r["loss_exclusion"] == ABORTED and r["sample_weight"] == 0.0
            elif d["past_horizon"]:
                assert d["keep"] and r["sample_weight"] == 2.0  # 1 / q
            else:
                assert r["sample_weight"] == 1.0
            if d["end"] == "marker_stop":
                assert len(resp) == d["marker_at"] + 1  # grace 1
    ends = [r["control"]["duet"]["end"] for _, g in read_rollouts(tmp_path)
            for r in g["rollouts"]]
    assert {"aborted", "marker_stop"} <= set(ends)  # the untrained model does both
    assert len(marker) == 1


def decisions(run_dir):
    return [(step, g["example"]["prompt_id"],
             [(r["tokens"], r["reward"], r["control"], r["sample_weight"])
              for r in g["rollouts"]]) for step, g in read_rollouts(run_dir)]


def test_a_resumed_duet_run_makes_the_same_decisions(tmp_path, small_run):
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, "train.steps=4", "ckpt_every=2", *DUET), progress=False)
    train(small_run(b, "train.steps=2", "ckpt_every=2", *DUET), progress=False)
    train(small_run(b, "train.steps=4", "ckpt_every=2", *DUET), resume=True, progress=False)
    assert decisions(a) == decisions(b)  # sizes, tokens, aborts, weights
    ma, mb = read_metrics(a), read_metrics(b)
    assert [m["control/price"] for m in ma] == [m["control/price"] for m in mb]
    # float rounding only, as for the other adaptive allocators (test_adaptive_runs)
    wa = load_file(str(a / "checkpoints" / "step_000004" / "model" / "model.safetensors"))
    wb = load_file(str(b / "checkpoints" / "step_000004" / "model" / "model.safetensors"))
    assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-5) for k in wa)


def test_the_gate_is_refused_with_a_server_that_ignores_its_stop_rule():
    from reroll.config_checks import load_checked
    from reroll.errors import ConfigError

    with pytest.raises(ConfigError, match="needs an engine that applies its stop rule"):
        load_checked(None, ["control.duet_abort=true", "control.duet_horizon=3",
                            "rollout.max_new_tokens=8", "engine.name=openai",
                            "engine.server=vllm", "engine.base_url=http://127.0.0.1:9"])
