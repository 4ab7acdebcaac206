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

Each lives with the others that read what it reads: `postrl.monitor.on_metrics`, `on_samples`,
`on_episodes`, and `proxy_gold` (samples and the held-out eval). What they share (`Monitor`,
`Trigger`, `MONITORS`, `register_monitor`) is `postrl.monitor.base`; this module is the set the run
holds, and importing it registers the built-ins. Their settings (`MonitorConfig`, one dataclass
per monitor) are in `postrl.monitor.settings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from postrl.monitor import on_episodes, on_metrics, on_samples, proxy_gold  # noqa: F401  (each registers its monitors)
from postrl.monitor.alerts import ALERT_ACTIONS, Alert
from postrl.monitor.base import (  # noqa: F401  (MONITORS, with the built-ins in; register_monitor for extensions)
    MONITORS,
    Monitor,
    MonitorContext,
    WatchesEval,
    register_monitor,
)
from postrl.monitor.settings import MonitorConfig

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
