"""Domain `chat_arith`: arithmetic asked in words, for instruction-tuned chat models.

    What is 47 + 38? Reply with only the final number.   ->  85

`arith` writes problems as bare `47+38=` for the demo model, which was pretrained on exactly
that format; a chat model asked that way answers in prose. Here the prompt is a question with a
fixed answer instruction, and the grader takes the *last integer* of the reply, so "47 + 38 = 85"
and "85" both count, while a reply cut off by `max_new_tokens` counts as wrong (it has not
committed to an answer). Taking the last integer is the rule models learn easily and that
cannot be gamed by listing candidates: a list is graded on its last entry only.

Levels (operands are drawn uniformly; subtraction never goes below zero):

    1: a + b, 1 digit     2: a + b, 2 digits     3: a +/- b, 2 digits
    4: a + b, 3 digits    5: a +/- b +/- c, 2 digits    6: a * b, 2 digits by 1 digit

A fixed share of all problems (by a hash of the question, independent of any seed) is held out;
training never samples them.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from postrl.errors import UserError
from postrl.records import Response, Score, Task
from postrl.tasks.base import heldout_by_level, is_heldout, parse_params, register_domain, strict_score

LEVELS: dict[int, tuple[list[int], str]] = {
    1: ([1, 1], "+"), 2: ([2, 2], "+"), 3: ([2, 2], "+-"), 4: ([3, 3], "+"), 5: ([2, 2, 2], "+-"), 6: ([2, 1], "*"),
}
"""level -> (digits of each operand, operators drawn from)."""

TEMPLATE = "What is {expr}? Reply with only the final number."
_INT = re.compile(r"-?\d+")


@dataclass
class ChatArithParams:
    levels: list[int] = field(default_factory=lambda: [3])
    """Difficulty levels to draw problems from (see the module docstring)."""
    heldout_percent: int = 10
    """Share of all problems reserved for the held-out split, in percent."""
    template: str = TEMPLATE
    """The question; {expr} is replaced by the expression, e.g. '47 + 38'."""


def make_problem(rng: random.Random, level: int) -> tuple[str, int]:
    """(expression text, value), evaluated left to right."""
    digits, ops = LEVELS[level]
    nums = [rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1) for d in digits]
    expr, value = str(nums[0]), nums[0]
    for b in nums[1:]:
        op = rng.choice(ops)
        if op == "-" and b > value:
            op = "+"
        value = {"+": value + b, "-": value - b, "*": value * b}[op]
        expr += f" {op} {b}"
    return expr, value


def last_integer(text: str) -> int | None:
    """The last integer in the text, thousands separators allowed: 'so 1,204.' -> 1204."""
    found = _INT.findall(re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))
    return int(found[-1]) if found else None


def score_reply(gold: str, response: Response) -> Score:
    value = last_integer(response.text)
    return strict_score(response, value is not None and value == int(gold))


@register_domain("chat_arith")
class ChatArith:
    reward_components = ("correct",)

    def __init__(self, params: dict, seed: int, name: str = "chat_arith"):
        self.name = name
        self.params: ChatArithParams = parse_params(ChatArithParams, params, name)
        if not self.params.levels or any(lv not in LEVELS for lv in self.params.levels):
            raise UserError(f"domains.{self.name}.params.levels = {self.params.levels}: levels are {sorted(LEVELS)}")
        if "{expr}" not in self.params.template:
            raise UserError(f"domains.{self.name}.params.template must contain {{expr}}")
        self.levels = sorted(self.params.levels)
        self.seed = seed

    def _task(self, expr: str, value: int, level: int) -> Task:
        prompt = self.params.template.format(expr=expr)
        return Task(self.name, f"chat_arith/{expr}", prompt, str(value), level)

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        level = rng.choice(self.levels) if level is None else level
        while True:
            expr, value = make_problem(rng, level)
            if not is_heldout(expr, self.params.heldout_percent):
                return self._task(expr, value, level)

    def heldout(self, n: int) -> list[Task]:
        """The first n held-out problems, spread evenly over the levels; fixed for given levels."""

        def draw(rng: random.Random, level: int):
            expr, value = make_problem(rng, level)
            return expr, lambda: self._task(expr, value, level)

        # level 1 has only ~10 held-out problems: 500 draws per problem wanted, then stop trying
        return heldout_by_level(self.name, self.levels, n, self.params.heldout_percent, draw, tries=500)

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return [score_reply(t.answer, r) for t, r in zip(tasks, responses)]
