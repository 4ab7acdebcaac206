"""Every policy-gradient objective postrl has, side by side on the same problems: which one wins where.

    nice .venv/bin/python benchmarks/algorithms.py             # 2 tasks x 9 objectives x 3 seeds (<= 45 min)
    nice .venv/bin/python benchmarks/algorithms.py --quick     # 1 seed, 4 steps of 4 prompts, tiny evals: the smoke
    nice .venv/bin/python benchmarks/algorithms.py --only ppo  # one objective's runs (a sitting of its own)

Each run is `postrl.loop.train` on a task's recipe with one objective's overrides (OBJECTIVES), for the
same steps, prompts and samples, and the same held-out problems evaluated every `eval_every` steps
(the fixed held-out split of the task; the eval's sampling seed is the run's). Per (task, objective):

- final pass@1: the mean over seeds of the last eval's pass@1, with its standard error over the seeds;
- steps to reach the task's target pass@1 (TASKS, fixed before any run): the first eval step at which
  the mean over seeds reaches it ('-' if none does);
- entropy at the end: the mean per-token entropy of the last step's samples (`entropy` in metrics.jsonl);
- seconds a step: sampling + the scoring tail + the update (batch build included: reference
  log-probs, a critic's values) + dynamic sampling's extra rounds, from metrics.jsonl; evals excluded.

Tasks: `arith`, the default recipe (tiny-arith, 2-level sums with carry, 8 tokens), and `tool_use`, the
`mul` task with the calculator tool on tiny-calc (multi-turn episodes, the model's turns trained, the
tool's tokens masked), the recipe of benchmarks/tool_use_gain.py at a smaller batch. Each run writes
its record (curve, entropy, seconds) to --out/<task>/<objective>/seed<k>.json as it ends; a later call
reuses every record already there (sittings add up), and `--fresh` reruns. The table and the SVG plot
(pass@1 against steps, one line an objective, the mean over seeds) go under --out; docs/algorithms.md
holds the measured table and the reading of it.

Ends with `RESULT best_objective=<name> target=-` (the highest mean final pass@1 over the two tasks)
and `RESULT grpo_rank=<k> target=-` (GRPO's place in that order, 1 = best).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from _harness import Bench, parser, timed, write_plot, write_record

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.files import write_atomic
from postrl.loop import train
from postrl.monitor.sinks import read_metrics

OBJECTIVES: dict[str, list[str]] = {
    # today's default: group-normalised advantages, PPO-clip with clip-higher, token-mean
    "grpo": [],
    # Dr. GRPO: no std division, every completion's token sum over the generation budget
    "dr_grpo": ["rl.scale_by_std=false", "rl.loss_agg=seq-mean-token-sum-norm"],
    "rloo": ["rl.advantage=rloo"],
    # GSPO: one clipped ratio a sequence, the paper's narrow ranges, per-sequence means
    "gspo": ["rl.loss=gspo", "rl.loss_agg=seq-mean-token-mean", "rl.clip_low=3e-4", "rl.clip_high=4e-4"],
    # CISPO: the weight clipped above only (MiniMax-M1: no lower bound), every token keeps its gradient
    "cispo": ["rl.loss=cispo", "rl.clip_low=1.0"],
    # DAPO: dynamic sampling (a cap of 2 extra rounds) and the soft overlong penalty, token-mean, clip-higher
    "dapo": ["curriculum.dynamic_sampling=true", "curriculum.max_extra_draws=2", "rl.overlong_buffer={buffer}"],
    # REINFORCE++: batch-normalised advantages, the KL in the reward
    "reinforce_pp": ["rl.advantage=reinforce_pp", "rl.kl_in=reward"],
    # PPO with a learned value model: a value head on a copy of the policy, GAE
    "ppo": ["rl.advantage=gae", "critic.model=policy"],
}


@dataclass(frozen=True)
class Task:
    recipe: str | None
    overrides: list[str]
    steps: int
    eval_every: int
    target: float
    """pass@1 the 'steps to target' column counts to, fixed before the measured runs (from one
    calibration run of grpo: arith 0.14 -> 0.59 in 30 steps of 16 prompts, tool_use 0.26 -> 0.55
    at its best eval in 12 steps of 8)."""
    overlong_buffer: int
    """DAPO's soft overlong buffer: a quarter of max_new_tokens (DAPO: 4k of 20k tokens)."""


TASKS = {
    "arith": Task("default", ["eval.num_problems=200", "eval.samples_per_problem=4", "eval.k=[1]"],
                  steps=60, eval_every=10, target=0.65, overlong_buffer=2),
    "tool_use": Task(None, ["model.name=tiny-calc", "domains={mul: {tools: [calculator], max_turns: 2}}",
                            "train.prompts_per_step=16", "train.samples_per_prompt=8", "train.max_new_tokens=90",
                            "train.lr=1e-3", "train.minibatches=1", "eval.num_problems=200",
                            "eval.samples_per_problem=2", "eval.k=[1]"],
                     steps=20, eval_every=5, target=0.45, overlong_buffer=20),
}
SEEDS = (0, 1, 2)


def run_one(task_name: str, objective: str, seed: int, steps: int, eval_every: int, run_dir: Path,
            quick: bool) -> dict:
    """Train once; the record: pass@1 by eval step, the last step's entropy, seconds a step."""
    task = TASKS[task_name]
    overrides = [*task.overrides, *(o.format(buffer=task.overlong_buffer) for o in OBJECTIVES[objective])]
    if quick:  # the smoke: the same code paths on a few prompts and problems
        overrides += ["train.prompts_per_step=4", "eval.num_problems=8", "eval.samples_per_problem=1"]
    overrides += [f"seed={seed}", f"train.total_steps={steps}", f"eval.every_steps={eval_every}",
                  "eval.at_start=true", f"run.dir={run_dir}", "run.overwrite=true", "run.progress=false",
                  "checkpoint.every_steps=0", "run.threads=1"]
    cfg = load_config(task.recipe, overrides)
    with timed() as t:
        train(cfg, log=lambda *a: None)
    curve = {}
    for path in sorted((run_dir / "eval").glob("step_*.json")):
        scores = json.loads(path.read_text())
        curve[int(path.stem.split("_")[1])] = statistics.fmean(d["pass@1"] for d in scores.values())
    metrics = read_metrics(run_dir)
    last = metrics[max(metrics)]
    parts = ("time/sample_s", "time/reward_tail_s", "time/update_s", "time/refill_s")
    step_s = statistics.fmean(sum(m.get(k, 0.0) for k in parts) for m in metrics.values())
    return {"task": task_name, "objective": objective, "seed": seed, "steps": steps, "curve": curve,
            "entropy": last.get("entropy", float("nan")), "step_s": step_s, "wall_s": t.seconds,
            "overrides": overrides}


def mean_se(values: list[float]) -> tuple[float, float]:
    m = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return m, se


def summarise(records: list[dict], target: float) -> dict:
    """Over the seeds of one (task, objective)."""
    curves = [{int(s): v for s, v in r["curve"].items()} for r in records]  # JSON keys are strings
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    mean_curve = {s: statistics.fmean(c[s] for c in curves) for s in steps}
    final, se = mean_se([c[steps[-1]] for c in curves])
    reach = next((s for s in steps if mean_curve[s] >= target), None)
    return {"final": final, "se": se, "reach": reach, "curve": mean_curve,
            "entropy": statistics.fmean(r["entropy"] for r in records),
            "step_s": statistics.fmean(r["step_s"] for r in records), "seeds": len(records)}


def main(argv: list[str]) -> int:
    p = parser(__doc__, out="", out_help="records, table and plots (default: a temporary directory)",
               quick="1 seed, 4 steps, 8 eval problems: the smoke")
    p.add_argument("--only", nargs="*", default=[], help="objectives to run (default: all)")
    p.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, default=len(SEEDS), help="seeds per (task, objective)")
    p.add_argument("--fresh", action="store_true", help="rerun runs whose record exists")
    args = p.parse_args(argv)
    bench = Bench(__file__, args)
    unknown = sorted(set(args.only) - set(OBJECTIVES))
    if unknown:
        p.error(f"unknown objective(s) {', '.join(unknown)}; known: {', '.join(OBJECTIVES)}")
    objectives = args.only or list(OBJECTIVES)
    seeds = SEEDS[:1] if args.quick else SEEDS[: args.seeds]
    torch.set_num_threads(1)  # a sub-1M-parameter model loses much to a second thread on a shared machine
    out = Path(args.out or tempfile.mkdtemp(prefix="algorithms-"))
    for task in args.tasks:  # pretrained and cached on first use: not counted
        load_model("tiny-calc" if task == "tool_use" else "tiny-arith")
    results: dict[str, dict[str, dict]] = {}
    for task_name in args.tasks:
        task = TASKS[task_name]
        steps, every = (4, 2) if args.quick else (task.steps, task.eval_every)
        for objective in OBJECTIVES:
            records = []
            for seed in seeds:
                path = out / task_name / objective / f"seed{seed}.json"
                if path.exists() and not args.fresh:
                    rec = json.loads(path.read_text())
                elif objective in objectives:
                    rec = write_record(path, run_one(task_name, objective, seed, steps, every,
                                                     out / "runs" / task_name / objective / f"seed{seed}",
                                                     args.quick), bench.commit)
                    print(f"{task_name} {objective} seed {seed}: pass@1 {rec['curve']} "
                          f"({rec['wall_s']:.0f} s)", flush=True)
                else:
                    continue
                records.append(rec)
            if records:
                results.setdefault(task_name, {})[objective] = summarise(records, task.target)
    missing = [f"{t}/{o}" for t in args.tasks for o in OBJECTIVES if o not in results.get(t, {})]
    report(bench, results, out, missing)
    return 0


def report(bench: Bench, results: dict[str, dict[str, dict]], out: Path, missing: list[str]) -> None:
    lines = []
    for task_name, by_obj in results.items():
        task = TASKS[task_name]
        lines += [f"\n{task_name}: final pass@1 over seeds (+/- 1 SE), steps to pass@1 >= {task.target}",
                  "| objective | final pass@1 | steps to target | entropy at the end | s a step |",
                  "|---|---|---|---|---|"]
        for name, s in sorted(by_obj.items(), key=lambda kv: -kv[1]["final"]):
            lines.append(f"| {name} | {s['final']:.3f} +/- {s['se']:.3f} ({s['seeds']} seeds) | "
                         f"{s['reach'] if s['reach'] is not None else '-'} | {s['entropy']:.3f} | {s['step_s']:.2f} |")
        write_plot(out / f"algorithms_{task_name}.svg", f"held-out pass@1, {task_name} (mean over seeds)",
                   "pass@1", {name: sorted(s["curve"].items()) for name, s in by_obj.items()})
    text = "\n".join(lines)
    print(text)
    write_atomic(out / "table.md", text + "\n")
    print(f"\nrecords, table and plots under {out}; this call: {bench.clock.seconds / 60:.1f} min")
    if missing:
        print(f"missing (run them with --only): {', '.join(missing)}")
    # rank by the mean over the tasks measured of the final pass@1
    names = set.intersection(*(set(by) for by in results.values())) if results else set()
    ranked = sorted(names, key=lambda n: -statistics.fmean(results[t][n]["final"] for t in results))
    if ranked:
        bench.result("best_objective", ranked[0], target="-")
    if "grpo" in ranked:
        bench.result("grpo_rank", ranked.index("grpo") + 1, target="-")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
