"""The Replay stage through the real pipeline on a tiny model: a step trains its fresh
groups plus groups replayed from earlier steps (exact copies of what was recorded then);
response reuse puts an earlier correct answer into a group with none; both resume from a
checkpoint bitwise and run asynchronously."""

import pytest
import torch
from safetensors.torch import load_file

from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train

# "a 7 anywhere in the completion": an untrained model gets it sometimes, so groups are
# mixed (replayable) and some have no success at all (reuse has work to do)
SEVEN = 'reward.verifiers=[{name="format", args={pattern="7", fullmatch=false}}]'


def samples_by_id(run_dir):
    return {r["sample_id"]: (step, r) for step, g in read_rollouts(run_dir)
            for r in g["rollouts"]}


def weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" /
                         "model.safetensors"))


def test_a_step_trains_fresh_groups_plus_exact_copies_of_earlier_ones(tmp_path, small_run):
    train(small_run(tmp_path, "train.steps=5", "replay.buffer_size=8", SEVEN),
          progress=False)
    recorded = read_rollouts(tmp_path)
    by_id = samples_by_id(tmp_path)
    replayed = 0
    for step in range(1, 6):
        groups = [g for s, g in recorded if s == step]
        fresh = [g for g in groups if not g["rollouts"][0]["parent_id"]]
        assert len(fresh) == 2  # half of rollout.batch_groups = 4 is generated
        assert len(groups) <= 4 and (step > 1 or len(groups) == 2)  # step 1: buffer empty
        fresh_prompts = {g["example"]["prompt_id"] for g in fresh}
        for g in groups[len(fresh):]:  # replayed groups follow the fresh ones
            replayed += 1
            assert g["example"]["prompt_id"] not in fresh_prompts
            rewards = [r["reward"] for r in g["rollouts"]]
            assert len(set(rewards)) > 1  # only informative groups are kept
            for r in g["rollouts"]:
                src_step, src = by_id[r["parent_id"]]
                assert src_step < step and not src["parent_id"]
                for k in ("tokens", "loss_mask", "logprobs", "versions", "reward"):
                    assert r[k] == src[k]
                assert {s["source"] for s in r["spans"]} == {"prompt", "replayed"}
    assert replayed > 0
    rows = read_metrics(tmp_path)
    assert [m["replay/samples_in_batch"] for m in rows] == [
        4 * (sum(1 for s, g in recorded if s == m["step"]) - 2) for m in rows]
    assert rows[-1]["replay/replayed_groups"] == replayed


def test_response_reuse_puts_a_banked_correct_answer_into_a_group_without_one(
        tmp_path, small_run):
    # 6 prompts, 4 a step: prompts come back, so a group may meet its prompt's banked answer
    train(small_run(tmp_path, "train.steps=6", "replay.reuse=true", "task.args.n_train=6",
                    SEVEN), progress=False)
    by_id = samples_by_id(tmp_path)
    reused = [(step, g, r) for step, g in read_rollouts(tmp_path) for r in g["rollouts"]
              if r["parent_id"]]
    assert reused, "no group without a correct answer met a banked one"
    for step, g, r in reused:
        src_step, src = by_id[r["parent_id"]]
        assert src_step < step and src["reward"] == 1.0 and src["tokens"] == r["tokens"]
        assert src["prompt_id"] == g["example"]["prompt_id"]
        others = [x for x in g["rollouts"] if x is not r]
        assert all(x["reward"] < 1.0 for x in others)  # the group had no success
        assert r["index_in_group"] == len(g["rollouts"]) - 1  # in place of the last member
    rows = read_metrics(tmp_path)
    assert rows[-1]["replay/injected"] == len(reused)


@pytest.mark.parametrize("extra", [["replay.buffer_size=6"],
                                   ["replay.reuse=true", "replay.buffer_size=6",
                                    "replay.fresh_fraction=0.75", "task.args.n_train=6"]])
def test_resume_is_bitwise_the_uninterrupted_run(tmp_path, small_run, extra):
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, "train.steps=4", "ckpt_every=2", SEVEN, *extra), progress=False)
    train(small_run(b, "train.steps=2", "ckpt_every=2", SEVEN, *extra), progress=False)
    train(small_run(b, "train.steps=4", "ckpt_every=2", SEVEN, *extra), resume=True,
          progress=False)

    def batches(d):
        return [(s, [(r["tokens"], r["parent_id"] is not None) for r in g["rollouts"]])
                for s, g in read_rollouts(d)]

    assert batches(a) == batches(b)
    wa, wb = weights(a, 4), weights(b, 4)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_replay_runs_asynchronously_without_stale_drops(tmp_path, small_run):
    train(small_run(tmp_path, "train.steps=4", "runtime.max_staleness=1",
                    "replay.buffer_size=8", "replay.reuse=true", SEVEN), progress=False)
    rows = read_metrics(tmp_path)
    assert len(rows) == 4 and all(m.get("pipeline/dropped_stale", 0) == 0 for m in rows)
    assert rows[-1]["replay/replayed_groups"] > 0
