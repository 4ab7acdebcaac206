"""Where randomness comes from. A leaf: imports nothing from postrl.

Every random draw of a run comes from a generator seeded by (seed, step, stream), never from a
generator that carries state across steps, so a run resumed at step N, or an order sampled again
after a worker died, makes exactly the draws of an uninterrupted run. Streams: 0 is a step's
first sampling draw, 1 the update, 1 + r dynamic sampling's r-th extra draw.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def step_generator(seed: int, step: int, stream: int) -> torch.Generator:
    """A fresh generator per (step, purpose): a resumed run replays exactly the same draws."""
    h = 1469598103934665603
    for part in (seed, step, stream):
        h = ((h ^ (part & 0xFFFFFFFF)) * 1099511628211) % 2**63
    return torch.Generator().manual_seed(h)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def set_threads(threads: int) -> None:
    """torch intra-op threads; 0 leaves torch's default."""
    if threads > 0:
        torch.set_num_threads(threads)
