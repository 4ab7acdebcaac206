"""What every monitor is built on: the `Monitor` Protocol and the `MonitorContext` it is given,
the `Trigger` that fires once after `patience` bad observations and re-arms when one is good, and
the `MONITORS` registry with `register_monitor`.

It knows no monitor. The built-ins register from `on_metrics`, `on_samples`, `on_episodes` and
`proxy_gold`, which `postrl.monitor.monitors` (the set the run holds) imports.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from postrl.monitor.alerts import Alert
from postrl.monitor.settings import PLUGIN_SETTINGS, MonitorConfig
from postrl.registry import Registry


@dataclass
class MonitorContext:
    """What monitors need to know about the run besides their own settings."""

    reward_weights: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per domain, the recipe's reward term weights (`domains.<name>.reward`); empty = own reward."""
    gold_heldout: list[str] = field(default_factory=list)
    """Eval-only domains graded by a trained domain's gold scorer, evaluated every step: what `auto`
    stands for in `monitor.proxy_gold.heldout_domains` (`postrl.config.gold_graded_eval_domains`)."""


class Monitor(Protocol):
    name: str
    values: dict[str, float]
    """Statistics tested in the last update, logged as metrics."""

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class WatchesEval(Protocol):
    """A monitor that also reads the held-out eval results (`Monitors.observe_eval`)."""

    def observe_eval(self, step: int, result: dict[str, dict[str, float]]) -> None: ...


class Trigger:
    """Fires once after `patience` consecutive bad observations; re-arms when one is good."""

    def __init__(self, patience: int = 1):
        self.patience = max(1, patience)
        self.count = 0
        self.fired = False

    def observe(self, bad: bool) -> bool:
        if not bad:
            self.count, self.fired = 0, False
            return False
        self.count += 1
        if self.count >= self.patience and not self.fired:
            self.fired = True
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "fired": self.fired}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count, self.fired = int(state["count"]), bool(state["fired"])


MONITORS = Registry("monitor")
"""Name -> class(settings, MonitorContext) -> Monitor; each has its settings at `monitor.NAME`."""


def register_monitor(name: str, settings: type | None = None):
    """Class decorator: registers the monitor and gives it its name. A monitor registered outside
    postrl (an extension, `imports:`) declares its settings dataclass, with at least `enabled` and
    `action` fields; a recipe sets them at `monitor.NAME` and they are checked like the built-ins'."""

    def deco(cls):
        builtin = name in {f.name for f in dataclasses.fields(MonitorConfig)}
        if not builtin and not _has_switches(settings):
            raise ValueError(f"monitor {name!r}: register_monitor({name!r}, settings=DATACLASS) with "
                             f"`enabled` and `action` fields")
        MONITORS.add(name, cls)
        if not builtin:
            PLUGIN_SETTINGS[name] = settings
        cls.name = name
        return cls

    return deco


def _has_switches(settings: type | None) -> bool:
    names = {f.name for f in dataclasses.fields(settings)} if dataclasses.is_dataclass(settings) else set()
    return {"enabled", "action"} <= names


def finite(metrics: dict[str, float], name: str) -> float | None:
    """Metric `name` as a float; None when the step has none or it is NaN or infinite."""
    v = metrics.get(name)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def slope(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares slope of value against step."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if var == 0 else sum((p[0] - mx) * (p[1] - my) for p in points) / var
