"""Write the one-step word problems of recipes/smollm2-gsm.yaml and smollm2-joint.yaml, in GSM8K's JSONL format.

    python scripts/make_word_problems.py [--out recipes/data]                # numbers 2-20, and the control
    python scripts/make_word_problems.py --numbers 1-10 --train 1500         # the joint recipe's easier set

Each line is {"question": ..., "answer": "<worked solution>\\n#### <number>"}, as in GSM8K.
Files (fixed by the seed, so the shipped files are reproducible):
  word_problems_train.jsonl   2000 addition and subtraction problems (trained on)
  word_problems_test.jsonl     200 addition and subtraction problems (held out; none in train)
  multiplication_test.jsonl    200 multiplication problems (never trained on: the control)
With --numbers 1-10 (recipes/smollm2-joint.yaml): word_problems_1to10_{train,test}.jsonl, 1500 and
200 problems with numbers 1-10, no control. The base model answers them more often: on the shipped
200 held out greedy 0.250, pass@1 0.140 (joint_vs_single.py's base measurement, 2026-12-04), where
the 2-20 set gives 0.080 and 0.065, so more of a training step's groups carry signal.

Why these: SmolLM2-135M-Instruct solves 1-2% of GSM8K itself, so a gain there cannot be measured on
2 CPU cores. Measured before choosing (32 problems x 4 samples, T=0.7, 128 new tokens, the last
number of the reply graded): one-step addition/subtraction with numbers up to 20: 9% right;
one-step multiplication (2-9 x 2-6): 13%; reasoning-gym's leg_counting and basic_arithmetic: 1%.
So these are within the model's reach: right sometimes, rarely reliably.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from _data_files import parser, write_jsonl  # scripts/, on the path when this script runs

NAMES = ["Sam", "Mia", "Leo", "Ava", "Ben", "Zoe", "Noah", "Lily", "Omar", "Ines", "Raj", "Yuki"]
ITEMS = ["apples", "marbles", "books", "stickers", "pencils", "cards", "shells", "coins", "stamps", "cookies"]


def add_or_subtract(rng: random.Random, low: int = 2, high: int = 20) -> tuple[str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(low, high), rng.randint(low, high)
    if rng.random() < 0.5:
        question = f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?"
        return question, f"{name} has {a} + {b} = {a + b} {item} now.\n#### {a + b}"
    a, b = max(a, b), min(a, b)
    question = f"{name} has {a} {item}. {name} gives away {b} {item}. How many {item} does {name} have left?"
    return question, f"{name} has {a} - {b} = {a - b} {item} left.\n#### {a - b}"


def multiply(rng: random.Random) -> tuple[str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    per_box, boxes = rng.randint(2, 9), rng.randint(2, 6)
    question = f"{name} has {boxes} boxes. Each box holds {per_box} {item}. How many {item} does {name} have in all?"
    return question, f"{name} has {boxes} x {per_box} = {boxes * per_box} {item} in all.\n#### {boxes * per_box}"


def draw(make, rng: random.Random, n: int, exclude: set[str]) -> list[dict[str, str]]:
    rows, seen = [], set(exclude)
    while len(rows) < n:
        question, answer = make(rng)
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": answer})
    return rows


def numbers(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)):
        raise argparse.ArgumentTypeError(f"--numbers: want LOW-HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return int(low), int(high)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--numbers", type=numbers, default=(2, 20), help="the operands' range, LOW-HIGH (default 2-20)")
    ap.add_argument("--train", type=int, default=2000, help="training problems (200 are held out besides)")
    args = ap.parse_args()
    out = Path(args.out)
    low, high = args.numbers
    tag = "" if (low, high) == (2, 20) else f"_{low}to{high}"  # the 2-20 set keeps its names and seeds

    def make(rng: random.Random) -> tuple[str, str]:
        return add_or_subtract(rng, low, high)

    test = draw(make, random.Random(f"word-problems{tag}-test"), 200, set())
    train = draw(make, random.Random(f"word-problems{tag}-train"), args.train, {r["question"] for r in test})
    write_jsonl(out / f"word_problems{tag}_train.jsonl", train)
    write_jsonl(out / f"word_problems{tag}_test.jsonl", test)
    if not tag:
        write_jsonl(out / "multiplication_test.jsonl", draw(multiply, random.Random("multiplication-test"), 200, set()))


if __name__ == "__main__":
    main()
