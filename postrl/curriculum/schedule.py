"""Domain-weight schedules: `weights = schedule.update(step, samples, weights)` once per step.

`fixed` keeps the recipe's weights. Schedules are registered by name and carry their state in
`state_dict()` so that checkpoints restore them exactly.
"""

from __future__ import annotations

from collections.abc import Callable

SCHEDULES: dict[str, Callable] = {}


def register_schedule(name: str) -> Callable:
    def deco(cls):
        SCHEDULES[name] = cls
        return cls

    return deco


@register_schedule("fixed")
class FixedSchedule:
    def __init__(self, weights: dict[str, float], **_):
        self.weights = dict(weights)

    def update(self, step: int, samples: list, weights: dict[str, float]) -> dict[str, float]:
        return self.weights

    def state_dict(self) -> dict:
        return {"weights": self.weights}

    def load_state_dict(self, state: dict) -> None:
        self.weights = dict(state["weights"])
