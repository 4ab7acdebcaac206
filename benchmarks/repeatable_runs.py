"""Does a real-model run repeat? The same recipe trained twice, each time in a process of its own,
with the shared-prefix gather's backward as it was (indexing) and as postrl runs it now (`take_rows`).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/repeatable_runs.py [--recipe R] [--steps 2] [--prompts 4] [--out DIR]

FastLM runs a group's shared prompt once and spreads its states to the group's rows with a gather;
the backward of that gather sums each shared position's gradient over the rows that read it. With
indexing (`t[index]`) that sum is `index_put_(accumulate=True)`, which on the CPU adds from two
threads at once in whatever order they get there, so the learner's gradients differed in their last
bits from one run to the next and the two runs of a recipe drew other samples a few steps on
(found in issue 46 on SmolLM2: step-0 losses 0.117331773 / 0.117331777 / 0.117331780 in three runs
of the same batch). `take_rows` gathers with `index_select` on the CPU, whose backward adds in index
order.

Each arm trains the recipe (default: the joint recipe, SmolLM2-135M with LoRA; `--prompts` prompts
x the recipe's samples a step, in-run eval off) twice for `--steps` steps, the four runs one after
the other. Two runs of an arm are compared field by field: each step's metrics (times, throughput
and memory left out), each step's completions (from the rollout store) and the final adapter
weights, bit for bit. The learner's update seconds of both arms are printed beside them (same
sitting, so the ratio is the comparison). Prints the table and

    RESULT rerun_weight_max_diff=<largest |difference| between the two take_rows runs' final weights> target=0
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from _harness import Bench, load_avg, parser, timed  # benchmarks/, on the path when this script runs
from safetensors.torch import load_file

import postrl
from postrl.model import fastlm, logprobs
from postrl.store.query import query

ARMS = ("indexing", "take_rows")
VOLATILE = ("time/", "pipeline/", "tokens_per_s", "learner/peak_mib")
"""Metrics that measure the machine, not the run: left out of the comparison."""


def train_run(arm: str, recipe: str, steps: int, prompts: int, run_dir: Path) -> None:
    """In this process: one run of `arm` into `run_dir`."""
    if arm == "indexing":  # the gather as it was: its backward accumulates from several threads
        def indexing(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            return t[index]

        fastlm.take_rows = logprobs.take_rows = indexing
    overrides = [f"train.total_steps={steps}", f"train.prompts_per_step={prompts}", "eval.at_start=false",
                 "eval.every_steps=0", f"run.dir={run_dir}", "run.progress=false", "run.overwrite=true"]
    postrl.train(recipe, overrides, log=lambda *_: None)


def run(arm: str, n: int, args: argparse.Namespace, out: Path) -> dict:
    """Run `n` of `arm` in a process of its own: its steps' metrics, completions and final weights."""
    run_dir = out / f"{arm}-{n}"
    with timed() as t:
        subprocess.run([sys.executable, __file__, "--recipe", args.recipe, "--steps", str(args.steps),
                        "--prompts", str(args.prompts), "--out", str(out), "--arm", arm, "--run-dir", str(run_dir)],
                       check=True)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [m for m in metrics if "time/update_s" in m]
    rows = query(run_dir, "SELECT step, sample, completion FROM rollouts ORDER BY step, sample").rows
    weights = {}
    for f in sorted((run_dir / "final").rglob("*.safetensors")):
        weights |= {f"{f.name}:{k}": v for k, v in load_file(f).items()}
    print(f"  {arm} run {n}: {t.seconds:.0f} s wall; load {load_avg():.2f}", flush=True)
    return {"steps": steps, "completions": rows, "weights": weights, "wall": t.seconds}


def compare(a: dict, b: dict) -> dict:
    """Two runs of one arm, field by field."""
    same_metrics, first_diff = [], []
    for x, y in zip(a["steps"], b["steps"]):
        keys = sorted(k for k in x if not k.startswith(VOLATILE))
        differing = [k for k in keys if x.get(k) != y.get(k)]
        same_metrics.append(not differing)
        first_diff.append(f"{differing[0]} {x[differing[0]]!r} / {y[differing[0]]!r}" if differing else "")
    by_step: dict[int, list[bool]] = {}
    for (s, i, c), (s2, i2, c2) in zip(a["completions"], b["completions"]):
        by_step.setdefault(s, []).append((s, i, c) == (s2, i2, c2))
    diffs = [float((a["weights"][k].float() - b["weights"][k].float()).abs().max()) for k in a["weights"]]
    return {"same_metrics": same_metrics, "first_diff": first_diff,
            "same_completions": {s: f"{sum(v)}/{len(v)}" for s, v in sorted(by_step.items())},
            "weight_max_diff": max(diffs) if diffs else float("nan"),
            "same_tensor_names": a["weights"].keys() == b["weights"].keys()}


def main(argv: list[str]) -> int:
    ap = parser(__doc__, out="", out_help="where the four runs go (default: a temporary directory)")
    ap.add_argument("--recipe", default="recipes/smollm2-joint.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4, help="prompts a step (the recipe's samples each)")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # the child process of one run
    ap.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.arm:
        train_run(args.arm, args.recipe, args.steps, args.prompts, Path(args.run_dir))
        return 0
    bench = Bench(__file__, args)
    out = Path(args.out or tempfile.mkdtemp(prefix="repeatable_runs-"))
    print(f"{args.recipe}, {args.steps} steps x {args.prompts} prompts a run, two runs an arm, in {out}; "
          f"load {load_avg():.2f}", flush=True)
    runs = {arm: [run(arm, n, args, out) for n in (1, 2)] for arm in ARMS}
    print("\n| arm | step | metrics the same | first differing | completions the same | update s (run 1, 2) |")
    print("|---|---|---|---|---|---|")
    found = {}
    for arm, (a, b) in runs.items():
        found[arm] = c = compare(a, b)
        for i, (x, y) in enumerate(zip(a["steps"], b["steps"])):
            step = x["step"]
            print(f"| {arm} | {step} | {'yes' if c['same_metrics'][i] else 'no'} | {c['first_diff'][i] or '-'} | "
                  f"{c['same_completions'].get(step, '-')} | {x['time/update_s']:.1f}, {y['time/update_s']:.1f} |")
        print(f"| {arm} | final | | | | weights max abs diff {c['weight_max_diff']:.3g} |")

    def update(arm):
        return statistics.fmean(s["time/update_s"] for r in runs[arm] for s in r["steps"])

    print(f"\nlearner update, mean over both runs' steps: indexing {update('indexing'):.1f} s, take_rows "
          f"{update('take_rows'):.1f} s ({update('indexing') / update('take_rows'):.2f}x)")
    ours = found["take_rows"]
    bench.result("rerun_weight_max_diff", f"{ours['weight_max_diff']:.3g}", target=0)
    repeat = ours["same_tensor_names"] and ours["weight_max_diff"] == 0 and all(ours["same_metrics"])
    return 0 if repeat else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
