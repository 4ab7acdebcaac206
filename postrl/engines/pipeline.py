"""The rollout pipeline: a step's prompts are sampled and scored here, now or ahead of the trainer.

The loop hands each step's prompts to the engine and takes back scored samples:

    for ahead in engine.to_submit(step):        # `step` itself, or step + max_staleness once running
        engine.submit(ahead, tasks)             # the order carries the trainer's current weights
    rollout = engine.take(step)                 # waits for that step's samples, scored
    more = engine.resample(step, round, tasks)  # dynamic sampling's extra draws, sampled and scored now

An order for step q is submitted at the start of trainer step q - K (K = pipeline.max_staleness)
and samples with the weights the trainer has then: those after q - K steps. The trainer consumes
it at step q, having made q steps, so every batch is exactly K steps stale (the first K batches
less: they all use the initial weights). Timeline for K = 1 (Si = sample+score batch i with the
weights Wj after j steps, Ti = train on batch i):

    rollout side : S0(W0) S1(W0)  | S2(W1)       | S3(W2)       | ...
    trainer      :        T0      | T1           | T2           | ...
                   ^ submit 0, 1  ^ submit 2 (W1) ^ submit 3 (W2)
                                    T1 trains W1 on S1(W0): 1 step stale

Weights reach the rollout side at submit time, and only there: an order carries a reference to a
published copy of the weights of that moment (a state-dict snapshot here, a Ray object for the
Ray engine); the rollout worker loads it before sampling that order if it differs from what it
holds. Nothing about the result depends on thread timing: tasks are drawn by the trainer in step
order, each order's sampling generator is seeded by (seed, step, 0), and each order's weights are
fixed when it is submitted. So a run is reproducible at any K, K = 0 is the synchronous loop, and
a lost order can be sampled again with the identical outcome (the Ray engine's fault handling).

Dynamic sampling's extra draws for step q (`resample`) are orders too, run by the same engine
the same way (per-group scoring included). They are sampled with the trainer's weights at the
moment they are asked for (for K = 0 the step's own weights), with the generator stream
(seed, q, 1 + round), and carry that policy version; so they are fresh samples whatever K is, and
a resumed run draws them again exactly, without storing older weights in the checkpoint.

Here: the `Pipeline` base, the bookkeeping every engine shares (orders submitted, in flight and
done, staleness metrics, checkpoint state). One order's sampling and grading, and the records an
order makes (`Order`, `Rollout`), are `postrl.engines.orders`; the engines themselves are
`postrl.engines.local` (inline, threads), `processes` (sampler processes) and `ray_engine`.

Metrics: `time/reward_s` (scoring seconds, summed over chunks), `time/reward_overlap_s` (the part
that ran while the order was still generating), `time/reward_tail_s` (wall time from the end of
generation until everything was scored), `pipeline/score_chunks`.

State: `state_dict()` drains the orders in flight (waits for their scored samples) and returns
them with the submission counter; a resumed run puts them back as finished rollouts and goes on
submitting from there, so no rollout is lost or made twice and the weights they were sampled with
need not be stored.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from postrl.config.schema import Config
from postrl.engines.orders import Order, Rollout, sample_temperatures
from postrl.records import Sample, Task
from postrl.sampling.policy import Policy


class Pipeline:
    """Order bookkeeping shared by the engines: what was submitted, what is in flight, what is done,
    staleness metrics and checkpoint state. Subclasses say how an order is run (`_start`) and
    waited for (`_wait`). An engine knows the policy, the domains, the config and a log."""

    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print):
        self.policy, self.domains, self.cfg, self.log = policy, domains, cfg, log
        self.max_staleness = cfg.pipeline.max_staleness
        self.total_steps = cfg.train.total_steps
        self.updates_per_step = cfg.train.ppo_epochs * cfg.train.minibatches
        self.submitted = -1
        """Highest step submitted so far."""
        self.in_flight: dict[int, Any] = {}
        self.done: dict[int, Rollout] = {}
        self._step_metrics: dict[str, float] = {}

    # -- the loop's calls
    def to_submit(self, step: int) -> range:
        """Steps whose orders go out at the start of `step`: up to step + max_staleness."""
        return range(max(self.submitted + 1, step), min(step + self.max_staleness, self.total_steps - 1) + 1)

    def submit(self, step: int, tasks: list[Task]) -> None:
        order = Order(step, tasks, sample_temperatures(tasks, self.cfg), self.policy.version)
        self.in_flight[step] = self._start(order)
        self.submitted = step

    def take(self, step: int) -> Rollout:
        """The scored samples of `step` (waiting for them if needed), with staleness metrics."""
        t0 = time.perf_counter()
        ready = len(self.done) + sum(self._ready(h) for h in self.in_flight.values())
        rollout = self.done.pop(step, None) or self._wait(self.in_flight.pop(step))
        for event in rollout.events:
            self.log(event)
        self._step_metrics = self._staleness(rollout.samples) | {
            "pipeline/wait_s": time.perf_counter() - t0, "pipeline/ready_batches": float(ready),
            "pipeline/score_chunks": float(rollout.chunks),
            # scoring that ran while the order was still generating, and what it added after
            "time/reward_overlap_s": rollout.overlap_s, "time/reward_tail_s": rollout.tail_s,
        }
        return rollout

    def resample(self, step: int, round_: int, tasks: list[Task]) -> Rollout:
        """Dynamic sampling's extra round `round_` (1, 2, ...) for `step`: sampled now with the
        trainer's weights and scored, by this engine, as any order."""
        order = Order(step, tasks, sample_temperatures(tasks, self.cfg), self.policy.version, stream=1 + round_)
        rollout = self._wait(self._start(order))
        for event in rollout.events:
            self.log(event)
        return rollout

    def metrics(self) -> dict[str, float]:
        """The step's engine metrics; reading them changes nothing (the run then calls `metrics_recorded`)."""
        return dict(self._step_metrics)

    def metrics_recorded(self) -> None:
        """The run recorded a step's metrics: sums over a step's work (an engine's own) start again."""

    # -- checkpoint state
    def state_dict(self) -> dict:
        for step in sorted(self.in_flight):  # drain: in-flight work becomes finished rollouts
            self.done[step] = self._wait(self.in_flight.pop(step))
        return {"submitted": self.submitted, "done": dict(self.done)}

    def load_state_dict(self, state: dict | None, next_step: int) -> None:
        """Back to a checkpoint's pipeline (None: one written by the synchronous loop)."""
        self._discard()
        # the restore wrote the trainer's weights in place, perhaps under a version number its
        # sampling backend has loaded before (inline orders and eval sample with them): load again
        self.policy.load_weights(None, self.policy.version)
        self.in_flight.clear()
        state = state or {"submitted": next_step - 1, "done": {}}
        self.submitted, self.done = state["submitted"], dict(state["done"])

    def close(self) -> None:
        pass

    # -- engine-specific
    def _start(self, order: Order) -> Any:
        raise NotImplementedError

    def _wait(self, handle: Any) -> Rollout:
        raise NotImplementedError

    def _ready(self, handle: Any) -> bool:
        return False

    def _discard(self) -> None:
        """Forget the orders in flight (a rollback or resume is about to replace them)."""

    def _staleness(self, samples: list[Sample]) -> dict[str, float]:
        """Trainer steps between each sample's weights and the weights about to train on it."""
        lag = [(self.policy.version - s.policy_version) / self.updates_per_step for s in samples]
        if max(lag) > self.max_staleness:  # cannot happen by construction; a bug if it does
            raise RuntimeError(f"staleness {max(lag)} over the bound {self.max_staleness}")
        counts = Counter(round(x) for x in lag)
        m = {"staleness/mean": sum(lag) / len(lag), "staleness/max": max(lag)}
        for k in range(self.max_staleness + 1):
            m[f"staleness/share_{k}"] = counts[k] / len(lag)
        return m
