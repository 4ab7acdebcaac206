"""`make demo`: evaluate the tiny base model, post-train it with RL, evaluate again, compare.

    python -m postrl.demo [dotted.overrides ...]

Held-out greedy accuracy and pass@k (k = 1, 4, 8 from 16 samples per problem at the training
temperature) for the base and the trained policy, side by side. The point: RL turns pass@k
(the model *can* answer) into pass@1 and greedy accuracy (the model *does* answer).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.evaluation import evaluate
from postrl.loop import train
from postrl.sampling.policy import Policy
from postrl.seeding import set_threads
from postrl.tasks.catalog import build_domains

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "default.yaml"


def main(argv: list[str]) -> int:
    console = Console()
    cfg = load_config(RECIPE, ["eval.k=[1,4,8]", *argv])
    e = cfg.eval
    eval_kwargs = dict(
        num_problems=e.num_problems, ks=e.k, samples_per_problem=e.samples_per_problem,
        temperature=e.temperature, max_new_tokens=cfg.train.max_new_tokens, seed=cfg.seed,
    )
    set_threads(cfg.run.threads)
    console.rule("[bold]1. base model")
    model, tok = load_model(cfg.model.name, log=console.print)
    base = evaluate(Policy(model, tok, rollout=cfg.rollout), build_domains(cfg), **eval_kwargs)
    console.rule("[bold]2. RL post-training")
    t0 = time.perf_counter()
    run_dir = train(cfg, log=console.print)
    rl_seconds = time.perf_counter() - t0
    trained = json.loads((run_dir / "eval" / f"step_{cfg.train.total_steps}.json").read_text())
    console.rule("[bold]3. before / after (held-out)")
    for domain in base:
        console.print(comparison_table(domain, base[domain], trained[domain]))
    console.print(f"RL phase: {rl_seconds:.0f} s for {cfg.train.total_steps} steps (incl. final eval and report)")
    console.print(f"run directory: {run_dir}  (metrics.jsonl, tb/, rollouts/, eval/, final/)")
    console.print(f"report: {run_dir / 'report.html'}")
    return 0


def comparison_table(domain: str, base: dict, trained: dict) -> Table:
    n, s = base["n_problems"], base["samples_per_problem"]
    table = Table(title=f"{domain}: {n} held-out problems, {s} samples each")
    for col in ("metric", "base", "after RL", "change"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for key in [k for k in base if k == "greedy" or k.startswith("pass@")]:
        delta = trained[key] - base[key]
        table.add_row(key, f"{base[key]:.3f}", f"{trained[key]:.3f}", f"{delta:+.3f}")
    return table


if __name__ == "__main__":
    from postrl.errors import UserError

    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
