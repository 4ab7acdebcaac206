"""Held-out pairwise accuracy of reward models on the `concise` preference set, by what the
rejected reply got wrong: evasive (no number), right but long, short and wrong, other.

    postrl rm make-prefs concise600.jsonl --set concise --n 600 --seed 1
    python scripts/rm_by_kind.py concise600.jsonl RM_DIR [RM_DIR ...]

The held-out pairs are the ones `postrl rm train` holds out (the same split, by prompt).
"""

from __future__ import annotations

import argparse
import operator
import re

from postrl.rewards.models.preferences import load_pairs, split_pairs
from postrl.rewards.models.rm import RewardModel

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def kind(pair) -> str:
    a, op, b = re.search(r"What is (\d+) ([-+*]) (\d+)\?", pair.prompt[-1]["content"]).groups()
    right = str(OPS[op](int(a), int(b)))
    rejected = pair.rejected[-1]["content"]
    numbers = re.findall(r"-?\d+", rejected)
    if not numbers:
        return "evasive"
    if numbers[-1] != right:
        return "wrong"
    return "long" if len(rejected) > 40 else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pairs")
    parser.add_argument("models", nargs="+")
    parser.add_argument("--heldout-fraction", type=float, default=0.2)
    args = parser.parse_args()
    _, held = split_pairs(load_pairs(args.pairs), args.heldout_fraction)
    for path in args.models:
        rm = RewardModel.load(path)
        chosen = rm.score([p.prompt for p in held], [p.chosen for p in held])
        rejected = rm.score([p.prompt for p in held], [p.rejected for p in held])
        by_kind: dict[str, list[bool]] = {}
        for pair, c, r in zip(held, chosen, rejected):
            by_kind.setdefault(kind(pair), []).append(c > r)
        print(path, "  ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(by_kind.items())))


if __name__ == "__main__":
    main()
