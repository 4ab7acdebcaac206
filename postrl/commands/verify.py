"""postrl verify --verifier math PAIRS.jsonl: score {"gold": ..., "answer": ...} lines.

Prints one JSON line per input line: {"line": n, "correct": true|false|null, "status":
"ok"|"timeout"|"error", "detail": ...}, then a summary line on stderr. `correct` is null when
the verifier could not decide (status timeout or error), never a silent false.
"""

from __future__ import annotations

import json
import sys

VERIFIERS = {"math": "postrl.rewards.math:MathVerifier"}


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="check (gold, answer) pairs with a verifier", description=__doc__)
    p.add_argument("pairs", help="JSONL file of {gold, answer} objects")
    p.add_argument("--verifier", default="math", choices=sorted(VERIFIERS))
    p.add_argument("--timeout-s", type=float, default=5.0, help="deadline per pair, in seconds")
    p.add_argument("--workers", type=int, default=None, help="verifier processes (default: CPU count)")
    p.set_defaults(func=run)


def run(args) -> int:
    import importlib

    from postrl.errors import UserError
    from postrl.rewards.jsonl import read_jsonl

    if args.timeout_s <= 0:
        raise UserError("--timeout-s must be positive")
    rows = read_jsonl(args.pairs, {"gold": (str, int, float), "answer": (str, int, float)})
    module, _, cls = VERIFIERS[args.verifier].partition(":")
    verifier_cls = getattr(importlib.import_module(module), cls)
    with verifier_cls(timeout_s=args.timeout_s, workers=args.workers) as verifier:
        scores = verifier.verify([(str(r["gold"]), str(r["answer"])) for r in rows])
        stats = verifier.stats
    for i, s in enumerate(scores, 1):
        print(json.dumps({"line": i, "correct": s.correct, "status": s.status, "detail": s.detail}))
    counts = {k: sum(s.status == k for s in scores) for k in ("ok", "timeout", "error")}
    right = sum(s.correct is True for s in scores)
    print(f"{len(scores)} pairs: {right} correct, {counts['ok'] - right} wrong, {counts['timeout']} timeout, "
          f"{counts['error']} error (isolation: {stats['isolation']})", file=sys.stderr)
    return 0
