"""The engine's prefill cost probe: the fit by hand, and the probe's batches counted by the
engine's own counters (a clock made of them stands in for wall time, so the fit must give
back the clock's own coefficients exactly)."""

import pytest

from reroll.sim.engine_probe import DESIGN, fit_prefill, probe_prefill


def test_the_fit_gives_back_the_three_terms_by_hand():
    # 1 ms a forward, 20 us a token, 15 us a request: (16, 8) -> 1e-3 + 128 * 2e-5 +
    # 16 * 1.5e-5 = 3.8 ms, and so on; consistent data, so least squares is exact
    trials = [(k, n, 1e-3 + k * n * 2e-5 + k * 1.5e-5) for k, n in DESIGN]
    assert trials[0][2] == pytest.approx(3.8e-3, rel=1e-12)
    f = fit_prefill(trials)
    assert f["prefill_forward_s"] == pytest.approx(1e-3, rel=1e-6)
    assert f["prefill_token_s"] == pytest.approx(2e-5, rel=1e-6)
    assert f["prefill_row_s"] == pytest.approx(1.5e-5, rel=1e-6)


def test_the_fit_refuses_a_design_that_does_not_vary_counts_and_lengths_apart():
    # one length: a token's cost and a request's are proportional columns
    with pytest.raises(ValueError, match="do not vary the requests and their length apart"):
        fit_prefill([(16, 8, 1.0), (32, 8, 2.0), (64, 8, 3.0)])


def test_the_probe_prefills_each_batch_once_with_its_own_tokens(tiny):
    from reroll.engine.torch_engine import TorchEngine

    model, tok = tiny
    eng = TorchEngine(model, tok, max_batch=128)
    c = eng.counts
    # a clock of the engine's counters: 1 ms a packed prefill, 20 us a prefilled token,
    # 15 us a finished request; the fit gives them back only if every design batch is one
    # prefill of requests x length distinct tokens whose requests all finish in it
    clock = lambda: (1e-3 * c["prefill_forwards"] + 2e-5 * c["prefill_tokens"]  # noqa: E731
                     + 1.5e-5 * c["requests_finished"])
    design = ((4, 6), (16, 6), (8, 12), (12, 20))
    f = probe_prefill(eng, design=design, repeats=2, warmup=1, clock=clock)
    assert f["prefill_forward_s"] == pytest.approx(1e-3, rel=1e-6)
    assert f["prefill_token_s"] == pytest.approx(2e-5, rel=1e-6)
    assert f["prefill_row_s"] == pytest.approx(1.5e-5, rel=1e-6)
    assert [t[:2] for t in f["trials"]] == list(design)
    assert eng.pending() == 0
    assert c["prefill_forwards"] == 1 + 2 * len(design)  # warm-up, then 2 repeats each


def test_the_probe_refuses_a_busy_engine(tiny):
    from reroll.engine.torch_engine import TorchEngine
    from reroll.rollout import Rollout

    model, tok = tiny
    eng = TorchEngine(model, tok, max_batch=8)
    eng.add([Rollout(prompt_id="p", group_id="g", tokens=[3, 4], prompt_len=2)])
    with pytest.raises(ValueError, match="must be empty"):
        probe_prefill(eng)


def test_a_runs_engine_is_probed_on_its_own_model_with_its_threads(tmp_path, tiny_dir,
                                                                   small_run):
    # a run directory as a run leaves it: its config.toml and its starting model in init/;
    # the probe builds that engine and gives back the process's thread count after. The
    # timings are wall time, so only their form is checked: one median a design point,
    # and non-negative terms
    import shutil

    import torch

    from reroll.config.load import dump_toml
    from reroll.sim.engine_probe import probe_run

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_toml(small_run(run)))
    shutil.copytree(tiny_dir, run / "init")
    before = torch.get_num_threads()
    f = probe_run(run, threads=1)
    assert torch.get_num_threads() == before
    assert [t[:2] for t in f["trials"]] == list(DESIGN)
    assert all(t[2] > 0 for t in f["trials"])
    assert min(f["prefill_forward_s"], f["prefill_token_s"], f["prefill_row_s"]) >= 0
