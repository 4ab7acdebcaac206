"""Scoring a step's samples: each domain grades its own samples in one batched call, then the
recipe's weighted reward terms for that domain are applied (`postrl.rewards.composite`).

    scores, reward_s = score_samples(samples, domains, reward_terms)

A domain with a `gold` scorer (`domains.NAME.gold`, for monitoring only) has it graded too, after
the reward is made: its value is the component `gold`, which no reward term can weight.

Pure with respect to the samples: it reads their tasks and responses and returns one `Score` and
one share of the grading seconds per sample, in order; it sets nothing on them. The engine that
ran the samples is the one that attaches the scores (`postrl.engines.orders.Pending.result`),
whether the grading ran in a thread here or on a Ray actor that graded copies.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from postrl.abilities import DeclaresComponents, ScoresEpisodes, WithGold
from postrl.records import Sample, Score
from postrl.rewards.composite import apply_terms

GOLD = "gold"
"""The component a domain's monitoring-only gold scorer fills (`domains.NAME.gold`)."""


def score_samples(
    samples: list[Sample], domains: dict[str, Any], reward_terms: dict[str, dict[str, float]],
) -> tuple[list[Score], list[float]]:
    """(Score, seconds) per sample; `reward_terms` is {domain: {term: weight}} (empty: the domain's
    own reward). The seconds are each domain call's time shared equally among its samples."""
    by_domain: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by_domain.setdefault(s.task.domain, []).append(i)
    scores: list[Score | None] = [None] * len(samples)
    seconds = [0.0] * len(samples)
    for name, idx in by_domain.items():
        t0 = time.perf_counter()
        tasks, responses = [samples[i].task for i in idx], [samples[i].response for i in idx]
        domain = domains[name]
        graded = trained_reward(domain, reward_terms.get(name, {}), tasks, responses,
                                episodes=[samples[i].episode for i in idx])
        if isinstance(domain, WithGold) and domain.gold is not None:  # monitoring only: added after the reward
            graded = with_gold(domain.gold, tasks, responses, graded)
        share = (time.perf_counter() - t0) / len(idx)
        for i, score in zip(idx, graded):
            scores[i], seconds[i] = score, share
    return scores, seconds


def trained_reward(domain: Any, weights: dict[str, float], tasks: list, responses: list,
                   episodes: list | None = None) -> list[Score]:
    """What a run trains on for one domain's replies: its verifier (an environment's own verdict,
    given the `episodes` that produced them), then the recipe's weighted reward terms. Training,
    `postrl score` and `postrl reward-check` all grade through this one call."""
    if episodes is not None and isinstance(domain, ScoresEpisodes):
        graded = domain.score_episodes(tasks, responses, episodes)
    else:
        graded = domain.score(tasks, responses)
    components = domain.reward_components if isinstance(domain, DeclaresComponents) else None  # names it may return
    return apply_terms(weights, tasks, responses, graded, components=components)


def with_gold(gold, tasks: list, responses: list, scores: list[Score]) -> list[Score]:
    """`scores` with the gold scorer's reward as the component `gold` (left out where it could not
    verify); reward, verdict and status are the trained reward's, untouched."""
    verdicts = gold.score(tasks, responses)
    return [replace(s, components={**s.components, GOLD: g.reward}) if g.status == "ok" else s
            for s, g in zip(scores, verdicts, strict=True)]
