"""Does RL make SmolLM2-135M-Instruct better at arithmetic, without hurting something else?

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/smollm2_gain.py [RECIPE] [dotted.key=value ...]

1. held-out pass@1 / pass@8 (and greedy) of the base model on the recipe's domain
   (recipes/smollm2-arith.yaml: chat_arith) and on a second domain it is *not* trained on
   (chat_count: reasoning-gym letter counting, graded by the same last-integer rule);
2. trains with postrl's own loop (`postrl.train.train`) as the recipe says;
3. loads the trained policy from the run's `final/` directory (the merged LoRA checkpoint, as
   `AutoModelForCausalLM.from_pretrained` sees it) and measures both domains again, on the same
   problems with the same sampling seeds;
4. prints the table and `RESULT pass@1_gain=<points> target=0.10`.

Noise: each domain's change is a paired difference over the same problems; its standard error
is std(per-problem difference) / sqrt(problems). "No drop beyond noise" on the untrained domain
means the pass@1 change is above -2 standard errors. Not a test: it takes about an hour on 2 cores.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from postrl.algo.passk import pass_at_k
from postrl.config import load_config
from postrl.evaluate import count_correct
from postrl.models import load_model
from postrl.policy.policy import Policy
from postrl.tasks.catalog import make_domain
from postrl.train import train

SECOND_DOMAIN = ("chat_count", {"levels": [0]})  # held out: half as many problems as the trained domain

TARGET_GAIN = 0.10


def measure(policy: Policy, suites: dict, cfg) -> dict:
    out = {}
    for name, (domain, tasks) in suites.items():
        t0 = time.perf_counter()
        g, c = count_correct(policy, domain, tasks, cfg.eval.samples_per_problem, cfg.eval.temperature,
                           cfg.train.max_new_tokens, cfg.seed)
        out[name] = {"greedy": g, "correct": c}
        print(f"  {name}: {summary(out[name], cfg.eval.samples_per_problem)} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    return out


def summary(r: dict, n: int) -> str:
    s = scores(r, n)
    return f"greedy={s['greedy']:.3f} pass@1={s['pass@1']:.3f} pass@8={s['pass@8']:.3f}"


def scores(r: dict, n: int) -> dict[str, float]:
    k8 = min(8, n)
    return {
        "greedy": sum(r["greedy"]) / len(r["greedy"]),
        "pass@1": sum(pass_at_k(n, c, 1) for c in r["correct"]) / len(r["correct"]),
        "pass@8": sum(pass_at_k(n, c, k8) for c in r["correct"]) / len(r["correct"]),
    }


def paired_se(before: dict, after: dict, n: int) -> float:
    """Standard error of the mean per-problem change in pass@1 (same problems before and after)."""
    diffs = [(a - b) / n for a, b in zip(after["correct"], before["correct"])]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    return math.sqrt(var / len(diffs))


def main(argv: list[str]) -> int:
    recipe = argv[0] if argv and argv[0].endswith(".yaml") else "recipes/smollm2-arith.yaml"
    overrides = [a for a in argv if "=" in a]
    # the loop's own end-of-run eval is kept tiny: this script measures before and after itself
    cfg = load_config(recipe, overrides + ["eval.num_problems=4", "eval.samples_per_problem=2", "eval.k=[1]", "run.progress=false"])
    bench = load_config(recipe, overrides)
    [(train_name, dcfg)] = cfg.domains.items()
    suites = {
        train_name: (d := make_domain(train_name, dcfg.params, cfg.seed), d.heldout(bench.eval.num_problems)),
        SECOND_DOMAIN[0]: (d2 := make_domain(*SECOND_DOMAIN, cfg.seed), d2.heldout(bench.eval.num_problems // 2)),
    }
    t0 = time.perf_counter()
    print(f"base model {cfg.model.name}:", flush=True)
    base = measure(Policy(*load_model(cfg.model.name, cfg.model.dtype, log=lambda *_: None)), suites, bench)
    t1 = time.perf_counter()
    run_dir = train(cfg, log=lambda *_: None)
    t2 = time.perf_counter()
    print(f"trained {cfg.train.total_steps} steps in {t2 - t1:.0f} s -> {run_dir}; trained policy {run_dir / 'final'}:")
    after = measure(Policy(*load_model(str(run_dir / "final"), cfg.model.dtype, log=lambda *_: None)), suites, bench)
    report(base, after, bench, train_name, run_dir, time.perf_counter() - t0)
    return 0


def report(base: dict, after: dict, cfg, train_name: str, run_dir: Path, seconds: float) -> None:
    n = cfg.eval.samples_per_problem
    print(f"\nheld-out, T={cfg.eval.temperature}, {n} samples/problem, max {cfg.train.max_new_tokens} new tokens")
    print("| domain | problems | greedy before -> after | pass@1 before -> after (+/- 2 SE) | pass@8 before -> after |")
    print("|---|---|---|---|---|")
    for name in base:
        b, a, se = scores(base[name], n), scores(after[name], n), paired_se(base[name], after[name], n)
        role = "trained" if name == train_name else "not trained"
        print(f"| {name} ({role}) | {len(base[name]['correct'])} | {b['greedy']:.3f} -> {a['greedy']:.3f} | "
              f"{b['pass@1']:.3f} -> {a['pass@1']:.3f} ({a['pass@1'] - b['pass@1']:+.3f} +/- {2 * se:.3f}) | "
              f"{b['pass@8']:.3f} -> {a['pass@8']:.3f} |")
    other = [k for k in base if k != train_name][0]
    drop = scores(after[other], n)["pass@1"] - scores(base[other], n)["pass@1"]
    ok = drop >= -2 * paired_se(base[other], after[other], n)
    print(f"untrained domain {other}: pass@1 change {drop:+.3f} ({'within' if ok else 'BEYOND'} noise); "
          f"run {run_dir}; total {seconds / 60:.1f} min")
    gain = scores(after[train_name], n)["pass@1"] - scores(base[train_name], n)["pass@1"]
    print(f"RESULT pass@1_gain={gain:.3f} target={TARGET_GAIN:.2f}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
