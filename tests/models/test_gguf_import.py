"""`reroll import`: a small llama GGUF file written here with the ``gguf`` package (float32
tensors and one Q8_0 one, a byte-level BPE tokenizer, a chat template) becomes a clean
Hugging Face folder whose logits equal transformers' own load of the same file; a folder
still marked as quantised is refused before a run starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf", reason="reroll import needs the gguf package (reroll[gguf])")
torch = pytest.importorskip("torch")

from reroll.config import ConfigError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _bytes_to_unicode() -> list[str]:
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def _permute(w, heads: int):
    """llama.cpp's row order of a query/key projection (transformers undoes it on load)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + _bytes_to_unicode() + ["ab", "Ġa"]
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False)
    torch.manual_seed(0)
    sd = {k: v.float().numpy() for k, v in LlamaForCausalLM(cfg).state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_rope_dimension_count(16)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (len(tokens) - len(specials)))
    w.add_token_merges(["a b", "Ġ a"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(TEMPLATE)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    for i in range(2):
        for hf, g in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            t = _permute(t, 4) if g == "attn_q" else _permute(t, 2) if g == "attn_k" else t
            if g == "ffn_up" and i == 0:  # one quantised tensor, as real files have many
                q = gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0)
                w.add_tensor(f"blk.{i}.{g}.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                w.add_tensor(f"blk.{i}.{g}.weight", t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_import_round_trip(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reroll.models import load
    from reroll.models.gguf import import_gguf

    src = tmp_path / "tiny.gguf"
    write_gguf(src)
    out, precision = import_gguf(src, tmp_path / "hf")
    assert precision == {"F32": 20, "Q8_0": 1}
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert list(out.glob("*.safetensors")) and (out / "generation_config.json").is_file()
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=src.name, dtype=torch.float32)
    ref_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=src.name)
    model, tok = load(out, "float32")  # reroll's own loading path, which checks the folder
    text = tok.apply_chat_template([{"role": "user", "content": "ab a b"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|im_start|>user\nab a b<|im_end|>")
    ids = tok(text, return_tensors="pt").input_ids
    assert ids.tolist() == ref_tok(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (1, 2)


def test_cli_import_says_the_source_precision(tmp_path):
    src = tmp_path / "tiny.gguf"
    write_gguf(src)
    r = subprocess.run([sys.executable, "-m", "reroll.cli", "import", str(src),
                        str(tmp_path / "hf")], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "dequantised to float32 from" in r.stdout and "1 Q8_0" in r.stdout
    again = subprocess.run([sys.executable, "-m", "reroll.cli", "import", str(src),
                            str(tmp_path / "hf")], capture_output=True, text=True, timeout=300,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_a_run_from_a_quantised_folder_is_refused_at_start(tmp_path):
    from reroll.config_checks import load_checked

    folder = tmp_path / "from_gguf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "quantization_config": {"quant_method": "gguf"}}))
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="quantization_config.*reroll import"):
        load_checked(None, [f"model.path={folder}"])
