"""Replay: train from a stored run's rollouts instead of sampling (`pipeline.source=replay:RUN_DIR`).

Step s trains on the samples that run stored for its step s, with their stored rewards, behaviour
log-probs and policy versions. Whenever a sample's policy version differs from the current
policy's, the learner treats it as stale: it recomputes the log-probs under the current weights
(the proximal policy) and applies decoupled PPO with the truncated importance weight
min(pi_prox / pi_behav, pipeline.is_cap) against the stored behaviour log-probs. This makes
ablations of the update rule run on identical data. Advantages are recomputed from the stored
rewards under the current config. The prompts the loop draws are ignored.
"""

from __future__ import annotations

import time
from pathlib import Path

from postrl.engines.orders import Order, Rollout
from postrl.engines.pipeline import Pipeline
from postrl.errors import UserError
from postrl.learner.batch import check_whole_groups
from postrl.records import Sample
from postrl.store.rollouts import read_rows, shard_steps

PREFIX = "replay:"


def replay_dir(source: str) -> Path | None:
    """The run directory named by `pipeline.source`, or None when the source is live sampling.
    That it is 'replay:RUN_DIR' of a run with stored rollouts is checked with the config's other
    names, before the run starts (`postrl.names`)."""
    return Path(source[len(PREFIX):]) if source else None


class ReplayEngine(Pipeline):
    def __init__(self, policy, domains: dict, cfg, log=print):
        super().__init__(policy, domains, cfg, log)
        self.source = source = replay_dir(cfg.pipeline.source)
        self.steps = set(shard_steps(source))
        missing = [s for s in range(self.total_steps) if s not in self.steps]
        if not self.steps:
            raise UserError(f"replay source {source} holds no rollouts")
        if missing:
            raise UserError(f"replay source {source} has no rollouts for step {missing[0]} "
                            f"(it has steps {min(self.steps)}..{max(self.steps)}); lower train.total_steps")
        self.max_staleness = 0  # nothing is sampled ahead

    def _start(self, order: Order) -> Order:
        return order

    def _wait(self, order: Order) -> Rollout:
        t0 = time.perf_counter()
        rows = sorted(read_rows(self.source, steps=[order.step]), key=lambda r: r.sample)
        samples: list[Sample] = [r.to_sample() for r in rows]
        n = self.cfg.train.samples_per_prompt
        if len(samples) % n:
            raise UserError(f"replay source {self.source} step {order.step} holds {len(samples)} samples, "
                            f"not a multiple of train.samples_per_prompt={n}")
        try:  # a stored run sampled with another samples_per_prompt: its groups would be mixed
            check_whole_groups([s.group for s in samples], n)
        except ValueError as e:
            raise UserError(f"replay source {self.source} step {order.step}: {e}") from None
        return Rollout(order.step, samples, time.perf_counter() - t0, 0.0)

    def _staleness(self, samples: list[Sample]) -> dict[str, float]:
        # stored samples may come from any policy version: report the lag, there is no bound to check
        lag = [(self.policy.version - s.policy_version) / self.updates_per_step for s in samples]
        return {"staleness/mean": sum(lag) / len(lag), "staleness/max": max(lag)}
