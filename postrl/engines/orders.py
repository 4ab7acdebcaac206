"""One order, run: a step's prompts sampled by the policy, each group graded the moment its samples
all exist, and the scored `Rollout`. It knows no queue of orders, no staleness and no checkpoint:
those are the engine's (`postrl.engines.pipeline.Pipeline`), which runs every order through here.

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

Who fills what: the policy makes each `Sample`; `Pending.result` here is the one place that
attaches its `score` and its `timings["reward_s"]`, from the scorer's answer (a scorer grades
samples, or copies of them on another process, and returns scores; it sets nothing).
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Protocol

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
