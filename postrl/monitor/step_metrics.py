"""The metrics of one training step, from its samples and the update's statistics.

    metrics = step_metrics(samples, stats, StepTimes(sample_s, reward_s, update_s, sync_s), kl_coef)

Per step: reward, pass rate, KL, entropy, clip fraction, length, throughput, time per stage,
loss, gradient norm, learning rate, the share of samples the verifier could not grade; per
domain the reward, pass rate, entropy and share of the batch; and what reward functions report
(`reward_fn/...`). The curriculum, the engine and
dynamic sampling report their own metrics (`metrics()` on each); the loop merges them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from postrl.records import Sample

if TYPE_CHECKING:
    from postrl.learner.learner import UpdateStats


@dataclass
class StepTimes:
    sample_s: float
    """Wall seconds of generation of the step's batch."""
    reward_s: float
    """Seconds spent scoring it."""
    update_s: float
    """Seconds of the batch build and update (dynamic sampling's extra rounds excluded)."""
    sync_s: float = 0.0
    """Seconds the sampler spent loading new weights into its backend for the batch (part of sample_s)."""


def step_metrics(samples: list[Sample], stats: UpdateStats, times: StepTimes, kl_coef: float) -> dict[str, float]:
    n_tokens = sum(len(s.completion_ids) for s in samples)
    m = {
        "reward/mean": mean(s.reward for s in samples),
        "pass_rate": mean(bool(s.score and s.score.correct) for s in samples),
        "kl/mean": stats.kl_mean, "kl/max": stats.kl_max, "kl/coef": kl_coef,
        "entropy": stats.entropy, "clip_frac": stats.clip_frac,
        "response_len/mean": n_tokens / len(samples),
        "tokens_per_s": n_tokens / max(times.sample_s, 1e-9),
        "time/sample_s": times.sample_s, "time/reward_s": times.reward_s, "time/update_s": times.update_s,
        "time/sync_s": times.sync_s,
        "loss": stats.loss, "pg_loss": stats.pg_loss, "grad_norm": stats.grad_norm, "lr": stats.lr,
        "verifier/unverified": mean(s.score is not None and s.score.status != "ok" for s in samples),
    }
    for name in sorted({s.task.domain for s in samples}):
        idx = [i for i, s in enumerate(samples) if s.task.domain == name]
        m[f"reward/{name}"] = mean(samples[i].reward for i in idx)
        m[f"pass_rate/{name}"] = mean(bool(samples[i].score and samples[i].score.correct) for i in idx)
        m[f"entropy/{name}"] = mean(stats.sample_entropy[i] for i in idx)
        m[f"batch/{name}"] = len(idx) / len(samples)
    return m | reward_function_metrics(samples) | stats.memory | stats.offpolicy | stats.critic


def reward_function_metrics(samples: list[Sample]) -> dict[str, float]:
    """Each value the samples' scores carry for the step's metrics (`Score.metrics`: a reward
    function's mean where it applied, what it logged with `log_metric`), averaged over the samples
    that carry it, so a function's None is left out of its mean as TRL leaves it out."""
    carried: dict[str, list[float]] = {}
    for s in samples:
        for key, value in (s.score.metrics if s.score is not None else {}).items():
            carried.setdefault(key, []).append(value)
    return {key: mean(values) for key, values in sorted(carried.items())}


def mean(values) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0
