"""postrl rm train PAIRS.jsonl [--backbone MODEL] [--out DIR]: train a Bradley-Terry reward model.

PAIRS lines are TRL preference records: {"prompt": ..., "chosen": ..., "rejected": ...} as text or
chat messages, or chosen/rejected as whole conversations (the prompt is what they share). With
--backbone (any Hugging Face causal LM directory, a GGUF file, or a built-in name such as
tiny-arith or smollm2-135m-instruct) a scalar head goes on the pretrained decoder, trained with
LoRA adapters (--lora-r) or in full; without it, a small character-level model is trained from
scratch. A share of the prompts (--heldout-fraction, split by prompt) is held out; their pairwise
accuracy (chosen scored above rejected) is printed and saved with the model in DIR/rm_report.json.
DIR is a Hugging Face model directory usable as `verifier: rm:DIR` or in `reward_models:`.
`postrl rm make-prefs OUT.jsonl [--set sorted|concise]` writes one of the project's preference sets.
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("rm", help="train a reward model on preference pairs", description=__doc__)
    rm_sub = p.add_subparsers(dest="rm_command", required=True)
    t = rm_sub.add_parser("train", help="train on PAIRS.jsonl and report held-out accuracy")
    t.add_argument("pairs", help="JSONL of TRL preference records: prompt, chosen, rejected (text or chat messages)")
    t.add_argument("--out", default="runs/rm", help="output model directory (default runs/rm)")
    t.add_argument("--steps", type=int, default=400, help="optimiser steps")
    t.add_argument("--batch-size", type=int, default=32, help="pairs per step")
    t.add_argument("--lr", type=float, default=None,
                   help="learning rate (default 2e-3 from scratch, 1e-3 with LoRA, 1e-4 full fine-tuning)")
    t.add_argument("--backbone", default="", help="pretrained causal LM to put the head on (default: none)")
    t.add_argument("--lora-r", type=int, default=0, help="LoRA rank on the backbone (0 = train every weight)")
    t.add_argument("--max-length", type=int, default=512, help="longest input in tokens (the end is kept)")
    t.add_argument("--score-batch-size", type=int, default=16, help="inputs per forward when the model scores")
    t.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    t.add_argument("--heldout-fraction", type=float, default=0.2)
    t.add_argument("--seed", type=int, default=0)
    t.set_defaults(func=run_train)
    m = rm_sub.add_parser("make-prefs", help="write the built-in 'sorted letters' preference set")
    m.add_argument("out", help="output JSONL file")
    m.add_argument("--set", dest="kind", choices=("sorted", "concise"), default="sorted",
                   help="sorted: 'sort: <letters>' pairs; concise: chat arithmetic, short right answers "
                        "preferred over long, evasive or wrong ones")
    m.add_argument("--n", type=int, default=2000)
    m.add_argument("--seed", type=int, default=0)
    m.set_defaults(func=run_make)


def run_train(args) -> int:
    import sys
    import time

    import torch

    from postrl.builtin_models import resolve_model_path
    from postrl.errors import UserError
    from postrl.rewards.models.rm import RewardModel, load_pairs, train_reward_model

    if args.steps <= 0 or args.batch_size <= 0 or not 0.0 < args.heldout_fraction < 1.0:
        raise UserError("--steps and --batch-size must be positive, --heldout-fraction in (0, 1)")
    if args.lora_r < 0 or args.max_length < 1 or args.score_batch_size < 1:
        raise UserError("--lora-r must be >= 0, --max-length and --score-batch-size >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pairs = load_pairs(args.pairs)
    rm, lr = None, args.lr or 2e-3
    if args.backbone:
        path = resolve_model_path(args.backbone, log=lambda m: print(m, file=sys.stderr))
        rm = RewardModel.from_backbone(path, lora_r=args.lora_r, max_length=args.max_length,
                                       score_batch_size=args.score_batch_size, seed=args.seed, name=args.backbone)
        lr = args.lr or (1e-3 if args.lora_r else 1e-4)
    _, report = train_reward_model(
        pairs, args.out, rm=rm, steps=args.steps, batch_size=args.batch_size, lr=lr,
        heldout_fraction=args.heldout_fraction, seed=args.seed, log=lambda m: print(m, file=sys.stderr),
    )
    print(json.dumps({"out": str(args.out), **report, "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


def run_make(args) -> int:
    from dataclasses import asdict

    from postrl.rewards.models.concise import make_concise_preferences
    from postrl.rewards.models.rm import make_preferences

    make = make_preferences if args.kind == "sorted" else make_concise_preferences
    with open(args.out, "w", encoding="utf-8") as f:
        for pair in make(args.n, args.seed):
            f.write(json.dumps(asdict(pair)) + "\n")
    return 0
