"""The `proxy_gold` monitor: reward-model over-optimisation, the proxy rising while the gold falls.
It reads the samples' reward and `gold` component and, alone of the built-ins, the held-out eval
too (`observe_eval`: `postrl.monitor.base.WatchesEval`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from postrl.monitor.alerts import Alert
from postrl.monitor.base import MonitorContext, Trigger, register_monitor
from postrl.monitor.settings import HELDOUT_AUTO, ProxyGoldConfig


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
