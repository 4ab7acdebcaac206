"""What the learner needs of its data-parallel ranks, as a Protocol of its own.

`Learner` is given an object of this shape with `train.learners` > 1 (`postrl.learner.distributed.Ranks`,
which builds a `Learner` in each rank process): this module lets the learner name what it calls
without importing the module that imports it, so the two do not form a circle.
"""

from __future__ import annotations

from typing import Protocol

import torch

from postrl.records import Batch


class LearnerRanks(Protocol):
    rank: int
    """This process's rank: 0 is the trainer's, which sends; 1..N-1 follow it."""
    sharded: bool
    """`train.shard: fsdp`: the model is sharded across the ranks (`postrl.learner.sharded`)."""

    def send_state(self, weights: dict[str, torch.Tensor], learner_state: dict | None) -> None:
        """Rank 0: its model weights and `Learner.state_dict()` to every rank, ahead of the next update."""

    def gather_state(self) -> None:
        """Rank 0, sharded: every rank joins the gather of the optimiser's state that rank 0 starts next."""

    def scale_lr(self, factor: float) -> None:
        """Rank 0, sharded: every rank scales its learning rate as rank 0 just did."""

    def begin(self, batch: Batch, kl_coef: float, generator: torch.Generator) -> None:
        """Rank 0: the update sent to every rank, before rank 0 makes its own share of it."""

    def end(self) -> None:
        """After the update (what `begin` took, given back)."""

    def dead(self) -> list[tuple[int, int | None]]:
        """(rank, exit code) of every rank that is not running."""

    def close(self) -> None:
        """Every rank stopped."""

    def share(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous share of a minibatch's rows."""

    def sum_grads(self, params: list[torch.Tensor]) -> None:
        """Every rank's gradients summed into each of `params`' .grad."""

    def most(self, count: int) -> int:
        """The largest of the ranks' `count`s."""

    def sum_stats(self, totals: dict[str, float], kl_max: float, sample_entropy: torch.Tensor,
                  memory: dict[str, float]) -> float:
        """The ranks' loss terms, row entropies and memory figures combined; returns the largest KL."""

    def check_same(self, params: list[torch.Tensor]) -> None:
        """Every rank holds the same `params` (a RuntimeError otherwise)."""
