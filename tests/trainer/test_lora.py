"""LoRA (`reroll.lora`, ``[lora]``): a tiny LoRA run resumes bitwise; the engine's weights
after a publish equal peft's own merge of the trainer's adapter, which stays untouched;
checkpoints hold the adapter, `reroll export` merges it; `reroll sft` writes the merged
model; the optimiser holds state for the adapter alone."""

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft", reason="[lora] trains adapters through peft (reroll[lora])")

from reroll import build, lora  # noqa: E402
from reroll.runlog import read_metrics, read_rollouts  # noqa: E402
from reroll.runtime import train  # noqa: E402

LORA = ["lora.rank=4", "lora.alpha=8"]


def _adapter(run, step):
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "model" /
                         lora.ADAPTER_WEIGHTS))


def test_a_lora_run_resumes_bitwise(small_run, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, *LORA, "train.steps=4", "ckpt_every=2"), progress=False)
    train(small_run(b, *LORA, "train.steps=2", "ckpt_every=2"), progress=False)
    train(small_run(b, *LORA, "train.steps=4", "ckpt_every=2"), resume=True, progress=False)
    model_dir = a / "checkpoints" / "step_000004" / "model"
    assert (model_dir / "adapter_config.json").is_file()
    assert not (model_dir / "model.safetensors").exists()  # the adapter, not a full copy
    assert lora.base_dir(model_dir) == (a / "init").resolve()

    def records(d):
        return [(s, [r["tokens"] for r in g["rollouts"]]) for s, g in read_rollouts(d)]

    assert records(a) == records(b)
    wa, wb = _adapter(a, 4), _adapter(b, 4)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], _adapter(a, 2)[k]) for k in wa)  # it did train
    assert all(m["grad_norm"] > 0 for m in read_metrics(a))
    losses = [[m["loss/policy"], m["adv/abs_mean"]] for m in read_metrics(a)]
    assert losses == [[m["loss/policy"], m["adv/abs_mean"]] for m in read_metrics(b)]


def test_the_engine_receives_the_merged_weights(small_run, tmp_path):
    cfg = small_run(tmp_path / "r", *LORA)
    init = build.model_dir(cfg, tmp_path / "r")
    torch.manual_seed(0)
    trainer = build.build_trainer(cfg, init)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert {id(p) for g in trainer.opt.param_groups for p in g["params"]} == {
        id(p) for p in trainer.model.parameters() if p.requires_grad}
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for _, layer in lora.lora_layers(trainer.model):
            layer.lora_B["default"].weight.normal_(0, 0.1)
    adapter = {k: v.clone() for k, v in trainer.model.state_dict().items() if ".lora_" in k}
    engine = build.build_engine(trainer.policy(), trainer.tokenizer, cfg)
    assert not lora.is_lora(engine.model)
    lora.save_adapter(trainer.model, tmp_path / "adapter")
    merged = lora.load_merged(tmp_path / "adapter", torch.float32).state_dict()  # as eval reads
    got = engine.model.state_dict()
    assert got.keys() == merged.keys() and all(torch.equal(got[k], merged[k]) for k in got)
    from peft import PeftModel  # peft's own merge, within float rounding
    from transformers import AutoModelForCausalLM

    theirs = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(init),
                                       str(tmp_path / "adapter")).merge_and_unload().state_dict()
    assert theirs.keys() == got.keys()
    assert all(torch.allclose(got[k], theirs[k], rtol=0, atol=1e-6) for k in got)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], AutoModelForCausalLM.from_pretrained(init).state_dict()[q])
    engine.update_weights({k: torch.zeros_like(v) for k, v in got.items()}, 1)
    engine.update_weights(trainer.weights(), 2)  # what a publish sends
    got = engine.model.state_dict()
    assert all(torch.equal(got[k], merged[k]) for k in got)
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in adapter.items())  # adapter untouched
    assert lora.is_lora(trainer.model)


def test_export_merges_a_lora_checkpoint(small_run, tmp_path):
    from reroll.export import export

    run = tmp_path / "run"
    train(small_run(run, *LORA, "train.steps=2", "ckpt_every=2"), progress=False)
    out = export(run, tmp_path / "hf")
    assert not (out / "adapter_config.json").exists()
    got = load_file(str(out / "model.safetensors"))
    base = load_file(str(run / "init" / "model.safetensors"))
    ad = _adapter(run, 2)
    scale = 8 / 4  # alpha / rank
    q = "model.layers.0.self_attn.q_proj"
    a = ad[f"base_model.model.{q}.lora_A.weight"]
    b = ad[f"base_model.model.{q}.lora_B.weight"]
    want = base[f"{q}.weight"] + (b @ a) * scale
    assert torch.allclose(got[f"{q}.weight"], want, rtol=0, atol=1e-6)
    assert not torch.equal(got[f"{q}.weight"], base[f"{q}.weight"])


def test_lora_sft_resumes_bitwise_and_writes_the_merged_model(tmp_path, monkeypatch):
    from reroll import stopping
    from reroll.cli import main

    sft = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
           "task.args.n_test=8", "sft.steps=8", "sft.batch_size=8", "sft.lr=3e-3",
           "ckpt_every=2", "reward.workers=0", *LORA]

    class StopAfter(stopping.StopFlag):  # a SIGINT during the 5th step
        asked = 0

        @property
        def requested(self):
            self.asked += 1
            if self.asked >= 5:
                self.signum = 2
            return self.signum is not None

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["sft", "-", *sft, f"out_dir={whole}"]) == 0
    with monkeypatch.context() as m:
        m.setattr(stopping, "StopFlag", StopAfter)
        assert main(["sft", "-", *sft, f"out_dir={cut}"]) == 130
    assert (cut / "checkpoints" / "latest").exists()
    assert main(["sft", "-", *sft, f"out_dir={cut}", "--resume"]) == 0
    assert not (whole / "model" / "adapter_config.json").exists()  # merged: a plain model
    got = load_file(str(whole / "model" / "model.safetensors"))
    assert got.keys() == load_file(str(cut / "model" / "model.safetensors")).keys()
    assert ((cut / "model" / "model.safetensors").read_bytes()
            == (whole / "model" / "model.safetensors").read_bytes())
    base = load_file(str(whole / "init" / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(got[q], base[q])
    assert torch.equal(got["model.norm.weight"], base["model.norm.weight"])  # frozen
