"""Writing a model folder atomically: `save_folder` saves a model and its tokenizer into a
temporary sibling and renames it into place, so a folder that exists is whole. Used by
`reroll export` and `reroll import`; knows nothing of checkpoints or runs."""

from __future__ import annotations

import shutil
from pathlib import Path

from reroll.errors import ConfigError


def save_folder(model, tok, out: Path, tag: str) -> Path:
    """Save ``model`` (safetensors) and ``tok`` as ``out`` (absent, or an empty directory the
    caller has checked), through ``.{out.name}.{tag}.tmp`` beside it; files readable by all
    (safetensors writes 0600; the folder is meant to be shared). An unwritable place is a
    ConfigError naming ``out``."""
    tmp = out.parent / f".{out.name}.{tag}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except OSError as e:
        raise ConfigError(f"OUT_DIR {str(out)!r} cannot be written ({e.strerror or e}); "
                          f"choose a directory you can write") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
