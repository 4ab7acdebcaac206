"""Monitors that read the step's samples, their rewards, tokens and text: format_share, repetition
and test_tampering. What each reads and when it fires: the table in `postrl.monitor.monitors`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from postrl.monitor.alerts import Alert
from postrl.monitor.base import MonitorContext, Trigger, register_monitor
from postrl.monitor.settings import FormatShareConfig, RepetitionConfig, TamperingConfig


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
