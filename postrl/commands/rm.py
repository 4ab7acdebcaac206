"""postrl rm train PAIRS.jsonl [--out DIR]: train a Bradley-Terry reward model on preferences.

PAIRS lines are {"prompt": ..., "chosen": ..., "rejected": ...}. A share of the prompts
(--heldout-fraction, split by prompt) is held out; their pairwise accuracy (chosen scored above
rejected) is printed and saved with the model in DIR/rm_report.json. DIR is a Hugging Face
model directory. `postrl rm make-prefs OUT.jsonl` writes the project's own preference set.
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("rm", help="train a reward model on preference pairs", description=__doc__)
    rm_sub = p.add_subparsers(dest="rm_command", required=True)
    t = rm_sub.add_parser("train", help="train on PAIRS.jsonl and report held-out accuracy")
    t.add_argument("pairs", help="JSONL file of {prompt, chosen, rejected} objects")
    t.add_argument("--out", default="runs/rm", help="output model directory (default runs/rm)")
    t.add_argument("--steps", type=int, default=400, help="optimiser steps")
    t.add_argument("--batch-size", type=int, default=32, help="pairs per step")
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--heldout-fraction", type=float, default=0.2)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=run_train)
    m = rm_sub.add_parser("make-prefs", help="write the built-in 'sorted letters' preference set")
    m.add_argument("out", help="output JSONL file")
    m.add_argument("--n", type=int, default=2000)
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=run_make)


def run_train(args) -> int:
    from postrl.errors import UserError
    from postrl.rewards.rm import load_pairs, train_reward_model

    if args.steps <= 0 or args.batch_size <= 0 or not 0.0 < args.heldout_fraction < 1.0:
        raise UserError("--steps and --batch-size must be positive, --heldout-fraction in (0, 1)")
    pairs = load_pairs(args.pairs)
    _, report = train_reward_model(
        pairs, args.out, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        heldout_fraction=args.heldout_fraction, seed=args.seed,
    )
    print(json.dumps({"out": str(args.out), **report}))
    return 0


def run_make(args) -> int:
    from dataclasses import asdict

    from postrl.rewards.rm import make_preferences

    with open(args.out, "w", encoding="utf-8") as f:
        for pair in make_preferences(args.n, args.seed):
            f.write(json.dumps(asdict(pair)) + "\n")
    return 0
