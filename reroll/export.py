"""`reroll export CHECKPOINT OUT_DIR`: a clean, standalone Hugging Face model folder from a
run, a checkpoint, an sft output or a model directory.

The folder holds what `AutoModelForCausalLM` / `AutoTokenizer` need and nothing of the
run (no optimiser, RNG, data cursor or buffered groups): ``config.json``, safetensors
weights, the tokenizer files (with its chat template) and ``generation_config.json``
whose ``eos_token_id`` is the token reroll's rollouts stop at (the tokenizer's EOS) and
whose ``pad_token_id`` is the tokenizer's pad (EOS when it has none, as reroll loads it).
A damaged checkpoint (manifest mismatch) is refused; the folder is written aside and
renamed, so a failed export leaves nothing half-written; an existing non-empty OUT_DIR is
never overwritten, ``~`` is the home directory, and an OUT_DIR that cannot be written is a
one-line error. Knows the checkpoint layout only through `reroll.build.weights_dir`.
"""

from __future__ import annotations

import json
from pathlib import Path

from reroll.errors import ConfigError
from reroll.models.folder import save_folder

DTYPES = ("float32", "bfloat16", "float16")


def export(source: str | Path, out_dir: str | Path, dtype: str = "") -> Path:
    """Write the model of ``source`` to ``out_dir`` as a standalone HF folder, in ``dtype``
    (default: the dtype it was saved in). Returns ``out_dir``."""
    from reroll.build import quiet_transformers, weights_dir
    from reroll.models import load

    out = Path(str(out_dir)).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{str(out)!r} already exists and is not an empty "
                          f"directory; choose a new OUT_DIR")
    if dtype and dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    from reroll.trainer.checkpoint import check_whole

    src = weights_dir(source)
    check_whole(src)
    quiet_transformers()
    saved = json.loads((src / "config.json").read_text())
    target = dtype or saved.get("dtype") or saved.get("torch_dtype") or "float32"
    model, tok = load(src, target)
    gen = model.generation_config
    gen.eos_token_id = tok.eos_token_id
    gen.pad_token_id = tok.pad_token_id
    if tok.bos_token_id is not None:
        gen.bos_token_id = tok.bos_token_id
    gen._from_model_config = False  # the file is authoritative, not derived from config.json
    return save_folder(model, tok, out, "export")


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="a clean Hugging Face folder (weights, config, "
                       "tokenizer, generation config) from a run or checkpoint")
    p.add_argument("checkpoint", help="run dir (its latest checkpoint), checkpoint dir, sft "
                   "dir or model dir")
    p.add_argument("out_dir", help="new directory to write (must not hold anything)")
    p.add_argument("--dtype", default="", help=f"one of {', '.join(DTYPES)} (default: as "
                   f"saved)")
    p.set_defaults(fn=cmd_export)


def cmd_export(args) -> int:
    print(export(args.checkpoint, args.out_dir, args.dtype))
    return 0
