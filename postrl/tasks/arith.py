"""Domain `arith`: seeded, procedurally generated arithmetic with difficulty levels.

    47+38=      ->  [1]85        the carry bits used, then the answer
    52-38+17=   ->  [1,1]31

Problems are evaluated left to right. A fixed ~10% of all problems (chosen by a hash of the
problem text, so independent of any seed) form the held-out split; training never samples them.

The module also knows a *systematic mistake*: forgetting every carry and borrow. The demo's pretraining corpus uses them to give the base model
latent but unreliable skill: the right answer is in its distribution, but often not on top.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from postrl.records import Response, Score, Task
from postrl.tasks.base import heldout_by_level, is_heldout, parse_params, register_domain, strict_score


@dataclass(frozen=True)
class Level:
    digits: int
    """Digits per operand."""
    terms: int
    """Number of operands."""
    ops: str
    """Operators drawn from."""


LEVELS: dict[int, Level] = {
    1: Level(digits=1, terms=2, ops="+"),
    2: Level(digits=2, terms=2, ops="+-"),
    3: Level(digits=2, terms=3, ops="+-"),
    4: Level(digits=3, terms=2, ops="+-"),
    5: Level(digits=3, terms=3, ops="+-"),
}

ALPHABET = "0123456789+-=[],"
_ANSWER = re.compile(r"(?:\[[01,]*\])?\s*(-?\d+)")


@dataclass
class ArithParams:
    levels: list[int] = field(default_factory=lambda: [2])
    """Difficulty levels to draw training problems from (uniformly unless the curriculum says)."""
    heldout_percent: int = 10
    """Share of all problems reserved for the held-out split, in percent."""
    require_carry: bool = False
    """Only problems that need at least one carry or borrow (the systematic mistake matters)."""


def generate(rng: random.Random, level: int) -> tuple[list[int], list[str]]:
    """Operands and operators for one problem; running values never go negative."""
    spec = LEVELS[level]
    lo, hi = (0 if spec.digits == 1 else 10 ** (spec.digits - 1)), 10**spec.digits - 1
    nums = [rng.randint(lo, hi)]
    ops: list[str] = []
    value = nums[0]
    for _ in range(spec.terms - 1):
        b = rng.randint(lo, hi)
        op = rng.choice(spec.ops)
        if op == "-" and b > value:
            op = "+"
        nums.append(b)
        ops.append(op)
        value = value + b if op == "+" else value - b
    return nums, ops


def render(nums: list[int], ops: list[str]) -> str:
    return str(nums[0]) + "".join(op + str(n) for op, n in zip(ops, nums[1:])) + "="


def evaluate(nums: list[int], ops: list[str], add=lambda a, b: a + b, sub=lambda a, b: a - b) -> int:
    value = nums[0]
    for op, b in zip(ops, nums[1:]):
        value = add(value, b) if op == "+" else sub(value, b)
    return value


def _digits(n: int, width: int) -> list[int]:
    return [int(c) for c in str(n).zfill(width)[::-1]]  # least significant first


def column_op(a: int, b: int, sign: int, drop: bool = False) -> tuple[int, list[int]]:
    """Column addition (sign=+1) or subtraction (sign=-1), least significant column first.

    Returns the value and the carries (borrows) *used* into columns 1..width-1. With `drop`,
    every carry (borrow) is forgotten: the classic mistake (47+38 -> 75, 52-38 -> 24), which
    changes nothing where no carry is needed (12+13 -> 25). The leftmost column is written in full.
    """
    width = max(len(str(a)), len(str(b)))
    da, db = _digits(a, width), _digits(b, width)
    true_carry, value, used_bits = 0, 0, []
    for i in range(width):
        used = 0 if (drop and i > 0) else true_carry
        if i > 0:
            used_bits.append(used)
        col = da[i] + sign * db[i] + sign * used
        true_total = da[i] + sign * db[i] + sign * true_carry
        true_carry = int(true_total >= 10) if sign > 0 else int(true_total < 0)
        value += (col if i == width - 1 else col % 10) * 10**i
    return value, used_bits


def solve(nums: list[int], ops: list[str], drop: bool = False) -> tuple[str, int]:
    """Worked solution: the carry/borrow bits of each operation, then the value.

    The work is written `[bits,bits,...]`, one group per operation, most significant column
    first: 47+38 -> ("[1]", 85); 52-38+17 -> ("[1,1]", 31). With `drop` the bits and the value
    are those of the systematic mistake (every carry forgotten), consistently.
    """
    value, groups = nums[0], []
    for op, b in zip(ops, nums[1:]):
        value, bits = column_op(value, b, +1 if op == "+" else -1, drop)
        groups.append("".join(str(x) for x in reversed(bits)))
    return "[" + ",".join(groups) + "]", value


def systematic_mistake(nums: list[int], ops: list[str]) -> int:
    """The answer a solver who forgets every carry and borrow gives."""
    return solve(nums, ops, drop=True)[1]


def extract_answer(text: str) -> int | None:
    """The integer answer if the completion is exactly an optional worked part `[...]` followed by
    one integer (surrounding spaces allowed); anything else extracts nothing."""
    m = _ANSWER.fullmatch(text.strip())
    return int(m.group(1)) if m else None


def score_answer(gold: str, response: Response) -> Score:
    """Strict: reward 1 only for the right integer, nothing else, terminated by EOS (not truncated)."""
    value = extract_answer(response.text)
    return strict_score(response, value is not None and value == int(gold))


@register_domain("arith")
class Arith:
    reward_components = ("correct",)

    def __init__(self, params: dict, seed: int, name: str = "arith"):
        self.name = name
        self.params: ArithParams = parse_params(ArithParams, params, name)
        bad = [lv for lv in self.params.levels if lv not in LEVELS]
        if bad or not self.params.levels:
            from postrl.errors import UserError

            raise UserError(f"domains.{self.name}.params.levels = {self.params.levels}: levels are {sorted(LEVELS)}")
        self.levels = sorted(self.params.levels)
        self.seed = seed

    def make_task(self, nums: list[int], ops: list[str], level: int) -> Task:
        prompt = render(nums, ops)
        return Task(self.name, f"arith/{prompt}", prompt, str(evaluate(nums, ops)), level)

    def accepts(self, nums: list[int], ops: list[str]) -> bool:
        return not self.params.require_carry or "1" in solve(nums, ops)[0]

    def sample(self, rng: random.Random, level: int | None = None) -> Task:
        level = rng.choice(self.levels) if level is None else level
        while True:
            nums, ops = generate(rng, level)
            if not is_heldout(render(nums, ops), self.params.heldout_percent) and self.accepts(nums, ops):
                return self.make_task(nums, ops, level)

    def heldout(self, n: int) -> list[Task]:
        """The first n held-out problems, spread evenly over the levels; fixed for given levels."""

        def draw(rng: random.Random, level: int):
            nums, ops = generate(rng, level)
            return render(nums, ops), lambda: (self.make_task(nums, ops, level) if self.accepts(nums, ops) else None)

        # level 1 has only ~10 held-out problems: 200 draws per problem wanted, then stop trying
        return heldout_by_level(self.name, self.levels, n, self.params.heldout_percent, draw, tries=200)

    def score(self, tasks: list[Task], responses: list[Response]) -> list[Score]:
        return [score_answer(t.answer, r) for t, r in zip(tasks, responses)]
