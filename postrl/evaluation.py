"""Held-out evaluation: greedy accuracy and unbiased pass@k per domain, and the sampled replies' mean reward.

    {"arith": {"greedy": 0.31, "pass@1": 0.42, "pass@8": 0.93, "n_problems": 200, "samples_per_problem": 16,
               "reward_mean": 0.42, "reward_sem": 0.0087, "n_scored": 3200}}

`reward_mean` is over the sampled replies the verifier could grade (`n_scored` of them), with its
standard error `reward_sem`; for a verifier that pays 0 or 1 it is pass@1 (up to the unverified). The
`proxy_gold` monitor pools it, for an eval-only domain graded by a gold scorer, with the gold of the
trained samples (`postrl.monitor.monitors.ProxyGold`).
"""

from __future__ import annotations

import math

import torch

from postrl.algo.passk import pass_at_k
from postrl.records import Sample, Score
from postrl.registry import Registry
from postrl.sampling.episodes import EpisodeLimits, sample_episodes
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.tasks.base import Domain
from postrl.tasks.env import is_environment
from postrl.ui import Progress

EVAL_AGGREGATES = Registry("eval aggregate", key="eval.best_aggregate")
"""How the domains' `eval.best_metric` values combine into the best-checkpoint score."""


@EVAL_AGGREGATES.register("mean")
def mean_over_domains(values: list[float]) -> float:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else 0.0


@EVAL_AGGREGATES.register("min")
def worst_domain(values: list[float]) -> float:
    """The worst domain's score: a checkpoint is only as good as its weakest domain."""
    return min(values, default=0.0)


def count_correct(
    policy: Policy, domain: Domain, tasks: list, samples_per_problem: int, temperature: float,
    max_new_tokens: int, seed: int = 0, stop: tuple[str, ...] = (),
) -> tuple[list[bool], list[int]]:
    """Per problem: is the greedy answer correct, and how many of `samples_per_problem` samples are.
    An environment's problems are played as episodes (tools, feedback turns), as in training."""
    greedy_ok, sampled, scores = grade_heldout(policy, domain, tasks, samples_per_problem, temperature,
                                               max_new_tokens, seed, stop)
    return greedy_ok, per_problem_correct(sampled, scores, len(tasks))


def grade_heldout(
    policy: Policy, domain: Domain, tasks: list, samples_per_problem: int, temperature: float,
    max_new_tokens: int, seed: int = 0, stop: tuple[str, ...] = (),
) -> tuple[list[bool], list[Sample], list[Score]]:
    """(greedy answer correct, per problem; the sampled replies; their scores)."""
    _, greedy = play(policy, domain, tasks, 1, GenParams(max_new_tokens, greedy=True, stop_strings=stop))
    gen = torch.Generator().manual_seed(seed)
    sampled, scores = play(policy, domain, tasks, samples_per_problem,
                           GenParams(max_new_tokens, temperature=temperature, stop_strings=stop), gen)
    return [bool(s.correct) for s in greedy], sampled, scores


def per_problem_correct(sampled: list[Sample], scores: list[Score], problems: int) -> list[int]:
    """How many sampled replies of each problem are correct."""
    correct = [0] * problems
    for s, sc in zip(sampled, scores):
        correct[s.group] += bool(sc.correct)
    return correct


def reward_stats(scores: list[Score]) -> dict[str, float]:
    """Mean reward of the graded scores (status ok), its standard error, and their count.

        >>> stats = reward_stats([Score(1.0, True), Score(0.0, False), Score(1.0, True), Score(0.0, None, "timeout")])
        >>> round(stats["reward_mean"], 6), round(stats["reward_sem"], 6), stats["n_scored"]
        (0.666667, 0.333333, 3)

    (mean 2/3; sample variance ((1/3)^2 x 2 + (2/3)^2) / 2 = 1/3; standard error sqrt(1/3 / 3) = 1/3.)"""
    rewards = [sc.reward for sc in scores if sc.status == "ok"]
    n = len(rewards)
    mean = sum(rewards) / n if n else 0.0
    var = sum((r - mean) ** 2 for r in rewards) / (n - 1) if n > 1 else 0.0
    return {"reward_mean": mean, "reward_sem": math.sqrt(var / n) if n else 0.0, "n_scored": n}


def play(policy: Policy, domain: Domain, tasks: list, n: int, params: GenParams,
         generator: torch.Generator | None = None) -> tuple[list, list]:
    """(samples, scores): n samples per task, graded; episodes when `domain` is an environment."""
    if not is_environment(domain):
        samples = policy.sample(tasks, n, params, generator)
        return samples, domain.score([s.task for s in samples], [s.response for s in samples])
    limits = EpisodeLimits(params.max_new_tokens, params.stop_strings)
    samples = sample_episodes(policy, tasks, n, {t.domain: domain for t in tasks}, lambda _: limits, params, generator)
    return samples, domain.score_episodes([s.task for s in samples], [s.response for s in samples],
                                          [s.episode for s in samples])


def evaluate_domain(
    policy: Policy,
    domain: Domain,
    num_problems: int,
    ks: list[int],
    samples_per_problem: int,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
    stop: tuple[str, ...] = (),
) -> dict[str, float]:
    tasks = domain.heldout(num_problems)
    greedy_ok, sampled, scores = grade_heldout(policy, domain, tasks, samples_per_problem, temperature,
                                               max_new_tokens, seed, stop)
    correct = per_problem_correct(sampled, scores, len(tasks))
    result = {"greedy": sum(greedy_ok) / len(tasks)}
    for k in ks:
        result[f"pass@{k}"] = sum(pass_at_k(samples_per_problem, c, k) for c in correct) / len(tasks)
    result["n_problems"] = len(tasks)
    result["samples_per_problem"] = samples_per_problem
    return result | reward_stats(scores)


def evaluate(
    policy: Policy, domains: dict[str, Domain], limits: dict[str, tuple[int, tuple[str, ...]]] | None = None,
    progress: Progress | None = None, **kwargs,
) -> dict[str, dict[str, float]]:
    """`evaluate_domain` for each domain; `limits` gives a domain its own (max_new_tokens, stop
    strings) in place of kwargs' max_new_tokens (`postrl.config.generation_limits`). `progress`,
    when given (not while training: its bar is live), counts the domains done, with an ETA."""
    limits = limits or {}
    result = {}
    for name, d in domains.items():
        if progress is not None:
            progress.update(len(result), f"{name}...")
        own = dict(zip(("max_new_tokens", "stop"), limits[name])) if name in limits else {}
        result[name] = evaluate_domain(policy, d, **(kwargs | own))
        if progress is not None:
            progress.update(len(result), f"{name}: greedy {result[name]['greedy']:.3f}")
    return result
