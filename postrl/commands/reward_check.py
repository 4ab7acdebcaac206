"""postrl reward-check: does a reward agree with people, and which known hacks does it pay for?

    postrl reward-check LABELS.jsonl --reward NAME [--min-kappa X]          # a term, rm:DIR, python:MODULE:FUNCTION
    postrl reward-check LABELS.jsonl --recipe RECIPE --domain NAME          # a domain's reward, as training computes it
    postrl reward-check --adversarial --recipe RECIPE --domain NAME         # the hack library against it

LABELS lines are {"prompt": ..., "response": ..., "label": true|false|1|0} with optional "gold"
(the reference answer, for rewards such as `math`) and "finish_reason"; for a data set domain
(--recipe/--domain), the row's own columns instead of prompt and gold. NAME is any registered
reward term (`math`, `format_boxed`, `overlong`, ...), `rm:DIR` for a trained reward model, or
`python:MODULE:FUNCTION` for a user function (TRL's signature; the labels' other columns are its
keyword arguments). A response counts as judged good when its reward is >= --threshold.

Prints accuracy, Cohen's kappa, the confusion matrix and every disagreement (for reading).
Examples the reward could not verify (timeout/error) are listed and left out of the agreement.
With --min-kappa X, exits 1 when kappa is below X (or undefined). A recipe gates a run the same
way per domain (`domains.NAME.reward_check: {labels: FILE, min_kappa: 0.8}`; `train` exits 2).

--adversarial writes, for --n of the domain's problems, the replies of each hack in
`postrl.rewards.checks.hacks` (several boxed answers, "3 or 4", every candidate, the answer only in the
thinking, an empty or truncated fence, sys.exit(0), always-equal objects, printing the expected
output, echoing the prompt, padding to the length limit, a format-only reply) and reports the
share of problems where the reward paid for each. A strict verifier pays for none; a lenient
extractor (last_number) pays for some by design; a reward model's high rates are warnings.
"""

from __future__ import annotations

import json
import math
import sys

from postrl.abilities import Closeable, DeclaresComponents, HasVerifier


def add_parser(sub) -> None:
    p = sub.add_parser("reward-check", help="agreement of a reward with human labels; known hacks it pays for",
                       description=__doc__)
    p.add_argument("labels", nargs="?", default="", help="JSONL file of labelled responses")
    p.add_argument("--reward", default="", help="reward term name, rm:DIR, or python:MODULE:FUNCTION")
    p.add_argument("--recipe", default="", help="recipe whose domain's reward is checked (with --domain)")
    p.add_argument("--domain", default="", help="the recipe's domain (a key of `domains`)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a user module that registers verifiers, reward terms or domains (repeatable)")
    p.add_argument("--threshold", type=float, default=0.5, help="reward >= threshold counts as good")
    p.add_argument("--min-kappa", type=float, default=None, help="exit 1 when kappa is below this")
    p.add_argument("--adversarial", action="store_true", help="run the hack library against the domain's reward")
    p.add_argument("--n", type=int, default=20, help="--adversarial: problems of the domain to try each hack on")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.errors import UserError

    if bool(args.reward) == bool(args.recipe):
        raise UserError("give --reward NAME, or --recipe RECIPE with --domain NAME")
    if args.recipe and not args.domain:
        raise UserError("--recipe needs --domain NAME")
    if args.adversarial:
        if not args.recipe:
            raise UserError("--adversarial needs --recipe RECIPE --domain NAME (the problems come from the domain)")
        return run_adversarial(args)
    if not args.labels:
        raise UserError("give the LABELS.jsonl file (or --adversarial)")
    if args.recipe:
        with recipe_domain(args) as (domain, weights):
            from postrl.rewards.checks.reward_check import domain_reward, domain_task_maker, read_labels

            tasks, responses, human = read_labels(args.labels, domain_task_maker(domain))
            scores = domain_reward(domain, weights)(tasks, responses)
        name = f"domain {args.domain} of {args.recipe}"
    else:
        from postrl.rewards.checks.reward_check import read_labels

        tasks, responses, human = read_labels(args.labels)
        scores = named_reward(args.reward)(tasks, responses)
        name = args.reward
    return report_agreement(name, scores, human, tasks, responses, args)


def named_reward(name: str):
    """(tasks, responses) -> list[Score] for a term name, rm:DIR or python:MODULE:FUNCTION."""
    from pathlib import Path

    from postrl.errors import ConfigError, UserError
    from postrl.records import Score
    from postrl.rewards import user_reward  # noqa: F401  (registers the verifier python)
    from postrl.rewards.composite import TERMS  # from composite: its import registers the built-in terms
    from postrl.rewards.verifiers import VerifierSettings, make_verifier

    if name.startswith(("rm:", "python:")):
        try:
            verifier = make_verifier(name, VerifierSettings(base_dir=str(Path.cwd())), "--reward")
        except ConfigError as e:
            raise UserError(str(e)) from None
        return verifier.score
    try:
        term = TERMS.get(name)
    except ConfigError as e:
        raise UserError(f"--reward: {e}") from None
    return lambda tasks, responses: [v if isinstance(v, Score) else Score(float(v), None) for v in term(tasks, responses)]


class recipe_domain:
    """`with recipe_domain(args) as (domain, reward weights)`: the recipe's domain (`args.recipe`,
    `args.domain`, `args.imports`), built as a run builds it (its reward models registered), closed
    afterwards; `type_name` is its registry name. `postrl score` builds its domain here too."""

    def __init__(self, args):
        self.args = args
        self.domain = None
        self.type_name = ""

    def __enter__(self):
        import dataclasses

        from postrl.errors import UserError
        from postrl.extensions import load_recipe
        from postrl.names import check_names
        from postrl.tasks.catalog import build_domains

        cfg = load_recipe(self.args.recipe, [], self.args.imports)
        if self.args.domain not in cfg.domains:
            raise UserError(f"--domain {self.args.domain}: not a domain of {self.args.recipe} ({', '.join(cfg.domains)})")
        check_names(cfg)
        dcfg = cfg.domains[self.args.domain]
        self.type_name = dcfg.type or self.args.domain
        only = dataclasses.replace(cfg, domains={self.args.domain: dcfg})
        self.domain = build_domains(only)[self.args.domain]
        return self.domain, dcfg.reward

    def __exit__(self, *exc) -> None:
        if isinstance(self.domain, Closeable):
            self.domain.close()


def report_agreement(name, scores, human, tasks, responses, args) -> int:
    from postrl.rewards.checks.reward_check import agreement_report

    report = {"reward": name, **agreement_report(scores, human, args.threshold, tasks, responses)}
    print(json.dumps(report) if args.json else _text(report))
    if args.min_kappa is not None and not report["kappa"] >= args.min_kappa:  # NaN fails too
        print(f"kappa {report['kappa']:.3f} is below --min-kappa {args.min_kappa}", file=sys.stderr)
        return 1
    return 0


def run_adversarial(args) -> int:
    import random

    from postrl.rewards.checks.hacks import run_hacks
    from postrl.rewards.checks.reward_check import domain_reward

    with recipe_domain(args) as (domain, weights):
        tasks = problems(domain, args.n, random.Random(0))
        spec = domain.verifier.extract_spec if isinstance(domain, HasVerifier) else "none"
        code = isinstance(domain, DeclaresComponents) and "tests" in domain.reward_components
        results = run_hacks(domain_reward(domain, weights), tasks, spec, code=code)
    rows = [{"hack": r.hack, "tried": r.applied, "paid": r.paid, "paid_rate": r.paid_rate,
             "mean_reward": r.mean_reward} for r in results]
    if args.json:
        print(json.dumps({"domain": args.domain, "extract": spec, "hacks": rows}))
        return 0
    print(f"domain {args.domain} (answers read with `{spec}`): {len(tasks)} problems per hack")
    print(f"{'hack':<20}{'tried':>7}{'paid':>7}{'paid rate':>11}{'mean reward':>13}")
    for r in rows:
        flag = "   <- pays" if r["paid"] else ""
        print(f"{r['hack']:<20}{r['tried']:>7}{r['paid']:>7}{r['paid_rate']:>11.0%}{r['mean_reward']:>13.3f}{flag}")
    high = [r["hack"] for r in rows if r["paid_rate"] >= 0.5]
    if high:
        print(f"warning: the reward pays for {', '.join(high)} on half the problems or more: "
              "RL will find these before it finds the skill", file=sys.stderr)
    return 0


def problems(domain, n: int, rng) -> list:
    """Up to n distinct problems of the domain (training draws; a data set domain's rows)."""
    seen: dict[str, object] = {}
    for _ in range(20 * n):
        task = domain.sample(rng)
        seen.setdefault(task.task_id, task)
        if len(seen) >= n:
            break
    return list(seen.values())


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
