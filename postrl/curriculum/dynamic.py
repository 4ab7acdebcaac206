"""Dynamic sampling (DAPO, Yu et al. 2025): train only on groups that carry signal.

A group whose rewards are all equal has all-zero group-relative advantages: it costs a forward
and backward pass and teaches nothing (only the KL and entropy terms move). `fill_batch` drops
such groups and asks for more prompts until the batch holds as many groups as it started with,
or until `max_extra_draws` extra rounds have been spent:

    fill = fill_batch(samples, draw, group_size=8, max_extra_draws=3, minibatches=2)
    fill.kept     # groups with reward spread only, renumbered 0..K-1, K <= the original count
    fill.drawn    # every group drawn this step (for the curriculum's pass rates), groups numbered
                  # uniquely across rounds (renumbered on copies: the drawn samples are not modified)
    fill.metrics()

`draw(k, round)` samples and scores k more prompts (`round` = 1, 2, ...: the caller seeds each
round separately, so a resumed run replays the same draws). When the cap is reached short of a
full batch, the batch is smaller that step; it is cut to a whole number of groups that the
minibatches divide evenly, so every step still takes `minibatches` optimiser steps.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from postrl.records import Sample


@dataclass
class FillResult:
    kept: list[Sample]
    drawn: list[Sample]
    target_groups: int
    dropped_groups: int = 0
    """Groups drawn with zero reward variance (all the same reward)."""
    extra_draws: int = 0
    """Extra sample-and-score rounds spent."""
    seconds: float = 0.0
    """Time spent in extra rounds."""
    enabled: bool = True
    per_domain_dropped: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        kept_groups = len({s.group for s in self.kept})
        m = {
            "dynamic/dropped_groups": float(self.dropped_groups),
            "dynamic/extra_draws": float(self.extra_draws),
            "train/dynamic_sampling_draws": float(self.extra_draws),  # the same count under the name #45 asks
            "dynamic/kept_groups": float(kept_groups),
            "dynamic/missing_groups": float(self.target_groups - kept_groups),
            "time/refill_s": self.seconds,
        }
        for domain, n in sorted(self.per_domain_dropped.items()):
            m[f"dynamic/dropped_groups/{domain}"] = float(n)
        return m


def split_groups(samples: list[Sample], group_size: int) -> list[list[Sample]]:
    return [samples[i : i + group_size] for i in range(0, len(samples), group_size)]


def has_signal(group: list[Sample]) -> bool:
    rewards = [s.reward for s in group]
    return max(rewards) - min(rewards) > 1e-9


def fill_batch(
    first: list[Sample], draw: Callable[[int, int], list[Sample]], group_size: int, max_extra_draws: int,
    minibatches: int = 1,
) -> FillResult:
    """Keep `first`'s groups with reward spread, draw more until as many groups as `first` has
    (or the cap), never returning a zero-variance group. `first` and each draw: whole groups,
    contiguous, in group order."""
    target = len(first) // group_size
    result = FillResult(kept=[], drawn=[], target_groups=target)
    kept: list[list[Sample]] = []
    _absorb(result, kept, first, group_size)
    t0 = time.perf_counter()
    while len(kept) < target and result.extra_draws < max_extra_draws:
        result.extra_draws += 1
        keep_rate = max(len(kept), 1) / len(result.drawn) * group_size
        missing = target - len(kept)
        # ask for what the observed keep rate says will fill the batch, at most one full batch
        more = draw(min(target, math.ceil(missing / keep_rate)), result.extra_draws)
        _absorb(result, kept, more, group_size)
    result.seconds = time.perf_counter() - t0
    step = minibatches // math.gcd(group_size, minibatches)  # groups per whole minibatch split
    kept = kept[: min(target, len(kept)) // step * step]
    result.kept = [dataclasses.replace(s, group=g) for g, group in enumerate(kept) for s in group]
    return result


def _absorb(result: FillResult, kept: list[list[Sample]], samples: list[Sample], group_size: int) -> None:
    offset = len(result.drawn) // group_size
    for i, group in enumerate(split_groups(samples, group_size)):
        if group[0].group != offset + i:  # unique across rounds, so the curriculum sees each group once
            group = [dataclasses.replace(s, group=offset + i) for s in group]
        result.drawn.extend(group)
        if has_signal(group):
            kept.append(group)
        else:
            result.dropped_groups += 1
            domain = group[0].task.domain
            result.per_domain_dropped[domain] = result.per_domain_dropped.get(domain, 0) + 1


def passthrough(samples: list[Sample], group_size: int) -> FillResult:
    """Dynamic sampling off: the batch as drawn."""
    return FillResult(kept=samples, drawn=samples, target_groups=len(samples) // group_size, enabled=False)
