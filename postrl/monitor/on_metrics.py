"""Monitors that read the step's metrics (names as in `postrl.monitor.sinks`): entropy_collapse,
kl_spike, length_drift, verifier_disagreement, non_finite and mismatch. What each reads and when it
fires: the table in `postrl.monitor.monitors`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from postrl.monitor.alerts import Alert
from postrl.monitor.base import MonitorContext, Trigger, finite, register_monitor, slope
from postrl.monitor.settings import (
    EntropyCollapseConfig,
    KlSpikeConfig,
    LengthDriftConfig,
    MismatchConfig,
    NonFiniteConfig,
    VerifierDisagreementConfig,
)


@register_monitor("entropy_collapse")
class EntropyCollapse:
    def __init__(self, cfg: EntropyCollapseConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.initial: float | None = None
        self.trigger = Trigger(cfg.patience_steps)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        entropy = finite(metrics, "entropy")
        if entropy is None:
            return []
        if self.initial is None:
            self.initial = entropy
        floor = max(self.cfg.min_entropy, self.cfg.min_fraction_of_initial * self.initial)
        self.values = {"monitor/entropy_ratio": entropy / self.initial if self.initial > 0 else 1.0}
        if not self.trigger.observe(entropy < floor):
            return []
        msg = (f"entropy {entropy:.4g} nats/token below {floor:.4g} for {self.trigger.count} steps "
               f"(first value {self.initial:.4g})")
        return [Alert(step, self.name, msg, self.cfg.action, {"entropy": entropy, "floor": floor})]

    def state_dict(self) -> dict[str, Any]:
        return {"initial": self.initial, "trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.initial = state["initial"]
        self.trigger.load_state_dict(state["trigger"])


@register_monitor("kl_spike")
class KlSpike:
    def __init__(self, cfg: KlSpikeConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.ema: float | None = None
        self.seen = 0
        self.trigger = Trigger(1)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        kl = finite(metrics, "kl/mean")
        if kl is None:
            return []
        baseline = max(self.ema if self.ema is not None else kl, self.cfg.floor_kl)
        relative = self.seen >= self.cfg.warmup_steps and kl > self.cfg.spike_factor * baseline
        bad = kl > self.cfg.max_kl or relative
        self.values = {"monitor/kl_ratio": kl / baseline}
        # The spike itself enters the running mean: a lasting new level stops being a "spike".
        self.ema = kl if self.ema is None else self.cfg.ema_beta * self.ema + (1 - self.cfg.ema_beta) * kl
        self.seen += 1
        if not self.trigger.observe(bad):
            return []
        msg = (f"kl/mean {kl:.4g} exceeds max {self.cfg.max_kl:.4g} or {self.cfg.spike_factor:g}x "
               f"its running mean {baseline:.4g}")
        return [Alert(step, self.name, msg, self.cfg.action, {"kl": kl, "baseline": baseline})]

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema, "seen": self.seen, "trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema, self.seen = state["ema"], int(state["seen"])
        self.trigger.load_state_dict(state["trigger"])


@register_monitor("length_drift")
class LengthDrift:
    def __init__(self, cfg: LengthDriftConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.history: deque[tuple[float, float]] = deque(maxlen=max(3, cfg.window_steps))
        self.trigger = Trigger(1)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        length, passed = finite(metrics, "response_len/mean"), finite(metrics, "pass_rate")
        if length is None or passed is None:
            return []
        self.history.append((length, passed))
        if len(self.history) < self.history.maxlen:
            return []
        third = len(self.history) // 3
        old, new = list(self.history)[:third], list(self.history)[-third:]
        old_len, new_len = (sum(h[0] for h in part) / third for part in (old, new))
        gain = sum(h[1] for h in new) / third - sum(h[1] for h in old) / third
        growth = new_len / old_len - 1 if old_len > 0 else 0.0
        self.values = {"monitor/length_growth": growth}
        if not self.trigger.observe(growth > self.cfg.max_growth and gain < self.cfg.min_pass_gain):
            return []
        msg = (f"response length grew {growth:+.0%} ({old_len:.1f} -> {new_len:.1f} tokens) over "
               f"{len(self.history)} steps while pass rate changed {gain:+.3f}")
        return [Alert(step, self.name, msg, self.cfg.action, {"growth": growth, "pass_gain": gain})]

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend(tuple(h) for h in state["history"])
        self.trigger.load_state_dict(state["trigger"])


@register_monitor("verifier_disagreement")
class VerifierDisagreement:
    def __init__(self, cfg: VerifierDisagreementConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.series: dict[str, list[tuple[int, float]]] = {}
        self.triggers = {train: Trigger(1) for train in cfg.pairs}
        self.values: dict[str, float] = {}

    def _rise(self, name: str, step: int) -> float | None:
        pts = [p for p in self.series.get(name, []) if p[0] > step - self.cfg.window_steps]
        if len(pts) < self.cfg.min_points:
            return None
        return slope(pts) * (self.cfg.window_steps - 1)

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        for name in {*self.cfg.pairs, *self.cfg.pairs.values()}:
            v = finite(metrics, name)
            if v is not None:
                pts = self.series.setdefault(name, []) + [(step, v)]
                self.series[name] = [p for p in pts if p[0] > step - self.cfg.window_steps]
        alerts, self.values = [], {}
        for train, heldout in self.cfg.pairs.items():
            rise, follow = self._rise(train, step), self._rise(heldout, step)
            if rise is None or follow is None:
                continue
            self.values[f"monitor/verifier_gap/{train}"] = rise - follow
            bad = rise > self.cfg.min_rise and follow < self.cfg.min_agreement * rise
            if self.triggers[train].observe(bad):
                msg = (f"{train} rose {rise:+.3f} over {self.cfg.window_steps} steps but {heldout} "
                       f"changed {follow:+.3f} (needs >= {self.cfg.min_agreement:.0%} of the rise)")
                alerts.append(Alert(step, self.name, msg, self.cfg.action, {"rise": rise, "follow": follow}))
        return alerts

    def state_dict(self) -> dict[str, Any]:
        return {"series": {k: [list(p) for p in v] for k, v in self.series.items()},
                "triggers": {k: t.state_dict() for k, t in self.triggers.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.series = {k: [(int(p[0]), float(p[1])) for p in v] for k, v in state["series"].items()}
        for k, t in state["triggers"].items():
            if k in self.triggers:
                self.triggers[k].load_state_dict(t)


@register_monitor("non_finite")
class NonFinite:
    def __init__(self, cfg: NonFiniteConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.trigger = Trigger(1)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        bad = {k: float(metrics[k]) for k in self.cfg.metrics if k in metrics and not math.isfinite(float(metrics[k]))}
        if not self.trigger.observe(bool(bad)):
            return []
        msg = "non-finite " + ", ".join(f"{k}={v}" for k, v in bad.items())
        return [Alert(step, self.name, msg, self.cfg.action, bad)]

    def state_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])


@register_monitor("mismatch")
class Mismatch:
    """The train/inference mismatch (`postrl.algo.correction.mismatch_stats`, logged every step on
    the fresh rows the learner forwarded): a weight sync that did not land, or an inference engine
    whose numerics stray, shows here the first step after the weights change."""

    def __init__(self, cfg: MismatchConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.trigger = Trigger(1)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        diff, kl = finite(metrics, "mismatch/logp_abs_diff_mean"), finite(metrics, "mismatch/kl_k3")
        if diff is None or kl is None:  # no fresh rows measured this step
            return []
        if not self.trigger.observe(diff > self.cfg.max_logp_abs_diff_mean or kl > self.cfg.max_kl_k3):
            return []
        msg = (f"sampler and learner disagree on the same weights: mean |dlogp| {diff:.3g} (max "
               f"{self.cfg.max_logp_abs_diff_mean:g}), KL(behaviour || learner) {kl:.3g} (max {self.cfg.max_kl_k3:g}); "
               f"did the weight sync land?")
        return [Alert(step, self.name, msg, self.cfg.action, {"logp_abs_diff_mean": diff, "kl_k3": kl})]

    def state_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])
