"""postrl eval MODEL_OR_RUN --domains arith --k 1,8 [--json]: held-out greedy accuracy and pass@k.

postrl eval MODEL_OR_RUN [--domains a,b] [--json] --recipe RECIPE [overrides]: the recipe's domains
and eval-only domains (eval.domains), with their parameters and generation limits, and the
recipe's eval settings (eval.k, eval.samples_per_problem, eval.num_problems, eval.temperature)."""

from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model on held-out problems", description=__doc__)
    p.add_argument("model", help="HF model directory, a run directory (uses its final/), or tiny-arith")
    p.add_argument("--domains", help="comma-separated domain names (default arith; with --recipe all of its own)")
    p.add_argument("--k", default="1,8", help="comma-separated k for pass@k")
    p.add_argument("--samples", type=int, default=16, help="samples per problem (n of the estimator)")
    p.add_argument("--problems", type=int, default=200, help="held-out problems per domain")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (with --recipe: sets its run.device)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--recipe", nargs="+", metavar="RECIPE [OVERRIDE]",
                   help="the recipe's domains with their parameters and its eval settings; dotted overrides "
                        "may follow it, e.g. --recipe r.yaml eval.num_problems=50")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                   help="a user module (name or .py file) that registers domains or verifiers (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    from postrl.builtin_models import load_model
    from postrl.errors import ConfigError, UserError
    from postrl.evaluation import evaluate
    from postrl.model.device import resolve_device
    from postrl.sampling.policy import Policy
    from postrl.tasks.catalog import make_domain
    from postrl.ui import Progress

    if args.recipe is not None or args.imports:
        return run_recipe(args)
    try:
        ks = [int(k) for k in args.k.split(",")]
    except ValueError:
        raise UserError(f"--k {args.k!r}: expected comma-separated integers such as 1,8") from None
    if max(ks) > args.samples:
        raise UserError(f"--k {args.k}: every k must be <= --samples ({args.samples})")
    model_path = args.model
    if (Path(model_path) / "final" / "config.json").is_file():
        model_path = str(Path(model_path) / "final")
    try:
        domains = {name: make_domain(name, {}, args.seed) for name in (args.domains or "arith").split(",")}
    except ConfigError as e:
        raise UserError(f"--domains {args.domains}: {e}") from None
    log = (lambda *a: None) if args.json else print
    device = resolve_device(args.device, "--device ")  # cuda asked for and absent: one line, before the model loads
    model, tok = load_model(model_path, log=log)
    with Progress(len(domains), enabled=None, label="eval", stderr=True) as bar:  # a bar on a terminal only
        result = evaluate(
            Policy(model.to(device), tok), domains, num_problems=args.problems, ks=ks, samples_per_problem=args.samples,
            temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed, progress=bar,
        )
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def run_recipe(args) -> int:
    from postrl.api import evaluate

    recipe, *overrides = args.recipe or [None]
    if args.device != "auto":
        overrides.append(f"run.device={args.device}")
    domains = args.domains.split(",") if args.domains else None
    result = evaluate(args.model, recipe, overrides, domains, args.imports,
                      log=(lambda *a: None) if args.json else print)
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)
    return 0


def print_table(result: dict[str, dict[str, float]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="held-out evaluation")
    cols = [k for k in next(iter(result.values())) if k == "greedy" or k.startswith("pass@")]
    table.add_column("domain")
    for c in cols:
        table.add_column(c, justify="right")
    for domain, r in result.items():
        table.add_row(domain, *(f"{r[c]:.3f}" for c in cols))
    Console().print(table)
