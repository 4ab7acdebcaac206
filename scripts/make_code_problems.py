"""Write small Python function problems in MBPP's JSONL format, graded by their asserts in the sandbox.

    python scripts/make_code_problems.py [--out recipes/data]

Each line is {"task_id": ..., "text": "Write a Python function named NAME ...", "code": <a reference
solution>, "test_list": [three assert lines]}, as in MBPP. Files (fixed by the seed, so the shipped
files are reproducible):
  code_test.jsonl     200 problems, each a different function (held out)
  code_train.jsonl   1000 problems (trained on): none of the held-out functions; a function may come
                     back with other asserts

Why these: SmolLM2-135M-Instruct passes none of HumanEval's held-out problems that a probe could tell
apart from zero, so a gain there cannot be measured on 2 CPU cores; one-line functions whose name and
behaviour the problem states are within its reach (recipes/smollm2-joint.yaml has the base rates).
Every problem's expected values come from running its reference solution here; tests/test_joint_bench.py
runs the held-out references through the recipe's verifier in the sandbox.
"""

from __future__ import annotations

import random
from pathlib import Path

from _data_files import parser, write_jsonl  # scripts/, on the path when this script runs

WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "candle", "garden", "rocket", "maple",
         "ocean", "pepper", "silver", "window", "button", "forest", "honey", "island", "jacket"]


def template(rng: random.Random) -> tuple[str, str, str, list]:
    """(problem text, function name, reference body as `def ...`, argument tuples for the asserts)."""
    k = rng.randint(2, 30)
    w, c = rng.choice(WORDS), rng.choice("abcdeilmnoprstu")
    ints = [(rng.randint(-20, 40),) for _ in range(3)]
    lists = [([rng.randint(-9, 30) for _ in range(rng.randint(2, 6))],) for _ in range(3)]
    strings = [(rng.choice(WORDS) + rng.choice(["", "s", c * 2]),) for _ in range(3)]
    m, j = rng.randint(2, 30), rng.randint(2, 5)
    lo = rng.randint(-10, 10)
    hi = lo + rng.randint(5, 30)
    kinds = [
        (f"add_{k}_then_times_{m}", f"takes an integer x, adds {k} to it, and returns the result multiplied by {m}",
         f"return (x + {k}) * {m}", "x", ints),
        (f"square_of_x_minus_{k}", f"takes an integer x and returns the square of (x minus {k})", f"return (x - {k}) ** 2",
         "x", ints),
        (f"divisible_by_{k}_not_{m}", f"takes an integer n and returns True if n is divisible by {k} but not by {m}, else False",
         f"return n % {k} == 0 and n % {m} != 0", "n", [(k * m,), (k * rng.randint(1, 9),), (k * rng.randint(1, 9) + 1,)]),
        (f"strictly_between_{lo}_and_{hi}".replace("-", "minus_"),
         f"takes an integer x and returns True if x is strictly greater than {lo} and strictly less than {hi}, else False",
         f"return {lo} < x < {hi}", "x", [(lo,), (hi,), (rng.randint(lo + 1, hi - 1),)]),
        ("sum_of_evens", "takes a list of integers and returns the sum of its even numbers",
         "return sum(v for v in lst if v % 2 == 0)", "lst", lists),
        (f"sum_greater_than_{k}", f"takes a list of integers and returns the sum of the numbers in it that are greater than {k}",
         f"return sum(v for v in lst if v > {k})", "lst", lists),
        (f"above_{k}_times_{m}", f"takes a list of integers and returns a new list of the numbers greater than {k}, each multiplied by {m}",
         f"return [v * {m} for v in lst if v > {k}]", "lst", lists),
        ("sort_descending", "takes a list of integers and returns it sorted from largest to smallest",
         "return sorted(lst, reverse=True)", "lst", lists),
        ("product_of_list", "takes a list of integers and returns the product of all of them",
         "product = 1\n    for v in lst:\n        product *= v\n    return product", "lst", lists),
        (f"last_{j}_chars", f"takes a string s and returns its last {j} characters", f"return s[-{j}:]", "s", strings),
        (f"remove_{c}", f"takes a string s and returns it with every letter '{c}' removed",
         f"return s.replace('{c}', '')", "s", strings),
        (f"count_{c}", f"takes a string s and returns how many times the letter '{c}' appears in it",
         f"return s.count('{c}')", "s", strings),
        (f"ends_with_{w}", f"takes a string s and returns True if s ends with '{w}', else False",
         f"return s.endswith('{w}')", "s", [(rng.choice(WORDS) + w,), (w + "s",), (w[:-1],)]),
        ("count_vowels", "takes a string s and returns how many vowels (a, e, i, o, u) it has",
         "return sum(1 for ch in s if ch in 'aeiou')", "s", strings),
        ("is_palindrome", "takes a string s and returns True if it reads the same backward, else False",
         "return s == s[::-1]", "s", [(rng.choice(["level", "noon", "civic", "radar"]),), *strings[:2]]),
        ("digit_sum", "takes a non-negative integer n and returns the sum of its digits",
         "return sum(int(d) for d in str(n))", "n", [(rng.randint(10, 99999),) for _ in range(3)]),
    ]
    name, does, body, params, args = rng.choice(kinds)
    return f"Write a Python function named {name} that {does}.", name, f"def {name}({params}):\n    {body}", args


def problem(rng: random.Random) -> dict:
    text, name, code, args = template(rng)
    scope: dict = {}
    exec(code, scope)  # the reference solution, written here: its outputs are the asserts' expectations
    tests = [f"assert {name}({', '.join(map(repr, a))}) == {scope[name](*a)!r}" for a in args]
    return {"text": text, "code": code, "test_list": tests}


def draw(rng: random.Random, n: int, exclude: set[str], repeat_text: bool = False) -> list[dict]:
    """n problems whose text is not in `exclude`; with `repeat_text`, a text may come back with other asserts."""
    rows, seen = [], set()
    while len(rows) < n:
        row = problem(rng)
        key = (row["text"], *row["test_list"]) if repeat_text else row["text"]
        if row["text"] not in exclude and key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


def numbered(rows: list[dict], first_id: int) -> list[dict]:
    return [{"task_id": first_id + i, **r} for i, r in enumerate(rows)]


def main() -> None:
    out = Path(parser(__doc__).parse_args().out)
    test = draw(random.Random("code-test"), 200, set())
    train = draw(random.Random("code-train"), 1000, {r["text"] for r in test}, repeat_text=True)
    write_jsonl(out / "code_test.jsonl", numbered(test, 1))
    write_jsonl(out / "code_train.jsonl", numbered(train, 1001))


if __name__ == "__main__":
    main()
