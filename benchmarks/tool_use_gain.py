"""Tool use: a tiny model learns by RL to call the calculator on a task it cannot do in its head.

    nice .venv/bin/python benchmarks/tool_use_gain.py [--steps 30] [--problems 200] [--samples 4]

The task is `mul` (3-digit x 2-digit products, `postrl.tasks.mul`). The base model is `tiny-calc`,
which postrl pretrains (`postrl.pretrain.CalcPretrainSpec`, cached on first use; pretraining is
not counted): in its corpus 30% of the answers call the calculator and copy its result, the
rest are estimates in its head (two significant digits), so it can use the tool but mostly does
not, and its estimates are almost never exact.

1. held-out pass@1 and tool-call rate of the base model, with tools (`tools: [calculator]`,
   `max_turns: 2`) and without (the control: the same task, the same model, no tool);
2. RL with postrl's own loop (`postrl.loop.train`) for --steps steps, once with tools and once
   without (the control run), each timed;
3. the trained policies measured again on the same problems with the same sampling seeds;
4. a table, then `RESULT pass@1_gain=<points> target=0.30`.

Targets (issue 16): with tools, pass@1 up by at least 0.30 in at most 10 minutes of RL on 2 CPU
cores; the control's pass@1 within 2 paired standard errors of its base.
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import torch
from _harness import Bench, parser, timed  # benchmarks/, on the path when this script runs

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.evaluation import play
from postrl.loop import train
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import build_domains

TARGET_GAIN = 0.30
TARGET_MINUTES = 10
TURN_TOKENS = 90  # a tool call is ~80 characters


def recipe(run_dir: Path, tools: bool, steps: int) -> list[str]:
    domain = "{mul: {tools: [calculator], max_turns: 2}}" if tools else "{mul: {}}"
    return [
        "model.name=tiny-calc", f"domains={domain}", f"run.dir={run_dir}", "seed=0",
        f"train.total_steps={steps}", "train.prompts_per_step=16", "train.samples_per_prompt=8",
        f"train.max_new_tokens={TURN_TOKENS}", "train.lr=1e-3", "train.minibatches=1", "rl.kl_coef=0.01",
        "eval.every_steps=0", "eval.at_start=false", "eval.num_problems=8", "eval.samples_per_problem=1",
        "eval.k=[1]", "checkpoint.every_steps=0", "run.progress=false", "run.threads=2",
        "monitor.spot_check_every_steps=10",
    ]


def measure(policy: Policy, domain, tasks, samples: int) -> dict:
    """Per problem: correct samples; and the share of samples (episodes) that called a tool."""
    generator = torch.Generator().manual_seed(1234)
    out, scores = play(policy, domain, tasks, samples, GenParams(TURN_TOKENS, temperature=1.0), generator)
    correct = [0] * len(tasks)
    for s, sc in zip(out, scores):
        correct[s.group] += bool(sc.correct)
    calls = [s.episode is not None and s.episode.tool_calls > 0 for s in out]
    return {"correct": correct, "tool_call_rate": sum(calls) / len(calls), "n": samples}


def pass1(r: dict) -> float:
    return sum(c / r["n"] for c in r["correct"]) / len(r["correct"])


def paired_se(before: dict, after: dict) -> float:
    diffs = [(a - b) / before["n"] for a, b in zip(after["correct"], before["correct"])]
    mean = sum(diffs) / len(diffs)
    return math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1) / len(diffs))


def arm(name: str, tools: bool, args, out_dir: Path) -> tuple[dict, dict, float]:
    """(before, after, RL seconds) of one arm."""
    cfg = load_config(None, recipe(out_dir / name, tools, args.steps))
    domain = build_domains(cfg)["mul"]
    tasks = domain.heldout(args.problems)
    model, tok = load_model("tiny-calc")
    before = measure(Policy(model, tok), domain, tasks, args.samples)
    print(f"{name}: base pass@1 {pass1(before):.3f}, tool-call rate {before['tool_call_rate']:.3f}", flush=True)
    with timed() as t:
        run_dir = train(cfg, log=lambda *a: None)
    seconds = t.seconds
    model, tok = load_model(str(run_dir / "final"))
    after = measure(Policy(model, tok), domain, tasks, args.samples)
    print(f"{name}: after {args.steps} RL steps ({seconds / 60:.1f} min) pass@1 {pass1(after):.3f}, "
          f"tool-call rate {after['tool_call_rate']:.3f}", flush=True)
    return before, after, seconds


def main(argv: list[str]) -> int:
    p = parser(__doc__, out="", out_help="run directories under this (default: a temp dir)")
    p.add_argument("--steps", type=int, default=30, help="RL steps per arm")
    p.add_argument("--problems", type=int, default=200, help="held-out problems")
    p.add_argument("--samples", type=int, default=4, help="samples per problem (pass@1 is their mean)")
    args = p.parse_args(argv)
    bench = Bench(__file__, args)
    torch.set_num_threads(2)
    load_model("tiny-calc")  # pretrained and cached on first use: not counted
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="tool_use_gain-"))
    results = {name: arm(name, tools, args, out_dir) for name, tools in (("tools", True), ("control", False))}
    print(f"\nheld-out: {args.problems} problems x {args.samples} samples, T=1.0; runs under {out_dir}")
    print("| arm | RL steps | RL minutes | pass@1 before -> after (+/- 2 SE) | tool-call rate before -> after |")
    print("|---|---|---|---|---|")
    for name, (before, after, seconds) in results.items():
        gain, se = pass1(after) - pass1(before), paired_se(before, after)
        print(f"| {name} | {args.steps} | {seconds / 60:.1f} | {pass1(before):.3f} -> {pass1(after):.3f} "
              f"({gain:+.3f} +/- {2 * se:.3f}) | {before['tool_call_rate']:.3f} -> {after['tool_call_rate']:.3f} |")
    before, after, seconds = results["tools"]
    c_before, c_after, _ = results["control"]
    c_change, c_se = pass1(c_after) - pass1(c_before), paired_se(c_before, c_after)
    print(f"control: pass@1 change {c_change:+.3f}, "
          f"{'within' if abs(c_change) <= 2 * c_se else 'OUTSIDE'} 2 SE ({2 * c_se:.3f})")
    print(f"tools: RL {seconds / 60:.1f} min (target <= {TARGET_MINUTES})")
    bench.result("pass@1_gain", f"{pass1(after) - pass1(before):.3f}", target=f"{TARGET_GAIN:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
