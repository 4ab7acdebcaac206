"""Named monitors that watch a run for collapse, drift and reward hacking.

    monitors = build_monitors(cfg.monitor, MonitorContext(reward_weights))   # the enabled ones, by name
    alerts = monitors.update(step, metrics, samples)     # -> list[Alert], each with its configured action
    sinks.log(step, {**metrics, **monitors.values()})    # monitor/<...> statistics they tested
    state = monitors.state_dict(); monitors.load_state_dict(state)   # into / out of checkpoints

Every monitor reads the step's metrics (names as in `postrl.monitor.sinks`) and/or the step's
`Sample`s, keeps a little history, and returns alerts. An alert fires when a condition has held
for `patience_steps` consecutive observations, then stays quiet until the condition clears (so a
`warn` does not repeat every step), after which it can fire again. A monitor whose inputs are
absent in a step (e.g. no `entropy` metric) skips that step without changing its state.

| name                  | reads                                    | fires when                                   |
|-----------------------|------------------------------------------|----------------------------------------------|
| entropy_collapse      | entropy                                  | below an absolute floor or a share of the first value |
| kl_spike              | kl/mean                                  | above max_kl, or spike_factor x its running mean |
| length_drift          | response_len/mean, pass_rate             | length grew by max_growth over the window while pass rate did not gain |
| verifier_disagreement | pairs of metrics (train -> held-out)     | the train metric rose and the held-out one did not follow |
| format_share          | samples' reward components x weights     | format-only terms earn most of the positive reward |
| repetition            | samples' completion token ids            | many completions repeat their own n-grams    |
| test_tampering        | samples' completion text                 | code defines/patches test names or exits early |
| non_finite            | loss, grad_norm                          | a value is NaN or infinite                   |
| mismatch              | mismatch/logp_abs_diff_mean, kl_k3       | sampler and learner log-probs differ (a sync that did not land) |
| proxy_gold            | samples' reward and `gold`, held-out gold | smoothed gold fell from its best while the proxy rose |
| tool_loop             | samples' episodes (tool turns)           | many episodes repeat one tool call           |
| tool_errors           | samples' episodes (tool statuses)        | the tool-error rate is high or rising        |

Their settings (`MonitorConfig`, one dataclass per monitor) are in `postrl.monitor.settings`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from postrl.monitor.alerts import ALERT_ACTIONS, Alert
from postrl.monitor.settings import (  # noqa: F401  (re-exported for callers of build_monitors)
    HELDOUT_AUTO,
    PLUGIN_SETTINGS,
    EntropyCollapseConfig,
    FormatShareConfig,
    KlSpikeConfig,
    LengthDriftConfig,
    MismatchConfig,
    MonitorConfig,
    NonFiniteConfig,
    ProxyGoldConfig,
    RepetitionConfig,
    TamperingConfig,
    ToolErrorsConfig,
    ToolLoopConfig,
    VerifierDisagreementConfig,
)
from postrl.registry import Registry

# ---------------------------------------------------------------------------- plumbing


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


def _finite(metrics: dict[str, float], name: str) -> float | None:
    v = metrics.get(name)
    return float(v) if v is not None and math.isfinite(float(v)) else None


def _slope(points: Sequence[tuple[int, float]]) -> float:
    """Least-squares slope of value against step."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if var == 0 else sum((p[0] - mx) * (p[1] - my) for p in points) / var


# ---------------------------------------------------------------------------- monitors on metrics


@register_monitor("entropy_collapse")
class EntropyCollapse:
    def __init__(self, cfg: EntropyCollapseConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.initial: float | None = None
        self.trigger = Trigger(cfg.patience_steps)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        entropy = _finite(metrics, "entropy")
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
        kl = _finite(metrics, "kl/mean")
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
        length, passed = _finite(metrics, "response_len/mean"), _finite(metrics, "pass_rate")
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
        return _slope(pts) * (self.cfg.window_steps - 1)

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        for name in {*self.cfg.pairs, *self.cfg.pairs.values()}:
            v = _finite(metrics, name)
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
        diff, kl = _finite(metrics, "mismatch/logp_abs_diff_mean"), _finite(metrics, "mismatch/kl_k3")
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


# ---------------------------------------------------------------------------- monitors on samples


@register_monitor("format_share")
class FormatShare:
    def __init__(self, cfg: FormatShareConfig, ctx: MonitorContext):
        self.cfg, self.ctx = cfg, ctx
        self.trigger = Trigger(cfg.patience_steps)
        self.values: dict[str, float] = {}

    def contributions(self, score, domain: str) -> dict[str, float]:
        """Each term's weighted part of the reward. Components are stored unweighted
        (postrl.rewards.composite), so the recipe's weights turn them back into reward."""
        weights = self.ctx.reward_weights.get(domain)
        if not weights:  # the domain's own reward, with no shaping terms
            return {"reward": score.reward}
        return {name: w * score.components.get(name, 0.0) for name, w in weights.items()}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        # Shares of *positive* reward: a penalty term must not make format look less dominant.
        fmt = total = 0.0
        for s in samples:
            if s.score is None:
                continue
            for name, v in self.contributions(s.score, s.task.domain).items():
                total += max(v, 0.0)
                fmt += max(v, 0.0) if name.startswith(tuple(self.cfg.prefixes)) else 0.0
        if total <= 0:
            return []
        share = fmt / total
        self.values = {"monitor/format_share": share}
        if not self.trigger.observe(share > self.cfg.max_share):
            return []
        msg = (f"format-only terms ({', '.join(p + '*' for p in self.cfg.prefixes)}) earn {share:.0%} of positive reward "
               f"(max {self.cfg.max_share:.0%}) for {self.trigger.count} steps")
        return [Alert(step, self.name, msg, self.cfg.action, {"share": share})]

    def state_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])


def repeat_fraction(ids: Sequence[int], n: int) -> float | None:
    """Share of a sequence's n-grams that repeat an earlier one; None when too short to judge."""
    if len(ids) < 2 * n:
        return None
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


@register_monitor("repetition")
class Repetition:
    def __init__(self, cfg: RepetitionConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.trigger = Trigger(cfg.patience_steps)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        fracs = [f for s in samples if (f := repeat_fraction(s.completion_ids, self.cfg.ngram)) is not None]
        if not fracs:
            return []
        share = sum(f > self.cfg.max_repeat_fraction for f in fracs) / len(fracs)
        self.values = {"monitor/repetitive_share": share}
        if not self.trigger.observe(share > self.cfg.max_repetitive_share):
            return []
        msg = (f"{share:.0%} of completions repeat over {self.cfg.max_repeat_fraction:.0%} of their "
               f"{self.cfg.ngram}-grams (max share {self.cfg.max_repetitive_share:.0%})")
        return [Alert(step, self.name, msg, self.cfg.action, {"share": share})]

    def state_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])


def tampering_patterns(cfg: TamperingConfig) -> list[tuple[str, re.Pattern[str]]]:
    pats = []
    for name in cfg.protected_names:
        n = re.escape(name)
        # def/class NAME, NAME = ..., `import x as NAME`, globals()['NAME']
        rx = rf"(\b(def|class)\s+{n}\b|(^|[;\s]){n}\s*=[^=]|\bas\s+{n}\b|\[\s*['\"]{n}['\"]\s*\]\s*=)"
        pats.append((f"defines {name}", re.compile(rx, re.MULTILINE)))
    for s in cfg.forbidden:
        pats.append((f"uses {s}", re.compile(rf"(?<![\w.]){re.escape(s)}")))
    return pats


@register_monitor("test_tampering")
class Tampering:
    def __init__(self, cfg: TamperingConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.patterns = tampering_patterns(cfg)
        self.trigger = Trigger(1)
        self.values: dict[str, float] = {}

    def find(self, text: str, allowed: str = "") -> list[str]:
        """Labels of the tampering patterns in `text`; `allowed` is the task's own entry point."""
        return [label for label, rx in self.patterns if label != f"defines {allowed}" and rx.search(text)]

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        hits = [(s, found) for s in samples if (found := self.find(s.text, s.task.answer))]
        if samples:
            self.values = {"monitor/tampering_share": len(hits) / len(samples)}
        if not self.trigger.observe(len(hits) >= self.cfg.min_samples):
            return []
        s, found = hits[0]
        msg = (f"{len(hits)} completion(s) tamper with tests; e.g. {s.task.domain}/{s.task.task_id} "
               f"group {s.group}: {', '.join(found)}")
        return [Alert(step, self.name, msg, self.cfg.action, {"samples": float(len(hits))})]

    def state_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])


# ---------------------------------------------------------------------------- monitors on episodes


def repeated_call(episode, min_repeats: int) -> str | None:
    """The tool call an episode made at least `min_repeats` times (the same text), if any."""
    calls = [t.text for t in episode.turns if t.role == "assistant" and t.tool]
    return next((c for c in dict.fromkeys(calls) if calls.count(c) >= min_repeats), None)


@register_monitor("tool_loop")
class ToolLoop:
    def __init__(self, cfg: ToolLoopConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.trigger = Trigger(cfg.patience_steps)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        episodes = [s for s in samples if s.episode is not None]
        if not episodes:
            return []
        loops = [(s, c) for s in episodes if (c := repeated_call(s.episode, self.cfg.min_repeats)) is not None]
        share = len(loops) / len(episodes)
        self.values = {"monitor/tool_loop_share": share}
        if not self.trigger.observe(share > self.cfg.max_share):
            return []
        s, call = loops[0]
        msg = (f"{share:.0%} of episodes repeat one tool call {self.cfg.min_repeats}+ times (max "
               f"{self.cfg.max_share:.0%}); e.g. {s.task.domain}/{s.task.task_id}: {call[:80]!r}")
        return [Alert(step, self.name, msg, self.cfg.action, {"share": share})]

    def state_dict(self) -> dict[str, Any]:
        return {"trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trigger.load_state_dict(state["trigger"])


@register_monitor("tool_errors")
class ToolErrors:
    def __init__(self, cfg: ToolErrorsConfig, ctx: MonitorContext):
        self.cfg = cfg
        self.history: deque[tuple[int, float]] = deque(maxlen=max(2, cfg.window_steps))
        self.trigger = Trigger(1)
        self.values: dict[str, float] = {}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        episodes = [s.episode for s in samples if s.episode is not None]
        calls = sum(e.tool_calls for e in episodes)
        if not calls:  # no tool calls this step: nothing to judge, state unchanged
            return []
        rate = sum(e.tool_errors for e in episodes) / calls
        self.history.append((step, rate))
        full = len(self.history) == self.history.maxlen
        rise = _slope(list(self.history)) * (len(self.history) - 1) if full else 0.0
        self.values = {"monitor/tool_error_rate": rate, "monitor/tool_error_rise": rise}
        if not self.trigger.observe(rate > self.cfg.max_rate or rise > self.cfg.min_rise):
            return []
        msg = (f"tool-error rate {rate:.0%} of {calls} calls (max {self.cfg.max_rate:.0%}), risen {rise:+.2f} "
               f"over {len(self.history)} steps (max {self.cfg.min_rise:+.2f})")
        return [Alert(step, self.name, msg, self.cfg.action, {"rate": rate, "rise": rise})]

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend((int(h[0]), float(h[1])) for h in state["history"])
        self.trigger.load_state_dict(state["trigger"])


def pooled_mean(parts: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(mean, variance of that mean) of sources pooled by sample count; each part is (mean, variance
    of that mean, samples). Weighted by count, not by inverse variance: counts stay the same from step
    to step, so a source at another level (held-out prompts easier than the trained ones) moves the
    pooled series by a constant, where inverse-variance weights, which follow each step's spread,
    would move it with the spread.

        >>> [round(x, 6) for x in pooled_mean([(0.5, 0.002, 128), (0.25, 0.001, 256)])]  # 128 trained, 256 held-out
        [0.333333, 0.000667]

    ((0.5 x 128 + 0.25 x 256) / 384; (128^2 x 0.002 + 256^2 x 0.001) / 384^2.)"""
    total = sum(p[2] for p in parts)
    mean = sum(p[0] * p[2] for p in parts) / total
    return mean, sum(p[1] * p[2] ** 2 for p in parts) / total**2


def heldout_gold(result: dict[str, float]) -> tuple[float, float, int] | None:
    """(mean, variance of the mean, samples) of one domain's eval result (`postrl.evaluation`:
    reward_mean, reward_sem, n_scored); None when it graded nothing."""
    n = int(result.get("n_scored", 0))
    return (float(result["reward_mean"]), float(result["reward_sem"]) ** 2, n) if n else None


@register_monitor("proxy_gold")
class ProxyGold:
    """Reward-model over-optimisation: the proxy (the reward trained on) keeps rising while the gold
    (`domains.NAME.gold`, logged only) falls. Each step's proxy is the mean reward of the samples that
    carry a gold score; its gold is theirs, pooled by sample count with the held-out gold of
    `heldout_domains` (eval-only domains graded by the gold scorer, evaluated every step: the eval
    of step N scores the weights that sample step N and arrives just before that step's update, by
    `observe_eval`). Both are smoothed over `smooth_steps`. It fires when smoothed gold is below its
    best by more than `min_gold_drop` and by more than `noise_z` standard errors (each step's error
    from the spread of the trained samples' gold and the eval's standard error), while smoothed
    proxy stands above its value at gold's best. With held-out domains, a step whose eval is missing
    (step 0 without eval.at_start) is skipped: pooled with the trained samples alone its gold would
    sit at another level. The alert's data names the step where smoothed gold peaked (`best_step`),
    and asks a rollback for the weights that sampled it (`rollback_step`: `postrl.run.rollback_target`)."""

    def __init__(self, cfg: ProxyGoldConfig, ctx: MonitorContext | None):
        self.cfg = cfg
        auto = ctx.gold_heldout if ctx is not None else []
        named = [auto if name == HELDOUT_AUTO else [name] for name in cfg.heldout_domains]
        self.heldout = list(dict.fromkeys(d for names in named for d in names))
        """The eval-only domains whose eval results join the gold evidence, `auto` resolved."""
        self.history: deque[tuple[float, float, float]] = deque(maxlen=max(1, cfg.smooth_steps))
        """(proxy mean, gold mean, variance of the gold mean) of the last steps."""
        self.best: tuple[float, float, float, int] | None = None
        """(smoothed gold, its variance, smoothed proxy, step) where smoothed gold was highest."""
        self.pending: list | None = None
        """[step, [(mean, variance of the mean, samples) per held-out domain]]: the last eval's held-out
        gold, kept for the update of the step it scored. In checkpoints: a checkpoint of step N is
        written after the eval of step N and before its update."""
        self.trigger = Trigger(cfg.patience_steps)
        self.values: dict[str, float] = {}

    def observe_eval(self, step: int, result: dict[str, dict[str, float]]) -> None:
        if self.heldout:
            parts = [heldout_gold(result.get(name, {})) for name in self.heldout]
            self.pending = [step, parts] if all(parts) else None

    def gold_evidence(self, step: int, scored: list) -> list[tuple[float, float, int]] | None:
        """This step's gold sources, (mean, variance of the mean, samples) each: the trained samples'
        gold, then the held-out domains' (None: their eval of this step is missing)."""
        n, golds = len(scored), [s.components["gold"] for s in scored]
        mean = sum(golds) / n
        trained = (mean, sum((g - mean) ** 2 for g in golds) / max(n - 1, 1) / n, n)
        if not self.heldout:
            return [trained]
        if self.pending is None or self.pending[0] != step:
            return None
        return [trained, *(tuple(p) for p in self.pending[1])]

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        scored = [s.score for s in samples if s.score is not None and "gold" in s.score.components]
        parts = self.gold_evidence(step, scored) if scored else None
        if parts is None:
            return []
        self.pending = None
        gold_mean, gold_var = pooled_mean(parts)
        self.history.append((sum(s.reward for s in scored) / len(scored), gold_mean, gold_var))
        if len(self.history) < self.history.maxlen:
            return []
        k = len(self.history)
        proxy, gold = (sum(h[i] for h in self.history) / k for i in (0, 1))
        var = sum(h[2] for h in self.history) / k**2
        if self.best is None or gold > self.best[0]:
            self.best = (gold, var, proxy, step)
        drop, rise = self.best[0] - gold, proxy - self.best[2]
        needed = max(self.cfg.min_gold_drop, self.cfg.noise_z * math.sqrt(var + self.best[1]))
        self.values = {"monitor/proxy": proxy, "monitor/gold": gold, "monitor/gold_drop": drop}
        if not self.trigger.observe(drop > needed and rise > self.cfg.min_proxy_rise):
            return []
        msg = (f"gold fell {drop:.3f} below its best (step {self.best[3]}, needs > {needed:.3f}) while the proxy "
               f"rose {rise:+.3f} ({k}-step means; {sum(p[2] for p in parts)} gold scores a step): the reward "
               f"is being over-optimised")
        peak = float(self.best[3])  # a rollback restores the weights that sampled this step (`rollback_step`)
        return [Alert(step, self.name, msg, self.cfg.action,
                      {"gold_drop": drop, "proxy_rise": rise, "best_step": peak, "rollback_step": peak})]

    def state_dict(self) -> dict[str, Any]:
        return {"history": [list(h) for h in self.history], "best": self.best, "pending": self.pending,
                "trigger": self.trigger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.clear()
        self.history.extend(tuple(h) for h in state["history"])
        self.best = tuple(state["best"]) if state["best"] is not None else None
        self.pending = state.get("pending")  # absent in checkpoints written before held-out gold
        self.trigger.load_state_dict(state["trigger"])


# ---------------------------------------------------------------------------- the set the loop holds


class Monitors:
    """The enabled monitors, updated together."""

    def __init__(self, monitors: list[Monitor]):
        self.monitors = {m.name: m for m in monitors}

    def update(self, step: int, metrics: dict[str, float], samples: Sequence) -> list[Alert]:
        alerts: list[Alert] = []
        for m in self.monitors.values():
            alerts += m.update(step, metrics, samples)
        return alerts

    def observe_eval(self, step: int, result: dict[str, dict[str, float]]) -> None:
        """Hand the held-out eval of step N (`postrl.evaluation.evaluate`'s result, the weights that
        sample step N) to the monitors that read it, before step N's update."""
        for m in self.monitors.values():
            if isinstance(m, WatchesEval):
                m.observe_eval(step, result)

    def values(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for m in self.monitors.values():
            out.update(m.values)
        return out

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state, by monitor name."""
        return {name: m.state_dict() for name, m in self.monitors.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, s in state.items():
            if name in self.monitors:  # a monitor disabled since the checkpoint just drops its state
                self.monitors[name].load_state_dict(s)


def build_monitors(cfg: MonitorConfig, ctx: MonitorContext | None = None) -> Monitors:
    """The enabled monitors of `cfg` (anything with one attribute per monitor name)."""
    ctx = ctx or MonitorContext()
    built = []
    for name, cls in MONITORS.items():
        settings = getattr(cfg, name)
        ALERT_ACTIONS.check(settings.action, key=f"monitor.{name}.action")
        if settings.enabled:
            built.append(cls(settings, ctx))
    return Monitors(built)
