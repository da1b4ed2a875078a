"""Per-version old log-probs: which snapshots are kept (by hand), each stale token's pi_prox
under its own version's weights (recorded per token), the fallback counted, and a
stopped-and-resumed run with snapshots equal to an uninterrupted one bitwise."""

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.rollout import Rollout
from reroll.runlog import read_metrics
from reroll.runtime import train
from reroll.trainer.batch import collate, flatten
from reroll.trainer.options import TrainerOptions
from reroll.trainer.snapshots import SNAPSHOT_FILE, VersionSnapshots
from reroll.trainer.step import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_step import groups_of  # noqa: E402  (the same tiny groups as the step's tests)


def test_snapshots_older_than_the_lag_are_released_and_the_oldest_evicted_at_the_bound():
    lin = torch.nn.Linear(1, 1)
    s = VersionSnapshots(lin, max_snapshots=3, lag=2)
    for v in range(4):
        s.keep(v, lin)
    # at version 3 a token is at least version 3 - 2 = 1: version 0 is released, not evicted
    assert sorted(s.weights) == [1, 2, 3] and s.evicted == 0
    s = VersionSnapshots(lin, max_snapshots=2, lag=5)
    for v in range(3):
        s.keep(v, lin)
    # versions 0..2 are all referenced (lag 5), the bound keeps 2: version 0 is evicted
    assert sorted(s.weights) == [1, 2] and s.evicted == 1
    back = VersionSnapshots(lin, max_snapshots=2, lag=5)
    back.load(s.state())
    assert sorted(back.weights) == [1, 2] and back.evicted == 1


class Tied(torch.nn.Module):
    """An embedding whose output layer is the same weight (as tie_word_embeddings builds)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def test_a_tied_models_snapshot_holds_the_shared_weight_once_and_keeps_it_shared(tmp_path):
    model = Tied()
    s = VersionSnapshots(model, max_snapshots=2, lag=1)
    s.keep(0, model)
    w = s.weights[0]
    assert w["embed.weight"] is w["head.weight"]  # one copy, two names
    assert s.nbytes() == 10 * 4 * 4  # 40 float32 values, counted once (not 320 bytes)
    with torch.no_grad():
        model.embed.weight.add_(1.0)  # the snapshot is a copy, not a view of the live weight
    assert not torch.equal(w["embed.weight"], model.embed.weight)
    torch.save(s.state(), tmp_path / "snap.pt")  # through a checkpoint file and back
    back = VersionSnapshots(model, max_snapshots=2, lag=1)
    back.load(torch.load(tmp_path / "snap.pt"))
    b = back.weights[0]
    assert b["embed.weight"] is b["head.weight"] and back.nbytes() == 160
    assert torch.equal(b["embed.weight"], w["embed.weight"])


def test_each_stale_token_gets_pi_prox_under_its_own_versions_weights(tiny):
    """Step 1 trains tokens of version 0 at version 0 (nothing stale). Step 2, at version 1,
    trains tokens of version 0 again: their pi_prox is the log-prob under the version-0
    weights (recorded in Rollout.old_logprobs), so pi_theta / pi_prox differs from 1 at the
    first pass; without snapshots (one mini-batch) pi_prox is the current weights and
    ppo_kl is exactly 0."""
    model, tok = tiny
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-2, old_snapshots=2, snapshot_lag=1),
                tokenizer=tok)
    m1 = t.step(groups_of([[1.0, 0.0], [0.0, 1.0]]))
    assert m1["offpol/snapshot_frac"] == 0.0 and m1["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    groups = groups_of([[1.0, 0.0], [0.0, 1.0]])
    m2 = t.step(groups)
    assert m2["offpol/snapshot_frac"] == 1.0 and m2["offpol/snapshot_fallback_frac"] == 0.0
    assert abs(m2["ppo_kl"]) > 1e-7
    # the recorded values are the version-0 weights' log-probs of each sampled token
    rollouts = flatten(groups)[0]
    ref = Trainer(model, build_objective(AlgoConfig()), TrainerOptions(pad_id=0, lr=1e-2))
    now = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(w0)
    want = ref._logprobs(model, collate(rollouts, 0))  # [N, L-1]
    model.load_state_dict(now)
    for i, r in enumerate(rollouts):
        assert len(r.old_logprobs) == len(r.tokens)
        for j, lp in enumerate(r.old_logprobs):
            if r.loss_mask[j]:
                assert lp == pytest.approx(float(want[i, j - 1]), abs=1e-6)
            else:
                assert lp is None  # prompt tokens
    assert Rollout.from_json(rollouts[0].to_json()).old_logprobs == rollouts[0].old_logprobs


def test_a_token_whose_version_has_no_snapshot_falls_back_and_is_counted(tiny):
    model, tok = tiny
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-2, old_snapshots=1, snapshot_lag=4),
                tokenizer=tok)
    t.step(groups_of([[1.0, 0.0]]))
    m = t.step(groups_of([[1.0, 0.0]]))  # version 0 evicted: the bound keeps 1 (version 1)
    assert m["offpol/snapshot_fallback_frac"] == 1.0 and m["offpol/snapshots_evicted"] == 1.0
    assert m["ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # pi_prox: the current weights


def test_a_rollout_without_old_logprobs_keeps_its_record_unchanged():
    r = Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=1)
    assert "old_logprobs" not in r.to_dict()
    with pytest.raises(ValueError, match="1 old_logprobs for 2 tokens"):
        Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=1, old_logprobs=[None])


def test_a_resumed_run_with_snapshots_equals_the_uninterrupted_one_bitwise(tmp_path, small_run):
    a, b = tmp_path / "a", tmp_path / "b"
    snap = ["train.old_snapshots=2", "ckpt_every=2"]
    train(small_run(a, "train.steps=4", *snap), progress=False)
    train(small_run(b, "train.steps=2", *snap), progress=False)
    train(small_run(b, "train.steps=4", *snap), resume=True, progress=False)
    ck = [tmp_path / x / "checkpoints" / "step_000004" for x in "ab"]
    wa, wb = (load_file(str(c / "model" / "model.safetensors")) for c in ck)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sa, sb = (torch.load(c / SNAPSHOT_FILE, map_location="cpu") for c in ck)
    # synchronous (lag 0): the last update started at version 3, the only one kept
    assert sorted(sa["weights"]) == sorted(sb["weights"]) == [3]
    for v in sa["weights"]:
        assert all(torch.equal(sa["weights"][v][k], sb["weights"][v][k]) for k in wa)


def test_an_asynchronous_run_takes_every_stale_token_from_its_snapshot(tmp_path, small_run):
    out = tmp_path / "run"
    train(small_run(out, "train.steps=4", "runtime.max_staleness=1", "train.old_snapshots=2"),
          progress=False)
    rows = [r for r in read_metrics(out) if r.get("step", 0) > 0]
    assert all(r["offpol/snapshot_fallback_frac"] == 0.0 for r in rows)
    assert len(rows) == 4 and any(r["offpol/snapshot_frac"] > 0 for r in rows)  # stale ones
