"""The rollout pipeline: a step's prompts are sampled and scored here, now or ahead of the trainer.

The loop hands each step's prompts to the engine and takes back scored samples:

    for ahead in engine.to_submit(step):        # `step` itself, or step + max_staleness once running
        engine.submit(ahead, tasks, temps)      # the order carries the trainer's current weights
    rollout = engine.take(step)                 # waits for that step's samples, scored

An order for step q is submitted at the start of trainer step q - K (K = pipeline.max_staleness)
and samples with the weights the trainer has then: those after q - K steps. The trainer consumes
it at step q, having made q steps, so every batch is exactly K steps stale (the first K batches
less: they all use the initial weights). Timeline for K = 1 (Si = sample+score batch i with the
weights W after j steps, Ti = train on batch i):

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

State: `state_dict()` drains the orders in flight (waits for their scored samples) and returns
them with the submission counter; a resumed run puts them back as finished rollouts and goes on
submitting from there, so no rollout is lost or made twice and the weights they were sampled with
need not be stored.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from postrl.config import Config
from postrl.policy.policy import Policy
from postrl.policy.rollout import GenParams
from postrl.records import Sample
from postrl.run import step_generator
from postrl.steps import score_samples
from postrl.tasks.base import Task

if TYPE_CHECKING:
    from postrl.policy.update import UpdateStats
    from postrl.run import Run


@dataclass
class Order:
    """One step's prompts, to be sampled and scored by the rollout side."""

    step: int
    tasks: list[Task]
    temperatures: list[float]
    """One per sample (train.temperatures / domain temperatures already applied)."""
    version: int
    """policy.version of the weights to sample with."""
    weights: Any = None
    """Published weights of that version (engine-specific); None = the trainer's own model."""


@dataclass
class Rollout:
    """A step's scored samples and what producing them cost."""

    step: int
    samples: list[Sample]
    sample_s: float
    reward_s: float


def generate(policy: Policy, order: Order, cfg: Config) -> list[Sample]:
    """Sample an order with `policy` (the same call, and the same generator, as the synchronous loop)."""
    t = cfg.train
    gen = GenParams(t.max_new_tokens, t.temperature, t.top_p)
    return policy.sample(order.tasks, t.samples_per_prompt, gen, step_generator(cfg.seed, order.step, 0),
                         order.temperatures)


def timed_score(samples: list[Sample], domains, cfg: Config) -> float:
    t0 = time.perf_counter()
    score_samples(samples, domains, cfg)
    return time.perf_counter() - t0


class Pipeline:
    """Order bookkeeping shared by the engines: what was submitted, what is in flight, what is done,
    staleness metrics and checkpoint state. Subclasses say how an order is run (`_start`) and
    waited for (`_wait`)."""

    def __init__(self, run: Run):
        self.run, self.cfg = run, run.cfg
        self.max_staleness = run.cfg.pipeline.max_staleness
        self.total_steps = run.cfg.train.total_steps
        self.updates_per_step = run.cfg.train.ppo_epochs * run.cfg.train.minibatches
        self.submitted = -1
        """Highest step submitted so far."""
        self.in_flight: dict[int, Any] = {}
        self.done: dict[int, Rollout] = {}
        self._step_metrics: dict[str, float] = {}

    # -- the loop's calls
    def to_submit(self, step: int) -> range:
        """Steps whose orders go out at the start of `step`: up to step + max_staleness."""
        return range(max(self.submitted + 1, step), min(step + self.max_staleness, self.total_steps - 1) + 1)

    def submit(self, step: int, tasks: list[Task], temperatures: list[float]) -> None:
        order = Order(step, tasks, temperatures, self.run.policy.version)
        self.in_flight[step] = self._start(order)
        self.submitted = step

    def take(self, step: int) -> Rollout:
        """The scored samples of `step` (waiting for them if needed), with staleness metrics."""
        t0 = time.perf_counter()
        ready = len(self.done) + sum(self._ready(h) for h in self.in_flight.values())
        rollout = self.done.pop(step, None) or self._wait(self.in_flight.pop(step))
        self._step_metrics = self._staleness(rollout.samples) | {
            "pipeline/wait_s": time.perf_counter() - t0, "pipeline/ready_batches": float(ready),
        }
        return rollout

    def metrics(self, stats: UpdateStats) -> dict[str, float]:
        return self._step_metrics | stats.offpolicy

    # -- checkpoint state
    def state_dict(self) -> dict:
        for step in sorted(self.in_flight):  # drain: in-flight work becomes finished rollouts
            self.done[step] = self._wait(self.in_flight.pop(step))
        return {"submitted": self.submitted, "done": dict(self.done)}

    def load_state_dict(self, state: dict | None, next_step: int) -> None:
        """Back to a checkpoint's pipeline (None: one written by the synchronous loop)."""
        self._discard()
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
        lag = [(self.run.policy.version - s.policy_version) / self.updates_per_step for s in samples]
        if max(lag) > self.max_staleness:  # cannot happen by construction; a bug if it does
            raise RuntimeError(f"staleness {max(lag)} over the bound {self.max_staleness}")
        counts = Counter(round(x) for x in lag)
        m = {"staleness/mean": sum(lag) / len(lag), "staleness/max": max(lag)}
        for k in range(self.max_staleness + 1):
            m[f"staleness/share_{k}"] = counts[k] / len(lag)
        return m


class InlineEngine(Pipeline):
    """max_staleness 0 in this process: the order runs when it is taken, on the trainer's own model.
    This is the synchronous loop; no copy of the model, no thread."""

    def _start(self, order: Order) -> Order:
        return order

    def _wait(self, order: Order) -> Rollout:
        t0 = time.perf_counter()
        samples = generate(self.run.policy, order, self.cfg)
        sample_s = time.perf_counter() - t0
        return Rollout(order.step, samples, sample_s, timed_score(samples, self.run.domains, self.cfg))


class ThreadedEngine(Pipeline):
    """Rollouts in two threads of this process, on a copy of the model: one samples orders in turn,
    the other scores finished batches, so grading batch i overlaps sampling batch i+1 and both
    overlap the trainer. torch releases the GIL inside its kernels, so the threads run in parallel;
    with `split_cores` torch's intra-op threads are halved while the engine runs (restored by
    close): two busy threads that each start a full OpenMP team would oversubscribe the cores.
    At most max_staleness + 1 orders are ever outstanding: that is the queue's bound."""

    def __init__(self, run: Run, split_cores: bool = True):
        super().__init__(run)
        self._torch_threads = torch.get_num_threads()
        if split_cores:  # the trainer and the sampling thread each get half (scoring is light)
            torch.set_num_threads(max(1, self._torch_threads // 2))
        model = copy.deepcopy(run.policy.model).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.rollout_policy = Policy(model, run.policy.tok, run.policy.max_batch)
        self._loaded: dict | None = None  # the published weights the rollout model holds now
        self._published: tuple[int, dict] | None = None
        self._orders: queue.Queue = queue.Queue()
        self._generated: queue.Queue = queue.Queue()
        self._results: dict[int, Rollout | BaseException] = {}
        self._epoch = 0  # bumped by _discard: results of older epochs are dropped
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._generate_loop, name="rollout-generate", daemon=True),
                         threading.Thread(target=self._score_loop, name="rollout-score", daemon=True)]
        for t in self._threads:
            t.start()

    def _start(self, order: Order) -> int:
        order.weights = self._publish()
        self._orders.put((self._epoch, order))
        return order.step

    def _publish(self) -> dict[str, torch.Tensor]:
        """A frozen copy of the trainer's weights, once per version: orders submitted between two
        updates share it, and the trainer's next in-place update does not touch it."""
        version = self.run.policy.version
        if self._published is None or self._published[0] != version:
            weights = {k: v.detach().clone() for k, v in self.run.policy.model.state_dict().items()}
            self._published = (version, weights)
        return self._published[1]

    def _generate_loop(self) -> None:
        while (item := self._orders.get()) is not None:
            epoch, order = item
            try:
                t0 = time.perf_counter()
                if self._loaded is not order.weights:
                    self.rollout_policy.model.load_state_dict(order.weights)
                    self._loaded = order.weights
                self.rollout_policy.version = order.version
                samples = generate(self.rollout_policy, order, self.cfg)
                self._generated.put((epoch, order.step, samples, time.perf_counter() - t0))
            except BaseException as e:  # handed to the trainer, which raises it at take()
                self._deliver(epoch, order.step, e)
        self._generated.put(None)

    def _score_loop(self) -> None:
        while (item := self._generated.get()) is not None:
            epoch, step, samples, sample_s = item
            try:
                self._deliver(epoch, step, Rollout(step, samples, sample_s,
                                                   timed_score(samples, self.run.domains, self.cfg)))
            except BaseException as e:
                self._deliver(epoch, step, e)

    def _deliver(self, epoch: int, step: int, result: Rollout | BaseException) -> None:
        with self._cond:
            if epoch == self._epoch:
                self._results[step] = result
                self._cond.notify_all()

    def _wait(self, step: int) -> Rollout:
        with self._cond:
            self._cond.wait_for(lambda: step in self._results)
            result = self._results.pop(step)
        if isinstance(result, BaseException):
            raise RuntimeError(f"rollout of step {step} failed") from result
        return result

    def _ready(self, step: int) -> bool:
        with self._cond:
            return step in self._results

    def _discard(self) -> None:
        with self._cond:
            self._epoch += 1
            self._results.clear()
        self._published = None  # a restored trainer may reuse a version number with other weights

    def close(self) -> None:
        self._orders.put(None)
        for t in self._threads:
            t.join(timeout=60)
        torch.set_num_threads(self._torch_threads)


def make_local_engine(run: Run) -> Pipeline:
    """engine: local. max_staleness 0 runs inline (the synchronous loop); above, rollout threads;
    with pipeline.source=replay:RUN_DIR, a stored run's rollouts instead of sampling."""
    from postrl.engines.replay import ReplayEngine, replay_dir

    source = replay_dir(run.cfg.pipeline.source)
    if source is not None:
        return ReplayEngine(run, source)
    if run.cfg.pipeline.max_staleness == 0:
        return InlineEngine(run)
    return ThreadedEngine(run)
