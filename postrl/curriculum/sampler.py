"""Drawing a step's prompts from the domain mixture.

    sampler = TaskSampler(domains, seed)                 # or TaskSampler(domains, seed, "stratified")
    tasks = sampler.next_batch(32, {"arith": 0.7, "code": 0.3})
    tasks = sampler.next_batch(32, schedule.weights, schedule.task_weight)

Each prompt's domain is drawn by weight (`curriculum.domain_draw`): independently for each prompt,
or stratified, where one random offset places the step's n prompts at evenly spaced points of the
cumulative weights, so that a domain of weight w gets floor(n*w) or ceil(n*w) of them (n*w on
average) and their order is then shuffled. With 8 prompts a step and weights 0.2/0.4/0.4,
independent draws leave the first domain out of a step 17% of the time (0.8^8); stratified ones
never do. Then a problem is drawn from the chosen domain (from any of its levels: the curriculum
weighs and gates levels through `task_weight`). With `task_weight`, a drawn problem is kept with that probability and
redrawn otherwise (rejection sampling: the curriculum's per-problem weights without enumerating
the problems). The draw is seeded and its state is part of a checkpoint, so a resumed run draws
exactly the prompts the uninterrupted run would have.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from postrl.records import Task
from postrl.tasks.base import Domain

MAX_REDRAWS = 50
"""Redraws per prompt before the sampler takes what it has: a domain whose problems are all
parked or mastered must not stall the run."""


class TaskSampler:
    def __init__(self, domains: dict[str, Domain], seed: int, domain_draw: str = "independent"):
        self.domains = domains
        self.rng = random.Random(seed)
        self.domain_draw = domain_draw

    def next_batch(
        self, n: int, domain_weights: dict[str, float], task_weight: Callable[[Task], float] | None = None,
    ) -> list[Task]:
        names = list(self.domains)
        weights = [max(domain_weights.get(name, 0.0), 0.0) for name in names]
        if sum(weights) <= 0:
            raise ValueError(f"all domain weights are zero: {domain_weights}")
        if self.domain_draw == "stratified":
            picks = self._stratified(names, weights, n)
        else:
            picks = self.rng.choices(names, weights=weights, k=n)
        return [self._draw(self.domains[name], task_weight) for name in picks]

    def _stratified(self, names: list[str], weights: list[float], n: int) -> list[str]:
        """Systematic sampling: the points (u + k) / n, k < n, for one uniform u, each taking the
        domain whose stretch of the cumulative weights it falls in; then shuffled."""
        total, offset = sum(weights), self.rng.random()
        picks, i, edge = [], 0, weights[0] / total
        for k in range(n):
            while (offset + k) / n >= edge and i < len(names) - 1:
                i += 1
                edge += weights[i] / total
            picks.append(names[i])
        self.rng.shuffle(picks)
        return picks

    def _draw(self, domain: Domain, task_weight: Callable[[Task], float] | None) -> Task:
        for _ in range(MAX_REDRAWS):
            task = domain.sample(self.rng, None)
            w = 1.0 if task_weight is None else task_weight(task)
            # weight 1 draws no random number, so a schedule that keeps everything leaves the
            # random stream (and every resumed run) exactly as without a curriculum
            if w >= 1.0 or self.rng.random() < w:
                return task
        return task

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.setstate(state["rng"])
