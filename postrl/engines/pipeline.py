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

Within an order, grading overlaps generation. Every engine runs an order through `run_order`:
the sampler tells it about each row the moment that row ends (EOS, stop string, or the last
token), and as soon as all samples of a group exist the group goes to a scorer (a thread here,
the reward actor under Ray), which grades it (verifiers, sandbox runs, reward terms) while the
longer rows and the later generation chunks are still being sampled. The order's Rollout is
complete when its last chunk is scored. One order, g = a group's samples all finished,
Rg = grading it:

    sampling : [ batch of rows ..........g0 g2 ....g1 g3 ]  next order ...
    scoring  :                           R0 R2     R1 R3    (tail_s: after the last row)

The draws do not depend on this (the batches and the generator's calls are those of plain
sampling, and the scorer only reads finished samples), and a sample's verdict does not depend on
which others are graded with it; so samples and scores equal those of scoring after generation.
The threaded engine also lets an order's last groups be graded while the next order samples.
Dynamic sampling's extra draws for step q (`resample`) are orders too, run by the same engine
the same way (per-group scoring included). They are sampled with the trainer's weights at the
moment they are asked for (for K = 0 the step's own weights), with the generator stream
(seed, q, 1 + round), and carry that policy version; so they are fresh samples whatever K is, and
a resumed run draws them again exactly, without storing older weights in the checkpoint.

Who fills what: the policy makes each `Sample`; `Pending.result` here is the one place that
attaches its `score` and its `timings["reward_s"]`, from the scorer's answer (a scorer grades
samples, or copies of them on another process, and returns scores; it sets nothing).

Metrics: `time/reward_s` (scoring seconds, summed over chunks), `time/reward_overlap_s` (the part
that ran while the order was still generating), `time/reward_tail_s` (wall time from the end of
generation until everything was scored), `pipeline/score_chunks`.

State: `state_dict()` drains the orders in flight (waits for their scored samples) and returns
them with the submission counter; a resumed run puts them back as finished rollouts and goes on
submitting from there, so no rollout is lost or made twice and the weights they were sampled with
need not be stored.
"""

from __future__ import annotations

import copy
import functools
import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from postrl.config.schema import Config, generation_limits
from postrl.records import Sample, Score, Task
from postrl.rewards.scoring import score_samples
from postrl.sampling.episodes import EpisodeLimits, sample_episodes
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.seeding import step_generator
from postrl.tasks.env import is_environment


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
    stream: int = 0
    """Generator stream of the (seed, step, stream) draw: 0 the step's batch, 1 + r extra round r."""

    @property
    def key(self) -> tuple[int, int]:
        return self.step, self.stream


@dataclass
class Rollout:
    """A step's scored samples and what producing them cost."""

    step: int
    samples: list[Sample]
    sample_s: float
    """Wall seconds of generation."""
    reward_s: float
    """Seconds spent scoring, summed over the scored chunks."""
    overlap_s: float = 0.0
    """The part of reward_s that ran while generation was still going."""
    tail_s: float = 0.0
    """Wall seconds from the end of generation until the last chunk was scored."""
    chunks: int = 0
    """Score calls: sets of whole groups handed to the scorer as they finished."""
    events: tuple[str, ...] = ()
    """What the rollout side wants logged (a sandbox actor died and its runs were re-queued, ...)."""


@dataclass
class Scored:
    """A scorer's answer for one chunk: a Score and a reward_s share per sample, and when it ran."""

    scores: list[Score]
    reward_s: list[float]
    start: float
    end: float
    """time.time() stamps: comparable across the processes of one machine."""
    events: tuple[str, ...] = ()


class Scorer(Protocol):
    """Grades chunks of whole groups while generation goes on: a thread here, an actor under Ray."""

    def submit(self, samples: list[Sample]) -> Any: ...

    def result(self, job: Any) -> Scored: ...


def reward_terms(cfg: Config) -> dict[str, dict[str, float]]:
    """{domain: {term: weight}}: the recipe's weighted reward terms per domain."""
    return {name: d.reward for name, d in cfg.domains.items()}


def score_chunk(samples: list[Sample], domains, terms: dict[str, dict[str, float]]) -> Scored:
    start = time.time()
    scores, seconds = score_samples(samples, domains, terms)
    return Scored(scores, seconds, start, time.time())


def attach_scores(samples: list[Sample], scored: Scored) -> None:
    """Set each sample's `score` and `timings["reward_s"]` from a scorer's answer: the one place
    that does (through `Pending.result`, or directly for samples scored outside an engine)."""
    for s, score, reward_s in zip(samples, scored.scores, scored.reward_s):
        s.score, s.timings["reward_s"] = score, reward_s


def sample_temperatures(tasks: list[Task], cfg: Config) -> list[float]:
    """One temperature per sample: train.temperatures cycles within each group (multi-temperature
    sampling); otherwise the domain's own temperature, else train.temperature."""
    temps = []
    for task in tasks:
        own = cfg.domains[task.domain].temperature if task.domain in cfg.domains else 0.0
        for j in range(cfg.train.samples_per_prompt):
            if cfg.train.temperatures:
                temps.append(cfg.train.temperatures[j % len(cfg.train.temperatures)])
            else:
                temps.append(own or cfg.train.temperature)
    return temps


class LocalScorer:
    """A thread of this process that scores chunks in the order they are submitted."""

    def __init__(self, domains, terms: dict[str, dict[str, float]]):
        self.domains, self.terms = domains, terms
        self._jobs: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="rollout-score", daemon=True)
        self.thread.start()

    def submit(self, samples: list[Sample]) -> Future:
        job: Future = Future()
        self._jobs.put((job, samples))
        return job

    def result(self, job: Future) -> Scored:
        return job.result()

    def _loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, samples = item
            try:
                job.set_result(score_chunk(samples, self.domains, self.terms))
            except BaseException as e:  # raised where the rollout is collected
                job.set_exception(e)

    def close(self) -> None:
        self._jobs.put(None)
        self.thread.join(timeout=60)


@dataclass
class Pending:
    """A generated order whose chunks may still be being scored; `result()` waits for them."""

    step: int
    samples: list[Sample]
    start: float
    end: float
    """Generation's time.time() stamps."""
    jobs: list[tuple[list[Sample], Any]]
    """(chunk, the scorer's job for it), in submission order."""
    scorer: Scorer

    def done(self) -> bool:
        """Every chunk scored (for a LocalScorer's futures)."""
        return all(job.done() for _, job in self.jobs)

    def result(self) -> Rollout:
        """The scored rollout: every chunk's scores attached to its samples (`attach_scores`)."""
        scored = []
        for chunk, job in self.jobs:
            sc = self.scorer.result(job)
            attach_scores(chunk, sc)
            scored.append(sc)
        return Rollout(
            self.step, self.samples, self.end - self.start,
            reward_s=sum(sc.end - sc.start for sc in scored),
            overlap_s=sum(max(0.0, min(sc.end, self.end) - sc.start) for sc in scored),
            tail_s=max([0.0] + [sc.end - self.end for sc in scored]),
            chunks=len(scored), events=tuple(e for sc in scored for e in sc.events),
        )


def generate(policy: Policy, order: Order, cfg: Config, on_ready=None, envs: dict | None = None) -> list[Sample]:
    """Sample an order with `policy`, from the generator (seed, step, stream): a lost order sampled
    again, or a resumed run, makes the same draws. An order with an environment's tasks among
    `envs` (the run's domains) is played as episodes (`postrl.sampling.episodes`). When some domain
    sets its own max_new_tokens or stop strings the order is sampled in parts
    (`generate_by_limits`); otherwise in one call, so recipes without them draw exactly what they
    always drew."""
    t = cfg.train
    gen = GenParams(t.max_new_tokens, t.temperature, t.top_p)
    generator = step_generator(cfg.seed, order.step, order.stream)
    if envs and any(is_environment(envs.get(task.domain)) for task in order.tasks):
        return sample_episodes(policy, order.tasks, t.samples_per_prompt, envs, functools.partial(episode_limits, cfg),
                               gen, generator, order.temperatures, on_ready=on_ready)
    if any(d.max_new_tokens or d.stop for d in cfg.domains.values()):
        return generate_by_limits(policy, order, cfg, gen, generator, on_ready)
    return policy.sample(order.tasks, t.samples_per_prompt, gen, generator, order.temperatures, on_ready=on_ready)


def generate_by_limits(policy: Policy, order: Order, cfg: Config, gen: GenParams, generator, on_ready=None):
    """One `policy.sample` call per distinct (max_new_tokens, stop strings), in order of first
    appearance, drawing from the one generator in turn. The samples come back part after part,
    their groups numbered on across the parts (a part's groups are renumbered as they finish,
    before anyone sees them), so samples [g*n : (g+1)*n] are still group g."""
    n = cfg.train.samples_per_prompt
    parts: dict[tuple[int, tuple[str, ...]], list[int]] = {}
    for i, task in enumerate(order.tasks):
        parts.setdefault(generation_limits(cfg, task.domain), []).append(i)
    samples: list[Sample] = []
    for (max_new_tokens, stop), idx in parts.items():
        offset = len(samples) // n

        def renumber(ready: list[Sample], offset: int = offset) -> None:
            for s in ready:
                s.group += offset
            if on_ready is not None:
                on_ready(ready)

        temps = [order.temperatures[i * n + j] for i in idx for j in range(n)]
        samples += policy.sample([order.tasks[i] for i in idx], n, replace(gen, max_new_tokens=max_new_tokens,
                                 stop_strings=stop), generator, temps, on_ready=renumber)
    return samples


def episode_limits(cfg: Config, task: Task) -> EpisodeLimits:
    """A task's turn length, stop strings and episode token budget, from its domain's recipe entry."""
    dcfg = cfg.domains.get(task.domain) or cfg.eval.domains.get(task.domain)
    return EpisodeLimits(*generation_limits(cfg, task.domain), max_tokens=dcfg.max_episode_tokens if dcfg else 0)


def run_order(policy: Policy, order: Order, cfg: Config, scorer: Scorer, envs: dict | None = None) -> Pending:
    """Generate an order, handing each set of whole groups to `scorer` the moment its last sample
    finishes. Every engine runs its orders through this call, so in all of them grading overlaps
    the rest of generation; the samples and their draws are those of a plain `generate`. `envs`:
    the domains that open episodes (multi-turn domains play there)."""
    jobs: list[tuple[list[Sample], Any]] = []
    start = time.time()
    samples = generate(policy, order, cfg, on_ready=lambda ready: jobs.append((ready, scorer.submit(ready))),
                       envs=envs)
    return Pending(order.step, samples, start, time.time(), jobs, scorer)


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


class InlineEngine(Pipeline):
    """max_staleness 0 in this process: the order runs when it is taken, on the trainer's own model.
    This is the synchronous loop; no copy of the model. Finished groups are graded by a scoring
    thread while the rest of the batch is generated (`run_order`)."""

    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print):
        super().__init__(policy, domains, cfg, log)
        self.scorer = LocalScorer(domains, reward_terms(cfg))

    def _start(self, order: Order) -> Order:
        return order

    def _wait(self, order: Order) -> Rollout:
        return run_order(self.policy, order, self.cfg, self.scorer, self.domains).result()

    def close(self) -> None:
        self.scorer.close()


class ThreadedEngine(Pipeline):
    """Rollouts in two threads of this process, on a copy of the model: one samples orders in turn,
    the other scores groups as they finish (`run_order`), so grading overlaps the rest of the
    batch, the next batches, and the trainer. torch releases the GIL inside its kernels, so the
    threads run in parallel; with `split_cores` torch's intra-op threads are halved while the
    engine runs (restored by close): two busy threads that each start a full OpenMP team would
    oversubscribe the cores. At most max_staleness + 1 orders are ever outstanding: that is the
    queue's bound."""

    def __init__(self, policy: Policy, domains: dict, cfg: Config, log=print, split_cores: bool = True):
        super().__init__(policy, domains, cfg, log)
        self._torch_threads = torch.get_num_threads()
        if split_cores:  # the trainer and the sampling thread each get half (scoring is light)
            torch.set_num_threads(max(1, self._torch_threads // 2))
        model = copy.deepcopy(policy.model).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        self.rollout_policy = Policy(model, policy.tok, policy.max_batch, rollout=cfg.rollout)
        self._loaded: dict | None = None  # the published weights the rollout model holds now
        self._published: tuple[int, dict] | None = None
        self._orders: queue.Queue = queue.Queue()
        self._results: dict[tuple[int, int], Pending | BaseException] = {}  # by order key
        self._epoch = 0  # bumped by _discard: results of older epochs are dropped
        self._cond = threading.Condition()
        self.scorer = LocalScorer(domains, reward_terms(cfg))
        self._threads = [threading.Thread(target=self._generate_loop, name="rollout-generate", daemon=True),
                         self.scorer.thread]
        self._threads[0].start()

    def _start(self, order: Order) -> tuple[int, int]:
        order.weights = self._publish()
        self._orders.put((self._epoch, order))
        return order.key

    def _publish(self) -> dict[str, torch.Tensor]:
        """A frozen copy of the trainer's weights, once per version: orders submitted between two
        updates share it, and the trainer's next in-place update does not touch it."""
        version = self.policy.version
        if self._published is None or self._published[0] != version:
            weights = {k: v.detach().clone() for k, v in self.policy.model.state_dict().items()}
            self._published = (version, weights)
        return self._published[1]

    def _generate_loop(self) -> None:
        while (item := self._orders.get()) is not None:
            epoch, order = item
            try:
                if self._loaded is not order.weights:  # once per published version
                    self.rollout_policy.load_weights(order.weights, order.version)
                    self._loaded = order.weights
                # delivered generated; its last groups may still be scoring while the next order samples
                self._deliver(epoch, order.key, run_order(self.rollout_policy, order, self.cfg, self.scorer,
                                                          self.domains))
            except BaseException as e:  # handed to the trainer, which raises it at take()
                self._deliver(epoch, order.key, e)

    def _deliver(self, epoch: int, key: tuple[int, int], result: Pending | BaseException) -> None:
        with self._cond:
            if epoch == self._epoch:
                self._results[key] = result
                self._cond.notify_all()

    def _wait(self, key: tuple[int, int]) -> Rollout:
        with self._cond:
            self._cond.wait_for(lambda: key in self._results)
            result = self._results.pop(key)
        try:
            if isinstance(result, BaseException):
                raise result
            return result.result()
        except BaseException as e:
            raise RuntimeError(f"rollout of step {key[0]} failed") from e

    def _ready(self, key: tuple[int, int]) -> bool:
        with self._cond:
            result = self._results.get(key)
        return isinstance(result, BaseException) or (result is not None and result.done())

    def _discard(self) -> None:
        with self._cond:
            self._epoch += 1
            self._results.clear()
        self._published = None  # a restored trainer may reuse a version number with other weights

    def close(self) -> None:
        self._orders.put(None)
        self._threads[0].join(timeout=60)
        self.scorer.close()
        self.rollout_policy.close()
        torch.set_num_threads(self._torch_threads)


def make_local_engine(policy: Policy, domains: dict, cfg: Config, log=print) -> Pipeline:
    """engine: local. max_staleness 0 runs inline (the synchronous loop); above, rollout threads.
    (pipeline.source=replay:RUN_DIR replays a stored run instead: `postrl.engines.replay`.)"""
    if cfg.pipeline.max_staleness == 0:
        return InlineEngine(policy, domains, cfg, log)
    return ThreadedEngine(policy, domains, cfg, log)
