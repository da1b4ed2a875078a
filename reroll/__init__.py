"""reroll: rollout-centric RL post-training for language models."""

__version__ = "0.1.0"
