"""`reroll export`: a run's checkpoint becomes a clean Hugging Face folder that transformers
loads and that greedy-decodes exactly what reroll's engine decodes from the checkpoint."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reroll.cli import main
from reroll.engine import TorchEngine
from reroll.models import load
from reroll.rollout import Rollout, SamplingParams
from reroll.runtime import train

PROMPTS = ["3+4=", "9+9=", "1+0=", "5+2="]
N = 12


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, device):
    from reroll.config_checks import load_checked

    out = tmp_path_factory.mktemp("export") / "run"
    cfg = load_checked(None, ["model.max_position=32", "task.args.digits=1",
                              "task.args.n_train=40", "task.args.n_test=8",
                              "rollout.group_size=4", "rollout.batch_groups=2",
                              "rollout.max_new_tokens=4", "reward.workers=0", "train.lr=1e-2",
                              "runtime.threads=1", "train.steps=2", f"out_dir={out}",
                              f"model.device={device}",
                              'reward.verifiers=[{name="format", args={pattern="[0-9]", '
                              'fullmatch=false}}]'])
    train(cfg, progress=False)
    return out


def engine_greedy(model_dir, prompts):
    model, tok = load(model_dir)
    rs = [Rollout(prompt_id=p, group_id=p, tokens=tok.encode(p), prompt_len=len(tok.encode(p)),
                  sampling=SamplingParams(temperature=0.0, max_new_tokens=N,
                                          stop_token_ids=[tok.eos_token_id])) for p in prompts]
    TorchEngine(model.eval(), tok, max_batch=8).generate(rs)
    return [r.response_tokens for r in rs]


def test_export_loads_with_transformers_and_decodes_as_the_engine(run_dir, tmp_path, capsys):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["chat_template.jinja", "config.json", "generation_config.json",
                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    gen = json.loads((out / "generation_config.json").read_text())
    # the tiny tokenizer: <pad> = 0, <eos> = 1, <bos> = 2 (reroll.models.tiny)
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["bos_token_id"]) == (1, 0, 2)
    assert tok.eos_token_id == 1 and model.generation_config.eos_token_id == 1
    ckpt_model = (run_dir / "checkpoints" / "step_000002" / "model")
    want = engine_greedy(ckpt_model, PROMPTS)
    for p, ref in zip(PROMPTS, want, strict=True):
        ids = torch.tensor([tok.encode(p)])
        got = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=N)[0, ids.shape[1]:].tolist()
        assert got == ref, p  # alone, generate stops at the folder's eos as the engine does
    assert any(len(r) > 1 for r in want)  # not all an immediate EOS


def test_export_refuses_a_used_directory_and_a_damaged_checkpoint(run_dir, tmp_path, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "x").write_text("keep")
    assert main(["export", str(run_dir), str(used)]) == 2
    assert "already exists and is not an empty directory" in capsys.readouterr().err
    assert (used / "x").read_text() == "keep"
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(run_dir / "checkpoints" / "step_000002", ckpt)
    with open(ckpt / "model" / "model.safetensors", "r+b") as f:
        f.truncate(100)
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 2
    assert "damaged" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_export_casts_to_the_asked_dtype(run_dir, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "bf16"
    assert main(["export", str(run_dir), str(out), "--dtype", "bfloat16"]) == 0
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    with safe_open(out / "model.safetensors", "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
