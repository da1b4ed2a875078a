"""Tiny models and a character tokenizer for CPU work, saved and loaded the normal way.

Owns: building a random-init Llama or Qwen2 from a transformers config and a character-level
tokenizer made with the `tokenizers` library, then `save_pretrained`, so that every later
load goes through `AutoModelForCausalLM` / `AutoTokenizer` exactly as a real local checkpoint
(a Qwen2.5-0.5B directory, say) would; a directory without config.json or tokenizer files,
or whose weights cannot be read, is a one-line error naming it. Knows nothing of RL.
"""

from __future__ import annotations

import string
from pathlib import Path

from reroll.config import ConfigError, ModelConfig

PAD, EOS, BOS = "<pad>", "<eos>", "<bos>"
CHARSET = string.digits + string.ascii_letters + " +-*/=()<>[]{}.,:;!?'\"_#%&|^~@$\\\n"
ROLES = ("system", "user", "assistant", "tool")
# One line per message, `<role>content`, then `<assistant>` as the generation prompt; every
# character is in CHARSET, so a rendered conversation tokenizes without an unknown token.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    f"{{%- if m['role'] not in {list(ROLES)} -%}}"
    f"{{{{ raise_exception('tiny chat template: role must be one of {', '.join(ROLES)}, "
    "got ' ~ m['role']) }}"
    "{%- endif -%}"
    "<{{ m['role'] }}>{{ m['content'] }}\n"
    "{% endfor -%}"
    "{%- if add_generation_prompt -%}<assistant>{%- endif -%}"
)


def _byte_symbols(chars: str) -> list[str]:
    """The byte-level (GPT-2) symbol of each character, as the `tokenizers` ByteLevel
    pre-tokenizer writes it: printable ASCII is itself, space is "Ġ", newline "Ċ"."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    out = []
    for ch in chars:
        (sym, _), = byte_level.pre_tokenize_str(ch)
        if len(sym) != 1:
            raise ValueError(f"CHARSET must hold single-byte characters, got {ch!r}")
        out.append(sym)
    return out


def build_tokenizer():
    """A character-level fast tokenizer over CHARSET plus pad/eos/bos/unk, with a small chat
    template (`CHAT_TEMPLATE`).

    Vocabulary keys are byte-level symbols (space is "Ġ", newline "Ċ"), as in Qwen2 and
    Llama-3 tokenizers, with a byte-level pre-tokenizer and decoder. This is what makes a
    saved directory load back losslessly: for `model_type = "qwen2"` transformers always
    rebuilds the tokenizer as `Qwen2Tokenizer` (byte-level, no unknown token), which would
    silently drop a raw " " or "\\n" key. Ids are 0-3 for the specials, then CHARSET in order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, BOS: 2, "<unk>": 3}
    for sym in _byte_symbols(CHARSET):
        vocab.setdefault(sym, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        pre_tokenizers.Split(pattern="", behavior="isolated"),
    ])
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model_config(cfg: ModelConfig, vocab_size: int, pad_id: int, eos_id: int, bos_id: int):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        tie_word_embeddings=True,
    )
    builders = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if cfg.arch not in builders:
        raise ValueError(f"model.arch must be one of {sorted(builders)}, got {cfg.arch!r}")
    return builders[cfg.arch](**common)


def build_tiny(cfg: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """Random-init model + tokenizer saved to ``out_dir``; returns the directory."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out_dir)
    tok = build_tokenizer()
    mcfg = build_model_config(cfg, len(tok), tok.pad_token_id, tok.eos_token_id,
                              tok.bos_token_id)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(mcfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_model_dir(p: Path) -> None:
    """A directory a model loads from holds its config.json and its tokenizer's files; a
    `ConfigError` (FileNotFoundError for a missing directory) naming what is missing."""
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a model directory (no config.json)")
    check_savable(p)
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise ConfigError(f"{p} holds a model but no tokenizer (none of "
                          f"{', '.join(TOKENIZER_FILES)}): save the tokenizer of the model it "
                          f"was made from into it (tokenizer.save_pretrained)")


def check_savable(p: Path) -> None:
    """A model a run starts from must be one it can save, resume and export: a folder whose
    config.json still carries a ``quantization_config`` (one made from a GGUF file, or a
    quantised checkpoint) loads, but transformers refuses to save it, which would lose the
    run's work at its first checkpoint. Refused here, before any work, with the fix."""
    import json

    try:
        quant = json.loads((p / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError):
        return  # unreadable: the load itself says so
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        raise ConfigError(
            f"{p}/config.json carries a quantization_config (quant_method {method!r}): "
            f"transformers cannot save such a model, so the run could not checkpoint, resume "
            f"or export it. Train from dequantised weights: `reroll import FILE.gguf DIR` "
            f"for a GGUF file, or save the model in float32/bfloat16 without the marker")


def load(path: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from a local directory, through the standard Auto classes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    p = Path(path)
    check_model_dir(p)
    tok = AutoTokenizer.from_pretrained(p)
    try:
        if (p / "adapter_config.json").is_file():  # a LoRA checkpoint: base + adapter, merged
            from reroll.lora import load_merged

            return load_merged(p, getattr(torch, dtype)), tok
        model = AutoModelForCausalLM.from_pretrained(p, dtype=getattr(torch, dtype))
    except (OSError, ValueError, RuntimeError) as e:  # a truncated or unreadable weights file
        if not p.is_dir():
            raise FileNotFoundError(f"{p} was removed while its model was read") from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot read the model weights in {p}: {first}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok
