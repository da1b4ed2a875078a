"""LoRA's partial publish of merged weights (`reroll.lora.engine_state_dict(adapted_only=True)`,
`Trainer.weights(trained_only=True)`): the dict holds exactly the targeted modules' merged
weights, an engine updated by partial publishes holds what full publishes would have given
it, bit for bit, a name the engine lacks is refused before anything loads; and a LoRA run,
which publishes adapters after the first (test_lora_adapter_publish.py), samples the same
tokens as one publishing every merged tensor each time."""

import pytest
import torch

pytest.importorskip("peft", reason="[lora] trains adapters through peft (reroll[lora])")

from reroll import build, lora  # noqa: E402
from reroll.runlog import read_metrics, read_rollouts  # noqa: E402
from reroll.runtime import compose, train  # noqa: E402

QV = ["lora.rank=4", "lora.alpha=8", 'lora.target_modules=["q_proj","v_proj"]',
      "model.num_layers=2"]
# the tiny qwen2 has 2 layers; q_proj and v_proj carry biases, which LoRA leaves frozen
TARGETED = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight",
            "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.v_proj.weight"}


def _trainer(small_run, tmp_path, *extra):
    cfg = small_run(tmp_path / "r", *extra)
    torch.manual_seed(0)
    return cfg, build.build_trainer(cfg, build.model_dir(cfg, tmp_path / "r"))


def _train_adapter(trainer, seed):
    """Stands for an optimiser step: new values for every adapter tensor."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in lora.lora_layers(trainer.model):
            for m in (layer.lora_A["default"], layer.lora_B["default"]):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.1)


def test_the_partial_dict_holds_the_targeted_modules_merged(small_run, tmp_path):
    _, trainer = _trainer(small_run, tmp_path, *QV)
    _train_adapter(trainer, 1)
    part, full = trainer.weights(trained_only=True), trainer.weights()
    assert set(part) == TARGETED
    assert len(full) > len(part) and set(part) < set(full)
    layer = trainer.model.get_submodule("model.layers.1.self_attn.v_proj")
    w, a, b = (layer.base_layer.weight, layer.lora_A["default"].weight,
               layer.lora_B["default"].weight)
    assert layer.scaling["default"] == 8 / 4  # alpha / rank
    # the same addmm as the full dict's: equal bit for bit; against the plain formula,
    # within float32 rounding of a rank-4 sum (|B A| < 1 here, so well under 1e-6)
    k = "model.layers.1.self_attn.v_proj.weight"
    assert torch.equal(part[k], full[k])
    assert torch.allclose(part[k], w + 2.0 * (b @ a), rtol=0, atol=1e-6)
    assert not torch.equal(part[k], w)
    for k in TARGETED:
        assert torch.equal(part[k], full[k]), k
        assert part[k].data_ptr() != full[k].data_ptr()  # copies of their own


def test_a_full_fine_tuning_trainer_sends_every_tensor_anyway(small_run, tmp_path):
    _, trainer = _trainer(small_run, tmp_path)
    part, full = trainer.weights(trained_only=True), trainer.weights()
    assert part.keys() == full.keys() and all(torch.equal(part[k], full[k]) for k in full)


def test_partial_publishes_leave_the_engine_equal_to_a_full_copy(small_run, tmp_path):
    cfg, trainer = _trainer(small_run, tmp_path, *QV)
    engine = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)
    for step in range(1, 4):  # three "steps", each published as a publish after the first
        _train_adapter(trainer, step)
        engine.update_weights(trainer.weights(trained_only=True), step)
    assert engine.version == 3
    want = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)  # a full merged copy
    want.update_weights(trainer.weights(), 3)
    got, ref = engine.model.state_dict(), want.model.state_dict()
    assert got.keys() == ref.keys()
    for k in got:
        assert torch.equal(got[k], ref[k]), k


def test_an_unknown_or_misshapen_tensor_is_refused_and_nothing_loads(small_run, tmp_path):
    cfg, trainer = _trainer(small_run, tmp_path, *QV)
    engine = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    _train_adapter(trainer, 1)
    sent = trainer.weights(trained_only=True)
    bad = dict(sent, **{"model.layers.2.self_attn.q_proj.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"lacks \['model\.layers\.2\.self_attn\.q_proj"):
        engine.update_weights(bad, 1)
    k = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=r"wrong shapes \['model\.layers\.0\.self_attn\.q_proj"):
        engine.update_weights(dict(sent, **{k: sent[k][:1]}), 1)
    after = engine.model.state_dict()
    assert engine.version == 0
    assert all(torch.equal(after[k], before[k]) for k in before)  # nothing loaded


def test_a_lora_run_publishing_adapters_samples_as_one_publishing_everything(
        small_run, tmp_path, monkeypatch):
    """A run's publishes after the first hold the adapters alone (A, B and scale of each
    targeted module, `reroll.engine.lora_apply` merges them); the engine weights differ in
    no bit from full merged publishes', so every sampled token and log-prob agrees."""
    runs = {"adapters": tmp_path / "adapters", "full": tmp_path / "full"}
    sent: dict[str, list[int]] = {k: [] for k in runs}
    weights, init = compose.Transport.weights, compose.Transport.__init__
    for kind, out in runs.items():
        def spy(self, kind=kind):
            w = weights(self)
            sent[kind].append(len(w))
            return w

        with monkeypatch.context() as m:
            m.setattr(compose.Transport, "weights", spy)
            if kind == "full":  # the engine gets every merged tensor at every publish
                m.setattr(compose.Transport, "__init__",
                          lambda self, t, s, partial=True: init(self, t, s, partial=False))
            train(small_run(out, *QV, "train.steps=3", "runtime.max_staleness=1"),
                  progress=False)
    n_full, n_adapter = sent["full"][0], 3 * len(TARGETED)  # lora_A, lora_B, lora_scale
    assert sent["full"] == [n_full] * 3
    assert sent["adapters"] == [n_full + n_adapter, n_adapter, n_adapter]

    def records(d):
        return [(s, [(r["tokens"], r["logprobs"]) for r in g["rollouts"]])
                for s, g in read_rollouts(d)]

    assert records(runs["adapters"]) == records(runs["full"])
    assert ([m["loss/policy"] for m in read_metrics(runs["adapters"])]
            == [m["loss/policy"] for m in read_metrics(runs["full"])])
