"""DAPO's soft overlong penalty (Yu et al. 2025, "DAPO", section 3.4, "Overlong Reward Shaping").

With L_max = max_new_tokens and a buffer of L_cache tokens before it, a completion of |y| tokens gets

    R_length(y) = 0                                  if |y| <= L_max - L_cache
                = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                = -1                                 if |y| > L_max

added to its reward: a linear ramp from 0 to -1 over the buffer, so a completion nearing the
budget is nudged shorter before it is cut (the hard `overlong` reward term only sees the cut).
A pure function of token counts; the sampler caps completions at L_max, so -1 is reached there.
"""

from __future__ import annotations

import torch


def soft_overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int) -> torch.Tensor:
    """lengths: [B] completion token counts -> [B] penalty in [-1, 0] (add it to the reward)."""
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong buffer {buffer} must be in 1..max_new_tokens ({max_new_tokens})")
    start = max_new_tokens - buffer  # the ramp begins past this length
    ramp = (start - lengths.float()) / buffer  # [B], <= 0 past start
    return ramp.clamp(min=-1.0, max=0.0)
