"""postrl pretrain: build the tiny demo base model (deterministic from its seed)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain the tiny demo base model", description=__doc__)
    p.add_argument("--out", help="output directory (default: the cache postrl train uses)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="optimiser steps (default: the demo's)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.pretrain import PretrainSpec, ensure_tiny_model, pretrain
    from postrl.seeding import set_threads

    set_threads(args.threads)
    spec = PretrainSpec(seed=args.seed)
    if args.steps is not None:
        spec.steps = args.steps
    path = pretrain(spec, args.out) if args.out else ensure_tiny_model(spec)
    print(f"base model: {path}")
    return 0
