"""Composite rewards: a domain's verdict plus weighted, named terms, declared in the recipe.

    domains:
      code:
        reward: {compiles: 0.2, tests: 0.8, penalty_timeout: -1.0}
      gsm:
        reward: {reward: 1.0, format_boxed: 0.1, overlong: -0.5}

The trainer calls, after the domain has scored a batch,

    scores = apply_terms(cfg.domains[name].reward, tasks, responses, scores, timings=step_timings)

A term name is either a component the domain's own verifier returns in `Score.components`
(code: compiles, tests, penalty_*; arith/math: correct), the pseudo-term `reward` (the domain's
own reward), or a shaping term registered by name in `postrl.rewards.terms` and computed from
(task, response): `format_boxed`, `format_answer_tag`, `format_think_answer`, `overlong`, `math`,
... (importing this module registers those built-in ones). A component of the domain wins over a
registered term of the same name.

The result keeps every term's unweighted value in `components` (so each is logged separately),
sets `reward` to the weighted sum, and leaves `correct`, `status` and `detail` untouched: a
verifier timeout stays a timeout even when shaping terms give the sample a non-zero reward.
Empty weights return the domain's scores unchanged.

A term (or the domain's own reward) whose status is `not_applicable` (a TRL reward function's None)
is left out: of the sum and of `components`. A sample that no weighted term applies to has status
`not_applicable` and no verdict: unverified, zero advantage, as TRL leaves such a sample out of its
group's baseline. What the terms logged (`Score.logged`, `Score.metrics`) goes with the result.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import replace

import postrl.rewards.extract  # noqa: F401  (registers the term `format`)
import postrl.rewards.format  # noqa: F401  (registers the format and shaping terms)
import postrl.rewards.math  # noqa: F401  (registers the term `math`)
from postrl.errors import UserError
from postrl.records import NOT_APPLICABLE, Score
from postrl.rewards.terms import OWN_REWARD, TERMS


def check_terms(weights: dict[str, float], components: Collection[str]) -> None:
    """Raise UserError naming every weight that is neither a component nor a registered term."""
    unknown = [n for n in weights if n != OWN_REWARD and n not in TERMS and n not in components]
    if unknown:
        valid = sorted({OWN_REWARD, *TERMS.names(), *components})
        raise UserError(
            f"unknown reward term{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"valid: {', '.join(valid)}"
        )


def apply_terms(
    weights: dict[str, float],
    tasks: Sequence,
    responses: Sequence,
    scores: Sequence[Score],
    *,
    components: Collection[str] | None = None,
    timings: dict[str, float] | None = None,
) -> list[Score]:
    """Weighted sum of named terms per response; see the module docstring.

    components: the component names the domain's verifier can return. When None, the names
        present in this batch's scores are used, so a component that no score in the batch
        carries (say, a penalty that never fired) is then reported as unknown unless some score
        could not be verified.
    timings: when given, receives the seconds spent computing each term (`reward_<term>_s`).
    """
    if not weights:
        return list(scores)
    if not len(tasks) == len(responses) == len(scores):
        raise ValueError("apply_terms needs one task, response and score per sample")
    seen = {n for s in scores for n in s.components}
    declared = seen if components is None else set(components) | seen
    if components is not None or all(s.status == "ok" for s in scores):
        check_terms(weights, declared)
    values = {name: _term_values(name, declared, tasks, responses, scores, timings) for name in weights}
    return [_combine(weights, s, {name: vals[i] for name, vals in values.items()}) for i, s in enumerate(scores)]


def _combine(weights: dict[str, float], own: Score, terms: dict[str, Score]) -> Score:
    applied = {name: t for name, t in terms.items() if t.status != NOT_APPLICABLE}
    reward = sum(weights[name] * t.reward for name, t in applied.items())
    status, detail, correct = own.status, own.detail, own.correct
    if status == NOT_APPLICABLE and applied:  # the verifier does not apply, a weighted term does
        status, detail = "ok", ""
    if status == "ok" and not applied:
        status, correct = NOT_APPLICABLE, None
        detail = "; ".join(f"{name}: {t.detail}" for name, t in terms.items())
    failed = [(name, t) for name, t in applied.items() if t.status != "ok"]
    if status == "ok" and failed:
        status = failed[0][1].status
        detail = "; ".join(f"{name}: {t.status} {t.detail}".strip() for name, t in failed)
    components = {**own.components, **{name: t.reward for name, t in applied.items()}}
    logged, metrics = dict(own.logged), dict(own.metrics)
    for t in terms.values():
        logged.update(t.logged)
        metrics.update(t.metrics)
    return replace(own, reward=float(reward), correct=correct, status=status, detail=detail,
                   components=components, logged=logged, metrics=metrics)


def _term_values(name, declared, tasks, responses, scores, timings) -> list[Score]:
    t0 = time.perf_counter()
    if name == OWN_REWARD:
        vals = [Score(s.reward, s.correct, NOT_APPLICABLE if s.status == NOT_APPLICABLE else "ok") for s in scores]
    elif name in declared or name not in TERMS:
        # a component absent from one score (e.g. a verifier error) contributes nothing
        vals = [Score(float(s.components.get(name, 0.0)), None) for s in scores]
    else:
        vals = [v if isinstance(v, Score) else Score(float(v), None) for v in TERMS.get(name)(tasks, responses)]
        if len(vals) != len(scores):
            raise ValueError(f"reward term {name!r} returned {len(vals)} values for {len(scores)} samples")
    if timings is not None:
        timings[f"reward_{name}_s"] = time.perf_counter() - t0
    return vals

