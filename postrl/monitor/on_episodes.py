"""Monitors that read the step's episodes, the tool calls multi-turn samples made: tool_loop and
tool_errors. What each reads and when it fires: the table in `postrl.monitor.monitors`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from postrl.monitor.alerts import Alert
from postrl.monitor.base import MonitorContext, Trigger, register_monitor, slope
from postrl.monitor.settings import ToolErrorsConfig, ToolLoopConfig


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
        rise = slope(list(self.history)) * (len(self.history) - 1) if full else 0.0
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
