"""`postrl plan --hardware cpu` against the step times postrl's own loop measures on this machine.

    .venv/bin/python benchmarks/plan_vs_measured.py [--steps-tiny 8] [--steps-smollm2 4] [--threads 1] [--only tiny]

Two recipes, each with the same overrides for the prediction and the run:
  tiny      recipes/default.yaml: tiny-arith, every weight trained;
  smollm2   recipes/smollm2-arith.yaml: SmolLM2-135M-Instruct with LoRA, at 4 prompts per step (32
            completions) instead of 16, so that a step takes ~25 s on one core, not ~100 s.
Both on `--threads` torch threads (default 1: on a 2-core machine that another process shares, two
threads wait on each other whenever one is descheduled, and a step's time swings by several
times), with a small final eval, which is not compared.

For each, first the prediction (`postrl.cost`, as `postrl plan --hardware cpu` makes it: the CPU
probe and the measurement on the narrow copy run now, in this process), then the real loop
(`postrl.loop.train`) for a few steps. Measured per step: sampling from the run's metrics
(`time/sample_s`), the reference pass as `Learner.build_batch` (the reference log-probs plus the
advantages), the update as `Learner.update` (both timed around the calls), the step as the wall
time between consecutive steps' ends (everything the loop does, scoring and the books included).
Step 0 (first-call allocations, the engine's start) is left out; each figure is the median of the
other steps.

The plan does not know what the model will answer: it takes every completion to max_new_tokens
and every sample's completion as its own (an upper bound). The run's answers are shorter, and a
peaked model's samples of one prompt often agree, which the fused forward computes once. So the
table has two predictions: `plan` (the upper bound, as `postrl plan` prints it) and `workload`
(the same cost model, told the run's mean completion length and the share of completion tokens that
were distinct prefixes, in the batch and in a minibatch of shuffled rows, read from its rollouts). The second is the cost
model's own error; the RESULT line is about it:
`RESULT plan_step_error_max=<max over the recipes of |pred - meas| / meas of the step> target<=0.35`,
and `upper_bound_step_error_max=...` says how far the plain plan is.
The machine is shared: the load average before and after each recipe is printed; state it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _harness import Bench, load_avg, parser  # benchmarks/, on the path when this script runs

from postrl import loop as loop_module
from postrl import run as run_module
from postrl.config.loading import load_config
from postrl.config.schema import Config
from postrl.cost.hardware import hardware
from postrl.cost.host import host_times
from postrl.cost.shape import matmul_shapes, model_facts, workload
from postrl.cost.step import StepCost, step_cost
from postrl.learner.learner import Learner
from postrl.store.rollouts import read_rows

QUIET = ["run.progress=false", "eval.num_problems=8", "eval.samples_per_problem=1", "eval.k=[1]"]
RECIPES = {
    "tiny": ("postrl/recipes/default.yaml", []),
    "smollm2": ("postrl/recipes/smollm2-arith.yaml", ["train.prompts_per_step=4"]),
}
PHASES = ("sampling", "reference", "update", "step")


def phases(step: StepCost) -> dict[str, float]:
    return {"sampling": step.sampling_s + step.sync_s, "reference": step.reference_s, "update": step.update_s,
            "step": step.step_s}


def measure(cfg: Config) -> tuple[dict[str, float], Path]:
    """Median seconds per phase of the real loop's steps after the first, and the run directory."""
    timed: dict[str, list[float]] = {"reference": [], "update": []}
    ends: list[float] = []
    originals = Learner.build_batch, Learner.update, run_module.crash_point

    def timing(method, key: str):
        def call(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = method(self, *args, **kwargs)
            timed[key].append(time.perf_counter() - t0)
            return out
        return call

    Learner.build_batch, Learner.update = timing(originals[0], "reference"), timing(originals[1], "update")
    run_module.crash_point = lambda point: ends.append(time.perf_counter()) if point == "step.stored" else None
    try:
        run_dir = Path(loop_module.train(cfg, log=lambda *a: None))
    finally:
        Learner.build_batch, Learner.update, run_module.crash_point = originals
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "sampling": statistics.median(m["time/sample_s"] for m in metrics[1:]),
        "reference": statistics.median(timed["reference"][1:]),
        "update": statistics.median(timed["update"][1:]),
        "step": statistics.median(b - a for a, b in zip(ends, ends[1:])),
    }, run_dir


def realised(run_dir: Path, minibatches: int) -> tuple[float, float, float]:
    """(mean completion tokens, share of them that are distinct prefixes in their step's batch, the
    same within a minibatch: the step's rows shuffled into `minibatches` parts, as the update does)
    over the steps after the first, from the run's rollouts."""
    lengths, shares, minibatch_shares = [], [], []
    rows = [r for r in read_rows(run_dir) if r.step > 0]
    for step in sorted({r.step for r in rows}):
        these = [r for r in rows if r.step == step]
        tokens = sum(len(r.token_ids) for r in these)
        lengths.append(tokens / len(these))
        shares.append(distinct_prefixes(these) / tokens)
        random.Random(step).shuffle(these)
        size = len(these) // minibatches
        minibatch_shares.append(sum(distinct_prefixes(these[i : i + size]) for i in range(0, len(these), size)) / tokens)
    return statistics.mean(lengths), statistics.mean(shares), statistics.mean(minibatch_shares)


def distinct_prefixes(rows: list) -> int:
    """Completion tokens the fused forward computes for `rows`: their distinct prefixes."""
    return len({tuple(r.prompt_ids) + tuple(r.token_ids[: k + 1]) for r in rows for k in range(len(r.token_ids))})


def compare(name: str, cfg: Config) -> list[tuple[str, str, float, float, float]]:
    """(recipe, phase, plan s, workload s, measured s) rows for one recipe."""
    model, tok = model_facts(cfg)
    work = workload(cfg, tok)
    hw = hardware("cpu", cfg.run.threads, matmul_shapes(cfg, model, work), cfg.model.dtype)
    host = host_times(cfg, model, work, tok, on_cpu=True)
    print(f"  plan: matmul {hw.flops / 1e9:.1f} GFLOP/s (decode {hw.rate('decode') / 1e9:.1f}, head "
          f"{hw.rate('head') / 1e9:.1f}), copy "
          f"{hw.bandwidth / 1e9:.1f} GB/s, prompts {work.prompt_tokens:.1f} tokens; measured on the narrow copy: "
          f"{host.decode_step * 1e3:.1f} ms a decode step, batch {host.reference:.3f} s, update {host.update:.3f} s",
          flush=True)
    plan = phases(step_cost(cfg, model, work, hw, host))
    measured, run_dir = measure(cfg)
    length, share, minibatch_share = realised(run_dir, cfg.train.minibatches)
    run_work = dataclasses.replace(work, completion_tokens=length, distinct_share=share,
                                   minibatch_distinct_share=minibatch_share)
    told = phases(step_cost(cfg, model, run_work, hw, host))
    print(f"  load average after: {os.getloadavg()[0]:.2f}; completions {length:.1f} tokens on average of "
          f"{cfg.train.max_new_tokens}; distinct prefixes: {share:.0%} of their tokens in a batch, "
          f"{minibatch_share:.0%} in a minibatch", flush=True)
    return [(name, phase, plan[phase], told[phase], measured[phase]) for phase in PHASES]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--steps-tiny", type=int, default=8)
    ap.add_argument("--steps-smollm2", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of both runs (run.threads)")
    ap.add_argument("--only", choices=sorted(RECIPES), help="one recipe")
    args = ap.parse_args(argv)
    bench = Bench(__file__, args)
    steps = {"tiny": args.steps_tiny, "smollm2": args.steps_smollm2}
    rows = []
    with tempfile.TemporaryDirectory(prefix="plan-vs-measured-") as tmp:
        for name, (recipe, overrides) in RECIPES.items():
            if args.only and name != args.only:
                continue
            overrides = [*overrides, f"run.threads={args.threads}", f"train.total_steps={steps[name]}"]
            cfg = load_config(recipe, [*QUIET, *overrides, f"run.dir={tmp}/{name}"])
            print(f"{name}: {recipe} {' '.join(overrides)}; load average "
                  f"{load_avg():.2f}", flush=True)
            rows += compare(name, cfg)
            torch.set_num_threads(os.cpu_count() or 1)
    print(f"\n{'recipe':8} {'phase':10} {'plan s':>9} {'workload s':>11} {'measured s':>11} {'plan err':>9} "
          f"{'workload err':>13}")
    for name, phase, plan, told, meas in rows:
        print(f"{name:8} {phase:10} {plan:9.3f} {told:11.3f} {meas:11.3f} {(plan - meas) / meas:+9.0%} "
              f"{(told - meas) / meas:+13.0%}")
    steps_only = [r for r in rows if r[1] == "step"]
    print(f"wall {bench.clock.seconds:.0f} s")
    print(f"upper_bound_step_error_max={max(abs(p - m) / m for _, _, p, _, m in steps_only):.3f}")
    bench.result("plan_step_error_max", f"{max(abs(t - m) / m for _, _, _, t, m in steps_only):.3f}", target="<=0.35")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
