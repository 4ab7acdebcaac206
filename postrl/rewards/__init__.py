"""Pure, batched reward functions and verifiers."""

from postrl.rewards.base import Score

__all__ = ["Score"]
