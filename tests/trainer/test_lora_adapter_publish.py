"""LoRA publishes in adapter form (`reroll.lora.adapter_state_dict`,
`Trainer.weights(adapters=True)`, `reroll.engine.lora_apply`): after the first, a publish
holds exactly each targeted module's A, B and scale; an engine that merges them over the
bases it kept holds, bit for bit, what a full merged copy gives it; a bad adapter is refused
before anything changes; a full publish without adapters frees the kept bases. (A LoRA run
publishing adapters samples as one publishing every merged tensor: test_lora_publish.py.)"""

import pytest
import torch

pytest.importorskip("peft", reason="[lora] trains adapters through peft (reroll[lora])")

from test_lora_publish import QV, _train_adapter, _trainer  # noqa: E402  (same tiny trainer)

from reroll import build  # noqa: E402

MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
           "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"]
ADAPTER_KEYS = {m + s for m in MODULES for s in (".lora_A", ".lora_B", ".lora_scale")}
# the tiny qwen2: hidden 128, 4 query heads and 2 key/value heads of 32, so q_proj is
# 128 x 128 and v_proj 64 x 128; rank 4: A is 4 x 128, B is 128 x 4 (q) or 64 x 4 (v)
SHAPES = {"q_proj": ((4, 128), (128, 4)), "v_proj": ((4, 128), (64, 4))}
BASE_BYTES = 2 * (128 * 128 + 64 * 128) * 4  # two layers' float32 q and v bases


def test_the_adapter_publish_holds_a_b_and_scale_alone(small_run, tmp_path):
    _, trainer = _trainer(small_run, tmp_path, *QV)
    _train_adapter(trainer, 1)
    sent = trainer.weights(trained_only=True, adapters=True)
    assert set(sent) == ADAPTER_KEYS
    for m in MODULES:
        layer = trainer.model.get_submodule(m)
        a_shape, b_shape = SHAPES[m.rsplit(".", 1)[1]]
        assert sent[m + ".lora_A"].shape == a_shape and sent[m + ".lora_B"].shape == b_shape
        assert torch.equal(sent[m + ".lora_A"], layer.lora_A["default"].weight)
        assert torch.equal(sent[m + ".lora_B"], layer.lora_B["default"].weight)
        assert sent[m + ".lora_A"].data_ptr() != layer.lora_A["default"].weight.data_ptr()
        assert sent[m + ".lora_scale"].dtype == torch.float64
        assert float(sent[m + ".lora_scale"]) == 8 / 4  # alpha / rank
    # the full publish in adapter form: every plain name, the targeted ones as their base
    full, merged = trainer.weights(adapters=True), trainer.weights()
    assert set(full) == set(merged) | ADAPTER_KEYS
    for m in MODULES:
        base = trainer.model.get_submodule(m).base_layer.weight
        assert torch.equal(full[m + ".weight"], base)
        assert not torch.equal(merged[m + ".weight"], base)


def _engine_equals_merged_copy(engine, trainer, cfg, version):
    want = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)
    want.update_weights(trainer.weights(), version)  # a full merged copy
    got, ref = engine.model.state_dict(), want.model.state_dict()
    assert got.keys() == ref.keys()
    for k in got:
        assert torch.equal(got[k], ref[k]), k


def test_adapter_publishes_leave_the_engine_equal_to_a_full_merged_copy(small_run, tmp_path):
    """The engine merges with `reroll.lora.merge_weight` on the operands the trainer's merge
    uses (same dtype, same scale): bitwise equal on the same CPU."""
    cfg, trainer = _trainer(small_run, tmp_path, *QV)
    engine = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)
    _train_adapter(trainer, 1)  # as after a resume: the first publish has a trained adapter
    engine.update_weights(trainer.weights(adapters=True), 1)
    assert engine.stats()["lora_base_bytes"] == BASE_BYTES
    _engine_equals_merged_copy(engine, trainer, cfg, 1)
    for step in range(2, 5):
        _train_adapter(trainer, step)
        engine.update_weights(trainer.weights(trained_only=True, adapters=True), step)
    assert engine.version == 4
    _engine_equals_merged_copy(engine, trainer, cfg, 4)
    engine.update_weights(trainer.weights(), 5)  # every tensor plain: LoRA off
    assert engine.stats()["lora_base_bytes"] == 0


def test_a_bad_adapter_is_refused_and_nothing_changes(small_run, tmp_path):
    cfg, trainer = _trainer(small_run, tmp_path, *QV)
    engine = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)
    _train_adapter(trainer, 1)
    sent = trainer.weights(trained_only=True, adapters=True)
    with pytest.raises(ValueError, match=r"q_proj: no base weight \(a full publish"):
        engine.update_weights(sent, 1)  # no full publish in adapter form came first
    engine.update_weights(trainer.weights(adapters=True), 1)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    _train_adapter(trainer, 2)
    sent = trainer.weights(trained_only=True, adapters=True)
    q, v = MODULES[0], MODULES[1]
    for bad, match in [
            ({"model.layers.2.self_attn.q_proj.lora_A": sent[q + ".lora_A"]},
             r"layers\.2\.self_attn\.q_proj: no lora_B, lora_scale"),
            ({k.replace("v_proj", "k_proj"): t for k, t in sent.items() if v in k},
             r"layers\.0\.self_attn\.k_proj: no base weight"),
            ({"model.layers.2.self_attn.q_proj" + s: sent[q + s]
              for s in (".lora_A", ".lora_B", ".lora_scale")},
             r"layers\.2\.self_attn\.q_proj: the engine's model has no such module"),
            ({v + ".lora_B": sent[q + ".lora_B"]},  # 128 x 4 where v_proj wants 64 x 4
             r"layers\.0\.self_attn\.v_proj: wrong shapes \(A \(4, 128\), B \(128, 4\) for a "
             r"weight of \(64, 128\)\)"),
            ({q + ".lora_scale": None}, r"q_proj: no lora_scale")]:
        bad = {k: t for k, t in dict(sent, **bad).items() if t is not None}
        with pytest.raises(ValueError, match=match):
            engine.update_weights(bad, 2)
        after = engine.model.state_dict()
        assert engine.version == 1
        assert all(torch.equal(after[k], before[k]) for k in before)  # nothing loaded
    assert engine.stats()["lora_base_bytes"] == BASE_BYTES
