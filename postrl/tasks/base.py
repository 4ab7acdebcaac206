"""The domain registry, the `Domain` protocol, and helpers the generated domains share.

A domain is a source of problems plus the rule that grades answers to them:

    @register_domain("arith")                      # facts: components=..., uses_base_dir=...
    class Arith:
        reward_components = ("correct",)           # names its scores' components may have
        def __init__(self, params: dict, seed: int, name: str = "arith"): ...
        name: str                                  # the recipe's key: every Task carries it
        levels: list[int]                          # difficulty levels, easiest first
        def sample(self, rng, level=None) -> Task  # a training problem (never a held-out one)
        def heldout(self, n) -> list[Task]         # the fixed held-out split
        def score(self, tasks, responses) -> list[Score]   # batched grading

This module knows no domain: `postrl.tasks.catalog` imports the built-in ones and builds them.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from postrl.records import Response, Score, Task
from postrl.registry import Registry


class Domain(Protocol):
    name: str
    levels: list[int]

    def sample(self, rng: random.Random, level: int | None = None) -> Task: ...

    def heldout(self, n: int) -> list[Task]: ...

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]: ...


@dataclass(frozen=True)
class DomainFacts:
    """What a domain type's registration says about it, known before any domain is built."""

    components: tuple[str, ...] = ()
    """The component names its scores may have: the reward terms a recipe may weight."""
    uses_base_dir: bool = False
    """It reads files: `postrl.tasks.catalog` passes the recipe's directory as `params.base_dir`."""


DOMAINS: Registry[DomainFacts] = Registry("domain", facts=DomainFacts)
"""Registry name -> factory(params, seed, name) -> Domain, with its `DomainFacts`."""


def register_domain(name: str, components: tuple[str, ...] | None = None, uses_base_dir: bool = False) -> Callable:
    """Decorator registering a domain type. `components` defaults to the class's own
    `reward_components` (read once, here: a domain class declares them in its body; a factory
    function passes them)."""

    def deco(factory: Any) -> Any:
        declared = getattr(factory, "reward_components", ()) if isinstance(factory, type) else ()
        DOMAINS.add(name, factory, components=tuple(declared if components is None else components),
                    uses_base_dir=uses_base_dir)
        return factory

    return deco


def is_heldout(text: str, percent: int) -> bool:
    """The fixed held-out rule of generated domains: a problem is held out when a hash of its text
    falls in the first `percent` of 100 buckets, so the split never depends on a seed."""
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) % 100 < percent


def heldout_by_level(
    domain: str,
    levels: list[int],
    n: int,
    percent: int,
    draw: Callable[[random.Random, int], tuple[str, Callable[[], Task | None]]],
    tries: int,
) -> list[Task]:
    """The first n held-out problems of a generated domain, spread evenly over `levels`; fixed for
    given levels. Each level draws from its own generator, seeded by (domain, level), until it has
    its share of distinct held-out problems or has made `tries` draws per problem wanted (a small
    level may have fewer). `draw(rng, level)` returns a problem's text (the held-out rule's key)
    and a function making its Task, or None when the domain does not accept the problem."""
    per_level = [n // len(levels) + (i < n % len(levels)) for i in range(len(levels))]
    tasks: list[Task] = []
    for level, count in zip(levels, per_level):
        rng, seen = random.Random(f"{domain}-heldout-{level}"), set()
        for _ in range(tries * count):
            if len(seen) == count:
                break
            text, make = draw(rng, level)
            if text in seen or not is_heldout(text, percent):
                continue
            task = make()
            if task is not None:
                seen.add(text)
                tasks.append(task)
    return tasks


def strict_score(response: Response, right: bool) -> Score:
    """Reward 1 only for a right answer that ended with EOS (a truncated one is wrong), with the
    verdict as the component `correct`."""
    correct = response.finish_reason == "stop" and right
    return Score(reward=float(correct), correct=correct, components={"correct": float(correct)})


def parse_params(cls: type, params: dict[str, Any], domain: str) -> Any:
    """Validate a domain's `params` mapping into its own dataclass, with config-style errors."""
    from postrl.config.loading import (
        from_dict,  # config is a leaf module; imported here to keep this one light
    )

    return from_dict(cls, params, prefix=f"domains.{domain}.params.")
