"""postrl reward-check LABELS.jsonl --reward NAME [--min-kappa X]: does a reward agree with people?

LABELS lines are {"prompt": ..., "response": ..., "label": true|false|1|0} with optional "gold"
(the reference answer, for rewards such as `math`) and "finish_reason". NAME is any registered
reward term (`math`, `format_boxed`, `format_answer_tag`, `overlong`, ...) or `rm:DIR` for a
trained reward model. A response counts as judged good when its reward is >= --threshold.

Prints accuracy, Cohen's kappa, the confusion matrix and every disagreement (for reading).
Examples the reward could not verify (timeout/error) are listed and left out of the agreement.
With --min-kappa X, exits 1 when kappa is below X (or undefined), so it can gate a run.
"""

from __future__ import annotations

import json
import math
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("reward-check", help="agreement of a reward with human labels", description=__doc__)
    p.add_argument("labels", help="JSONL file of {prompt, response, label[, gold]} objects")
    p.add_argument("--reward", required=True, help="reward term name, or rm:DIR for a reward model")
    p.add_argument("--threshold", type=float, default=0.5, help="reward >= threshold counts as good")
    p.add_argument("--min-kappa", type=float, default=None, help="exit 1 when kappa is below this")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def load_examples(path: str):
    from postrl.records import Response, Task
    from postrl.rewards.jsonl import read_jsonl

    rows = read_jsonl(path, {"prompt": str, "response": str, "label": (bool, int)},
                      check=lambda r: None if r["label"] in (0, 1) else "label must be true/false or 1/0")
    tasks = [Task("labels", f"label-{i}", r["prompt"], str(r.get("gold", ""))) for i, r in enumerate(rows)]
    responses = [Response(r["response"], r.get("finish_reason", "stop")) for r in rows]
    return tasks, responses, [bool(r["label"]) for r in rows]


def reward_function(name: str):
    from postrl.errors import ConfigError, UserError
    from postrl.rewards.composite import TERMS  # from composite: its import registers the built-in terms

    if name.startswith("rm:"):
        from postrl.rewards.rm import register_rm_term

        register_rm_term(name, name[3:])
    try:
        return TERMS.get(name)
    except ConfigError as e:
        raise UserError(f"--reward: {e}") from None


def run(args) -> int:
    from postrl.records import Score
    from postrl.rewards.agreement import agreement

    tasks, responses, human = load_examples(args.labels)
    raw = reward_function(args.reward)(tasks, responses)
    scores = [v if isinstance(v, Score) else Score(float(v), None) for v in raw]
    verified = [i for i, s in enumerate(scores) if s.status == "ok"]
    if not verified:
        print("error: the reward could not verify any example", file=sys.stderr)
        return 1
    predicted = [scores[i].reward >= args.threshold for i in verified]
    result = agreement([human[i] for i in verified], predicted)
    report = {
        "reward": args.reward, "n": len(scores), "verified": len(verified), "threshold": args.threshold,
        "accuracy": result.accuracy, "kappa": result.kappa,
        "labels": [str(x).lower() for x in result.labels], "confusion": result.confusion,
        "disagreements": [_example(verified[j], tasks, responses, human, scores) for j in result.disagreements],
        "unverified": [_example(i, tasks, responses, human, scores) for i, s in enumerate(scores) if s.status != "ok"],
    }
    print(json.dumps(report) if args.json else _text(report))
    if args.min_kappa is not None and not result.kappa >= args.min_kappa:  # NaN fails too
        print(f"kappa {result.kappa:.3f} is below --min-kappa {args.min_kappa}", file=sys.stderr)
        return 1
    return 0


def _example(i, tasks, responses, human, scores) -> dict:
    s = scores[i]
    return {"record": i + 1, "human": human[i], "reward": s.reward, "status": s.status, "detail": s.detail,
            "prompt": tasks[i].prompt, "gold": tasks[i].answer, "response": responses[i].text}


def _text(r: dict) -> str:
    kappa = "undefined" if math.isnan(r["kappa"]) else f"{r['kappa']:.3f}"
    lines = [f"reward {r['reward']}: {r['verified']}/{r['n']} examples verified, good = reward >= {r['threshold']:g}",
             f"accuracy {r['accuracy']:.3f}   Cohen's kappa {kappa}",
             "confusion (rows: human label, columns: reward's label)",
             " " * 12 + "".join(f"{'reward=' + x:>14}" for x in r["labels"])]
    for x, row in zip(r["labels"], r["confusion"]):
        lines.append(f"{'human=' + x:<12}" + "".join(f"{c:>14}" for c in row))
    for title, key in (("disagreements", "disagreements"), ("not verified", "unverified")):
        lines.append(f"{title}: {len(r[key])}")
        for e in r[key]:
            lines.append(f"  record {e['record']}: human={str(e['human']).lower()} reward={e['reward']:.3f} "
                         f"[{e['status']}] gold={e['gold'][:40]!r} response={e['response'][-80:]!r}")
    return "\n".join(lines)
