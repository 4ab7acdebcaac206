"""Held-out evaluation: greedy accuracy and unbiased pass@k per domain, and the sampled replies' mean reward.

    {"arith": {"greedy": 0.31, "pass@1": 0.42, "pass@8": 0.93, "n_problems": 200, "samples_per_problem": 16,
               "reward_mean": 0.42, "reward_sem": 0.0087, "n_scored": 3200}}

`reward_mean` is over the sampled replies the verifier could grade (`n_scored` of them), with its
standard error `reward_sem`; for a verifier that pays 0 or 1 it is pass@1 (up to the unverified). The
`proxy_gold` monitor pools it, for an eval-only domain graded by a gold scorer, with the gold of the
trained samples (`postrl.monitor.proxy_gold.ProxyGold`).
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
    max_new_tokens: int, seed: int = 0, stop: tuple[str, ...] = (), greedy: bool = True,
) -> tuple[list[bool], list[int]]:
    """Per problem: is the greedy answer correct ([] with `greedy` False: not sampled), and how many
    of `samples_per_problem` samples are. An environment's problems are played as episodes (tools,
    feedback turns), as in training."""
    greedy_ok, sampled, scores = grade_heldout(policy, domain, tasks, samples_per_problem, temperature,
                                               max_new_tokens, seed, stop, greedy)
    return greedy_ok, per_problem_correct(sampled, scores, len(tasks))


def grade_heldout(
    policy: Policy, domain: Domain, tasks: list, samples_per_problem: int, temperature: float,
    max_new_tokens: int, seed: int = 0, stop: tuple[str, ...] = (), greedy: bool = True,
) -> tuple[list[bool], list[Sample], list[Score]]:
    """(greedy answer correct, per problem, or [] without `greedy`; the sampled replies; their
    scores). The samples draw from their own generator seeded with `seed`, so they are the same
    with or without the greedy pass before them: a caller that reads pass@k alone skips it."""
    greedy_ok = []
    if greedy:
        _, replies = play(policy, domain, tasks, 1, GenParams(max_new_tokens, greedy=True, stop_strings=stop))
        greedy_ok = [bool(s.correct) for s in replies]
    gen = torch.Generator().manual_seed(seed)
    sampled, scores = play(policy, domain, tasks, samples_per_problem,
                           GenParams(max_new_tokens, temperature=temperature, stop_strings=stop), gen)
    return greedy_ok, sampled, scores


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
    return domain_result(greedy_ok, per_problem_correct(sampled, scores, len(tasks)), scores, ks, samples_per_problem)


def domain_result(greedy_ok: list[bool], correct: list[int], scores: list[Score], ks: list[int],
                  samples_per_problem: int) -> dict[str, float]:
    """A domain's eval record from its problems' greedy verdicts and correct sample counts."""
    result = {"greedy": sum(greedy_ok) / len(greedy_ok)}
    for k in ks:
        result[f"pass@{k}"] = sum(pass_at_k(samples_per_problem, c, k) for c in correct) / len(correct)
    result["n_problems"] = len(greedy_ok)
    result["samples_per_problem"] = samples_per_problem
    return result | reward_stats(scores)


def evaluate(
    policy: Policy, domains: dict[str, Domain], limits: dict[str, tuple[int, tuple[str, ...]]] | None = None,
    progress: Progress | None = None, **kwargs,
) -> dict[str, dict[str, float]]:
    """Each domain's `evaluate_domain` record; `limits` gives a domain its own (max_new_tokens, stop
    strings) in place of kwargs' max_new_tokens (`postrl.config.schema.generation_limits`). `progress`,
    when given (not while training: its bar is live), counts the domains done, with an ETA.

    The single-turn domains are sampled together: every domain's greedy and sampled replies in one
    batch (`held_out_together`), so a few problems of each of several domains cost one decode
    loop, not two a domain. An environment's problems are played as episodes, domain by domain."""
    limits = limits or {}
    own = {name: dict(zip(("max_new_tokens", "stop"), limits[name])) if name in limits else {} for name in domains}
    single = {name: d for name, d in domains.items() if not is_environment(d)}
    result = held_out_together(policy, single, own, progress, **kwargs) if single else {}
    for name, d in domains.items():
        if name not in single:
            if progress is not None:
                progress.update(len(result), f"{name}...")
            result[name] = evaluate_domain(policy, d, **(kwargs | own[name]))
            if progress is not None:
                progress.update(len(result), f"{name}: greedy {result[name]['greedy']:.3f}")
    return {name: result[name] for name in domains}


def held_out_together(
    policy: Policy, domains: dict[str, Domain], own: dict[str, dict], progress: Progress | None, *,
    num_problems: int, ks: list[int], samples_per_problem: int, temperature: float, max_new_tokens: int,
    seed: int = 0, stop: tuple[str, ...] = (),
) -> dict[str, dict[str, float]]:
    """`evaluate_domain`'s records for single-turn domains, their replies sampled in one
    `policy.sample` call: per problem one greedy reply and `samples_per_problem` at `temperature`,
    each domain with its own token limit and stop strings (`own[name]`), the draws from one
    generator seeded with `seed`."""
    rows: list[tuple[str, int, bool]] = []  # (domain, problem, greedy) of each reply
    tasks, params, held = [], [], {}
    for name, domain in domains.items():
        held[name] = domain.heldout(num_problems)
        limit = own[name].get("max_new_tokens", max_new_tokens)
        stops = tuple(own[name].get("stop", stop))
        greedy = GenParams(limit, greedy=True, stop_strings=stops)
        sampled = GenParams(limit, temperature=temperature, stop_strings=stops)
        for i, task in enumerate(held[name]):
            for p in [greedy] + [sampled] * samples_per_problem:
                rows.append((name, i, p.greedy))
                tasks.append(task)
                params.append(p)
    left = {name: sum(1 for r in rows if r[0] == name) for name in domains}

    def count(ready: list[Sample]) -> None:  # the progress bar: a domain is done when its last reply is
        for s in ready:
            name = rows[s.group][0]
            left[name] -= 1
            if not left[name]:
                progress.update(sum(1 for n in left.values() if not n), f"{name}: sampled")

    samples = policy.sample(tasks, 1, params, torch.Generator().manual_seed(seed),
                            on_ready=count if progress is not None else None)
    result = {}
    for name, domain in domains.items():
        mine = [j for j, r in enumerate(rows) if r[0] == name]
        scores = domain.score([samples[j].task for j in mine], [samples[j].response for j in mine])
        greedy_ok = [False] * len(held[name])
        correct, sampled_scores = [0] * len(held[name]), []
        for j, sc in zip(mine, scores):
            _, i, is_greedy = rows[j]
            if is_greedy:
                greedy_ok[i] = bool(sc.correct)
            else:
                correct[i] += bool(sc.correct)
                sampled_scores.append(sc)
        result[name] = domain_result(greedy_ok, correct, sampled_scores, ks, samples_per_problem)
        if progress is not None:
            progress.update(len(result), f"{name}: greedy {result[name]['greedy']:.3f}")
    return result
