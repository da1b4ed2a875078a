"""`reroll import GGUF_FILE OUT_DIR`: a clean Hugging Face model folder from a GGUF file
(llama.cpp's format, often quantised): the weights dequantised by transformers and saved as
safetensors in float32, the tokenizer with its chat template, and a generation config of
its special tokens; no ``quantization_config``, so the folder trains, checkpoints, resumes
and exports like any other (transformers refuses to save a model still marked as loaded
from GGUF). Says what precision the source's tensors had.

The only module that imports the ``gguf`` package (``pip install 'reroll[gguf]'``). Knows
nothing of runs or checkpoints.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from reroll.errors import ConfigError
from reroll.models.folder import save_folder


def source_precision(path: Path) -> dict[str, int]:
    """How many of the file's tensors are stored in each GGUF type (Q4_1, F32, ...)."""
    from gguf import GGUFReader

    return dict(Counter(t.tensor_type.name for t in GGUFReader(str(path)).tensors).most_common())


def import_gguf(src: str | Path, out_dir: str | Path) -> tuple[Path, dict[str, int]]:
    """Write the model of the GGUF file ``src`` to the new folder ``out_dir``; returns the
    folder and the source's precision (`source_precision`)."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        raise ConfigError("reroll import reads GGUF files with the gguf package: "
                          "pip install 'reroll[gguf]'") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from reroll.build import quiet_transformers

    path, out = Path(src).expanduser(), Path(str(out_dir)).expanduser()
    if not path.is_file():
        raise ConfigError(f"GGUF file {str(path)!r} not found")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{str(out)!r} already exists and is not an empty directory; "
                          f"choose a new OUT_DIR")
    precision = source_precision(path)
    quiet_transformers()
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                  dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    # a model built afresh from the config without its GGUF marker, holding the weights
    fields = loaded.config.to_dict()
    fields.pop("quantization_config", None)
    kind = fields.pop("model_type")
    config = AutoConfig.for_model(kind, **{k: v for k, v in fields.items()
                                           if k not in ("transformers_version", "architectures")})
    config.architectures = loaded.config.architectures
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id = tok.bos_token_id, tok.eos_token_id
    gen.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    gen._from_model_config = False  # the file is authoritative, not derived from config.json
    save_folder(model, tok, out, "import")
    return out, precision


def add_parser(sub) -> None:
    p = sub.add_parser("import", help="a clean Hugging Face folder (float32 safetensors, "
                       "tokenizer, chat template) from a GGUF file")
    p.add_argument("gguf_file", help="the .gguf file")
    p.add_argument("out_dir", help="new directory to write (must not hold anything)")
    p.set_defaults(fn=cmd_import)


def cmd_import(args) -> int:
    out, precision = import_gguf(args.gguf_file, args.out_dir)
    shown = ", ".join(f"{n} {k}" for k, n in precision.items())
    print(f"{out}: dequantised to float32 from {shown} tensors")
    return 0
