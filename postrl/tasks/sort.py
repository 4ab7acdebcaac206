"""Domain `sort`: sort a string of digits ascending, with difficulty levels by length.

    s4721=    ->  1247
    s90315=   ->  01359

A second arithmetic-style generated family for the tiny demo models (char-level, a 14-symbol
alphabet). Levels: 1 three digits, 2 four, 3 five, 4 six. A fixed ~10% of prompts (by hash,
independent of any seed) is held out and never sampled for training.

Like `arith`, the module knows a *systematic mistake* (sorting descending instead of ascending)
that the multi-domain pretraining corpus mixes in, so the base model has latent but unreliable
skill that RL can make reliable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.tasks.base import heldout_by_level, is_heldout, parse_params, register_domain, strict_score

LEVELS = {1: 3, 2: 4, 3: 5, 4: 6}
"""Level -> number of digits to sort."""
ALPHABET = "0123456789s="


@dataclass
class SortParams:
    levels: list[int] = field(default_factory=lambda: [1, 2])
    """Difficulty levels to draw training problems from (1-4)."""
    heldout_percent: int = 10
    """Share of all prompts reserved for the held-out split, in percent."""


def generate(rng: random.Random, level: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(LEVELS[level]))


def render(digits: str) -> str:
    return f"s{digits}="


def solve(digits: str) -> str:
    return "".join(sorted(digits))


def systematic_mistake(digits: str) -> str:
    """Descending order: the whole procedure right except one learnable flip."""
    return "".join(sorted(digits, reverse=True))


def score_answer(gold: str, response: Response) -> Score:
    """Strict: reward 1 only for exactly the sorted digits, terminated by EOS (not truncated)."""
    return strict_score(response, response.text.strip() == gold)


@register_domain("sort")
class Sort:
    reward_components = ("correct",)

    def __init__(self, params: dict, seed: int, name: str = "sort"):
        self.name = name
        self.params: SortParams = parse_params(SortParams, params, name)
        if not self.params.levels or any(lv not in LEVELS for lv in self.params.levels):
            raise UserError(f"domains.{self.name}.params.levels = {self.params.levels}: levels are {sorted(LEVELS)}")
        self.levels = sorted(set(self.params.levels))
        self.seed = seed

    def make_task(self, digits: str, level: int) -> Task:
        prompt = render(digits)
        return Task(self.name, f"sort/{prompt}", prompt, solve(digits), level)

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        level = rng.choice(self.levels) if level is None else level
        while True:
            digits = generate(rng, level)
            if not is_heldout(render(digits), self.params.heldout_percent):
                return self.make_task(digits, level)

    def heldout(self, n: int) -> list[Task]:
        """The first n held-out problems, spread evenly over the levels; fixed for given levels."""

        def draw(rng: random.Random, level: int):
            digits = generate(rng, level)
            return render(digits), lambda: self.make_task(digits, level)

        return heldout_by_level(self.name, self.levels, n, self.params.heldout_percent, draw, tries=200)

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return [score_answer(t.answer, r) for t, r in zip(tasks, responses)]
