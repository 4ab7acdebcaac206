"""Drawing a step's prompts from the domain mixture.

    sampler = TaskSampler(domains, seed)
    tasks = sampler.next_batch(32, {"arith": 0.7, "code": 0.3})

Each prompt's domain is drawn independently by weight; the draw is seeded and its state is part
of a checkpoint, so a resumed run draws exactly the prompts the uninterrupted run would have.
"""

from __future__ import annotations

import random

from postrl.tasks.base import Domain, Task


class TaskSampler:
    def __init__(self, domains: dict[str, Domain], seed: int):
        self.domains = domains
        self.rng = random.Random(seed)

    def next_batch(self, n: int, domain_weights: dict[str, float], levels: dict[str, int] | None = None) -> list[Task]:
        names = list(self.domains)
        weights = [max(domain_weights.get(name, 0.0), 0.0) for name in names]
        if sum(weights) <= 0:
            raise ValueError(f"all domain weights are zero: {domain_weights}")
        picks = self.rng.choices(names, weights=weights, k=n)
        levels = levels or {}
        return [self.domains[name].sample(self.rng, levels.get(name)) for name in picks]

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
