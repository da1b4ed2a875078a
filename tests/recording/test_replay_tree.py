"""`reroll replay` of a tree run with segment credit: the per-token advantages come from the
recorded trees (nothing else is stored), so a replay with the run's settings reproduces its
updates and weights bitwise."""

from test_replay_command import assert_bitwise, replay

from reroll.recording.store import RolloutStore
from reroll.runtime import train


def test_a_segment_credit_run_replays_bitwise(tmp_path, small_run):
    run = tmp_path / "run"
    train(small_run(run, "rollout.workflow=tree", "rollout.tree_branch_at=[1]",
                    "rollout.tree_credit=segments", "train.steps=3"), progress=False)
    assert RolloutStore(run).steps() == [1, 2, 3]
    assert replay(run, f"out_dir={tmp_path / 'again'}") == 0
    assert_bitwise(run, tmp_path / "again", 3)
