"""benchmarks/sim_validate.py's schedule counts, by hand: the quiet steps of a run (neither
the step nor the one before resumed a request) from a measured run's cumulative counter and
from a simulated run's per-step counts, which must read them the same way."""

import json

import pytest


@pytest.fixture(scope="module")
def sv(benchmarks_on_path):
    import sim_validate as module

    return module


def test_quiet_steps_need_two_steps_in_a_row_without_resumes(sv):
    # a lone 0 after a burst is the step that drained it, not a quiet one
    assert sv.quiet_steps([85, 153, 256, 0, 123, 248, 0]) == 0
    # 0, 0, 0 after a burst: two steps whose step before resumed nothing too
    assert sv.quiet_steps([177, 0, 0, 0, 88]) == 2
    assert sv.quiet_steps([0]) == 0 and sv.quiet_steps([]) == 0


def test_measured_counts_read_the_cumulative_counter_after_the_warm_up(sv, tmp_path):
    # requests resumed, cumulative, at the end of steps 1-8; with skip 3 the steps
    # counted are 4-8: 85, 0, 0, 0, 40 resumed -> 125 over 5 steps; quiet: steps 6 and 7
    # (steps 5-6 and 6-7 both 0); step 4 resumed 85 so step 5 is not quiet
    cum = [0, 0, 10, 10, 95, 95, 95, 95, 135]
    rows = [{"step": i, "time": float(i), "pipeline/samples_in_batch": 16,
             "engine/requests_resumed": float(c), "engine/resumed_tokens": 10.0 * c,
             "time/generate_s": 0.1} for i, c in enumerate(cum[1:], 1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = sv.counts(tmp_path, 3)
    assert c["resumed_per_step"] == pytest.approx(125 / 5)
    assert c["resumed_tokens_per_step"] == pytest.approx(1250 / 5)
    assert c["quiet_steps"] == 2
