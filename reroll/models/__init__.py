"""Model and tokenizer builders (tiny CPU models) and the one loading path for checkpoints."""

from reroll.models.tiny import build_tiny, build_tokenizer, load

__all__ = ["build_tiny", "build_tokenizer", "load"]
