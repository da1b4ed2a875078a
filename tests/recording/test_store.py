"""The rollout store: groups round-trip exactly (error scores, multi-turn masks, resumed
rollouts with several versions), a reader never sees a torn file while a writer appends,
a resume drops the records after its checkpoint, and a real run records every step."""

import json
import threading

import pyarrow.compute as pc
import pytest

from reroll.recording.store import RolloutStore
from reroll.rollout import Draft, Example, Group, SamplingParams, Score, SuffixSource, new_group
from reroll.runlog import RunDir, read_rollouts


def single_turn_group() -> Group:
    """3 samples of "1+2=": one resumed across versions 4 -> 5, one whose verifier raised."""
    ex = Example("p7", "1+2=", "3", demo="3", fields={"difficulty": "easy", "n": [1, 2]})
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=3,
                        stop_token_ids=[0], stop_strings=["\n"], seed=11)
    g = new_group(ex, 3, [5, 6, 7, 8], sp, version=4, max_size=6)
    a, b, c = g.rollouts
    a.append(9, -0.25, 4)
    a.resume_count, a.timings = 1, {"score_submit": 1.5, "score_done": 2.0}
    a.append(10, -1.0 / 3.0, 5)  # resumed under version 5: a second span
    a.append(0, -1e-12, 5)
    a.finish, a.completion = "stop", "33"
    a.scores = [Score("format", value=1.0, info={"parsed": "33", "why": ["ok"]},
                      latency_s=0.003)]
    a.reward = 1.0
    b.append(9, -0.5, 4)
    b.finish, b.scores = "error", [Score("format", error="TimeoutError: 3 s")]
    c.append(11, -2.75, 4)
    c.append(12, -0.125, 4)
    c.finish, c.group_round, c.sample_weight = "length", 1, 0.5
    c.scores, c.reward = [Score("format", value=0.0)], -0.25
    c.shaping, c.loss_exclusion = {"dot": -0.25}, "pivot"
    c.parent_id, c.prefix_len = "abc123", 5
    return g


def multi_turn_group() -> Group:
    """2 episodes: policy turn, environment observation (no loss), policy turn."""
    g = new_group(Example("q1", "guess", "5"), 2, [1, 2], SamplingParams(), version=0)
    for i, r in enumerate(g.rollouts):
        r.append(3, -0.5, 0)
        for t in (20, 21):
            r.append(t, 0.0, -1, "env")
        r.append(4 + i, -0.75, 1)
        r.finish, r.reward = "stop", float(i)
        r.scores = [Score("env", value=float(i), info={"turns": 2, "steps": [{"ok": True}]})]
    return g


def test_groups_round_trip_exactly(tmp_path):
    groups = [single_turn_group(), multi_turn_group()]
    store = RolloutStore(tmp_path)
    store.append(3, groups)
    back = store.batch(3)
    assert back == groups  # every field of every Rollout, Score, Span, Example, Group
    a = back[0].rollouts[0]
    assert [(s.start, s.end, s.source, s.version) for s in a.spans] == [
        (0, 4, "prompt", -1), (4, 5, "sampled", 4), (5, 7, "sampled", 5)]
    assert a.logprobs[5] == -1.0 / 3.0 and a.logprobs[6] == -1e-12  # float64, exact
    m = back[1].rollouts[1]
    assert m.loss_mask == [False, False, True, False, False, True]
    assert m.versions == [-1, -1, 0, -1, -1, 1]
    assert back[0].rollouts[1].scores[0].error == "TimeoutError: 3 s"
    assert back[0].rollouts[1].reward is None
    assert list(store.groups()) == [(3, groups[0]), (3, groups[1])]


def test_table_has_the_step_and_the_batch_position_of_every_row(tmp_path):
    store = RolloutStore(tmp_path)
    store.append(1, [multi_turn_group()])
    store.append(2, [single_turn_group(), multi_turn_group()])
    t = store.table()
    # step 1: one group of 2 rows; step 2: groups of 3 and 2 rows
    assert t.column("step").to_pylist() == [1, 1, 2, 2, 2, 2, 2]
    assert t.column("batch_group").to_pylist() == [0, 0, 0, 0, 0, 1, 1]
    assert t.column("batch_row").to_pylist() == [0, 1, 0, 1, 2, 3, 4]
    assert pc.struct_field(t.column("group.example"), "prompt_id").to_pylist()[2] == "p7"
    # analysis straight on the columns: sampled tokens per row, failed scores
    n_sampled = [sum(m) for m in t.column("loss_mask").to_pylist()]
    assert n_sampled == [2, 2, 3, 1, 2, 2, 2]
    errors = pc.struct_field(pc.list_flatten(t.column("scores")), "error")
    assert errors.null_count == len(errors) - 1
    assert store.table(steps=[2], columns=["reward"]).column("reward").to_pylist() == [
        1.0, None, -0.25, 0.0, 1.0]
    assert store.steps() == [1, 2]
    assert RolloutStore(tmp_path / "rollouts").steps() == [1, 2]  # the directory itself


def test_a_missing_step_and_an_empty_group_are_named(tmp_path):
    store = RolloutStore(tmp_path)
    for s in (1, 2, 3, 7):
        store.append(s, [multi_turn_group()])
    with pytest.raises(FileNotFoundError, match=r"no record of step 5 \(recorded: 1-3, 7\)"):
        store.batch(5)
    empty = Group("g0", Example("p", "x", "y"), target_size=0)
    with pytest.raises(ValueError, match="group g0 of step 9 has no rollouts"):
        store.append(9, [empty])
    assert store.steps() == [1, 2, 3, 7]


def test_a_reader_never_sees_a_torn_file_while_the_writer_appends(tmp_path):
    store = RolloutStore(tmp_path)
    g = single_turn_group()
    # a writer killed mid-write leaves only its hidden temporary file
    store.path.mkdir()
    (store.path / ".step_000000001.parquet.tmp").write_bytes(b"PAR1 half a file")
    assert store.steps() == []
    done, seen, errors = threading.Event(), [], []

    def write():
        for s in range(1, 41):
            store.append(s, [g, g])
        done.set()

    def read():
        reader = RolloutStore(tmp_path)  # a second reader, as another process would be
        while not done.is_set() or len(seen) < 40:
            try:
                steps = reader.steps()
                assert steps == list(range(1, len(steps) + 1))  # always a prefix
                for s in steps[len(seen):]:
                    assert reader.batch(s) == [g, g]
                    seen.append(s)
            except Exception as e:  # noqa: BLE001 -- reported below
                errors.append(e)
                return

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert seen == list(range(1, 41))


def test_truncate_drops_the_steps_after_the_checkpoint_and_stray_temporaries(tmp_path):
    store = RolloutStore(tmp_path)
    for s in range(1, 6):
        store.append(s, [multi_turn_group()])
    (store.path / ".step_000000006.parquet.tmp").write_bytes(b"torn")
    store.truncate(3)
    assert store.steps() == [1, 2, 3]
    assert sorted(p.name for p in store.path.iterdir()) == [
        f"step_00000000{s}.parquet" for s in (1, 2, 3)]
    g = single_turn_group()
    store.append(3, [g])  # a step recorded again replaces its file
    assert store.batch(3) == [g]


def test_run_dir_records_to_the_store_and_truncates_it_on_resume(tmp_path, small_run):
    cfg = small_run(tmp_path)
    rd = RunDir(cfg)
    rd.commit()
    for s in (1, 2, 3):
        rd.record(s, [multi_turn_group()])
    rd.log(3, {"x": 1.0})
    rd.close()
    assert not (tmp_path / "rollouts.jsonl").exists()
    assert RolloutStore(tmp_path).steps() == [1, 2, 3]
    rd = RunDir(cfg, resume=True)
    rd.truncate(1)
    rd.close()
    assert RolloutStore(tmp_path).steps() == [1]


def test_read_rollouts_reads_an_older_runs_jsonl_then_the_store(tmp_path):
    old = multi_turn_group()
    (tmp_path / "rollouts.jsonl").write_text(json.dumps({"step": 1, "group": old.to_dict()})
                                             + "\n")
    new = single_turn_group()
    RolloutStore(tmp_path).append(2, [new])
    assert read_rollouts(tmp_path) == [(1, old.to_dict()), (2, new.to_dict())]


def test_a_real_run_records_each_step_and_a_resume_records_the_redone_steps_again(
        tmp_path, small_run):
    """4 synchronous steps, checkpoints at 2 and 4; back to the checkpoint of step 2 (as if
    killed during step 4) and resumed: steps 3 and 4 are recorded again, once each, with the
    same tokens (a synchronous run resumes bitwise)."""
    import shutil

    from reroll.runtime import train

    cfg = small_run(tmp_path, "train.steps=4", "ckpt_every=2")
    train(cfg, progress=False)
    store = RolloutStore(tmp_path)
    first = {s: store.batch(s) for s in store.steps()}
    assert sorted(first) == [1, 2, 3, 4]
    assert all(len(b) == 4 and all(len(g.rollouts) == 4 for g in b) for b in first.values())
    ck = tmp_path / "checkpoints"
    shutil.rmtree(ck / "step_000004")
    (ck / "latest").write_text("step_000002")
    train(cfg, resume=True, progress=False)
    assert store.steps() == [1, 2, 3, 4]
    for s in (3, 4):
        again = store.batch(s)
        assert [[r.tokens for r in g.rollouts] for g in again] == [
            [r.tokens for r in g.rollouts] for g in first[s]]
        assert [[r.logprobs for r in g.rollouts] for g in again] == [
            [r.logprobs for r in g.rollouts] for g in first[s]]


def test_a_draft_and_a_redraft_source_round_trip_exactly(tmp_path):
    g = single_turn_group()
    a = g.rollouts[0]
    a.sampling.draft = Draft((9, 10), source="das")
    a.sampling.redraft = SuffixSource(((9, 10, 0), (9, 11)), max_match=4, draft_len=2)
    store = RolloutStore(tmp_path)
    store.append(1, [g])
    back = store.batch(1)[0].rollouts[0].sampling
    assert back.redraft == a.sampling.redraft and back.draft == a.sampling.draft
    assert store.batch(1) == [g]
