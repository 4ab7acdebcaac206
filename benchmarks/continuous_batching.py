"""Continuous batching against today's chunked engine, side by side: tokens/s on skewed lengths.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/continuous_batching.py [--prompts 32] [--group 8] [--slots 64]
        [--short 8] [--long 128] [--long-share 0.1] [--repeats 3] [--step-steps 8] [--step-runs 4] [--quick]

A call of more rows than slots (`rollout.max_num_seqs`): prompts of the default recipe's arithmetic
domain, `--group` rows each (a training step's layout), most rows limited to `--short` tokens and a
`--long-share` of them (at least one, drawn) to `--long`. EOS never ends a row, so every arm
generates exactly the same tokens: the work is fixed, only the schedule differs. The arms,
alternating `--repeats` times, the fastest of each kept (the machine is shared):

  chunks      today's engine as `Policy` runs such a call: `generate` on `--slots` rows at a time,
              one chunk after another, each until its longest row ends (finished rows compacted out)
  continuous  `generate_slots` with `--slots` slots: a finished row's slot goes to the next row
  one batch   (for scale) `generate` on every row at once, the KV cache of all of them

The model is the built-in `--model`'s architecture with random weights (nothing to pretrain: the
lengths are fixed, so the weights do not change the work). Then the default recipe, whose 256-row
calls fit in the default 512 slots, so that turning `rollout.continuous_batching` on must not
change its step time: one step's `Policy.sample` off and on, alternating in this process (the
part the switch touches, least exposed to a shared machine's load), and whole steps, `--step-runs`
runs of `--step-steps` steps an arm (`postrl.train`, alternating, on the same architecture
pretrained for one step; median seconds a step).

    RESULT default_step_sampling_ratio=<on / off> target=<=1.05
    RESULT default_step_time_ratio=<on / off> target=<=1.05
    RESULT continuous_batching_speedup=<continuous tokens/s / chunks tokens/s> target=>=1.3
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from _harness import Bench, load_avg, parser, timed  # benchmarks/, on the path when this script runs
from transformers import AutoModelForCausalLM

from postrl.api import train
from postrl.builtin_models import load_config_and_tokenizer
from postrl.config.loading import load_config
from postrl.curriculum.sampler import TaskSampler
from postrl.pretrain import BUILTIN_MODELS, pretrain
from postrl.sampling.continuous import generate_slots
from postrl.sampling.generate import GenParams, generate
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import build_domains

TARGET = 1.3
STEP_TARGET = 1.05
RECIPE = str(Path(__file__).resolve().parents[1] / "recipes" / "default.yaml")


def workload(tok, prompts: int, group: int, short: int, long: int, long_share: float, seed: int):
    """(prompt ids, one GenParams a row): the recipe's arithmetic prompts, `group` rows each; a
    `long_share` of the rows (at least one, drawn with `seed`) may run `long` tokens, the rest `short`."""
    cfg = load_config(RECIPE, [])
    weights = {name: d.weight for name, d in cfg.domains.items()}
    tasks = TaskSampler(build_domains(cfg), seed).next_batch(prompts, weights)
    rows = [tok(t.prompt)["input_ids"] for t in tasks for _ in range(group)]
    chosen = set(random.Random(seed).sample(range(len(rows)), max(1, round(long_share * len(rows)))))
    return rows, [GenParams(long if i in chosen else short, temperature=1.0) for i in range(len(rows))]


def sampling(model, tok, rows, params, slots: int, repeats: int) -> dict[str, float]:
    """Best seconds of each arm over `repeats` alternating rounds."""
    pad = tok.pad_token_id

    def chunks():
        gen = torch.Generator().manual_seed(0)
        for start in range(0, len(rows), slots):
            generate(model, rows[start : start + slots], params[start : start + slots], -1, pad, gen)

    def continuous():
        generate_slots(model, rows, params, -1, pad, torch.Generator().manual_seed(0), slots=slots)

    def one_batch():
        generate(model, rows, params, -1, pad, torch.Generator().manual_seed(0))

    arms = {"chunks": chunks, "continuous": continuous, "one batch": one_batch}
    best = dict.fromkeys(arms, float("inf"))
    for fn in arms.values():  # warm-up
        fn()
    for _ in range(repeats):
        for name, fn in arms.items():
            with timed() as t:
                fn()
            best[name] = min(best[name], t.seconds)
    return best


def step_times(model_name: str, steps: int, repeats: int, work: Path) -> dict[str, float]:
    """Median seconds a step of the default recipe, continuous batching off and on: `repeats` runs
    of `steps` steps an arm, alternating, every step but each run's first pooled; a model of
    `model_name`'s architecture pretrained one step."""
    model_dir = pretrain(replace(BUILTIN_MODELS[model_name](), steps=1), work / "model", log=lambda *a: None)
    out: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(repeats):
        for arm in out:
            run_dir = work / f"{arm}{r}"
            train(RECIPE, [f"model.name={model_dir}", f"train.total_steps={steps}", f"run.dir={run_dir}",
                           f"rollout.continuous_batching={arm == 'on'}", "eval.at_start=false"], log=lambda *a: None)
            rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            out[arm] += [sum(v for k, v in row.items() if k in STEP_KEYS) for row in rows if "step" in row][1:]
    return {arm: statistics.median(v) for arm, v in out.items()}


def step_sampling(model, tok, repeats: int) -> dict[str, float]:
    """Best seconds of one default-recipe step's `Policy.sample` (its prompts x samples, its limits),
    continuous batching off and on (`rollout.max_num_seqs` at its default), alternating."""
    cfg = load_config(RECIPE, [])
    weights = {name: d.weight for name, d in cfg.domains.items()}
    tasks = TaskSampler(build_domains(cfg), cfg.seed).next_batch(cfg.train.prompts_per_step, weights)
    params = GenParams(cfg.train.max_new_tokens, cfg.train.temperature, cfg.train.top_p)
    policies = {arm: Policy(model, tok, rollout=replace(cfg.rollout, continuous_batching=arm == "on"))
                for arm in ("off", "on")}
    best = dict.fromkeys(policies, float("inf"))
    for r in range(repeats + 1):  # the first round warms up
        for arm, policy in policies.items():
            with timed() as t:
                policy.sample(tasks, cfg.train.samples_per_prompt, params, torch.Generator().manual_seed(0))
            best[arm] = min(best[arm], t.seconds) if r else best[arm]
    return best


STEP_KEYS = ("time/sample_s", "time/reward_s", "time/update_s")
"""A step's phases as the run records them (sampling includes the weight sync)."""


def main(argv: list[str]) -> int:
    ap = parser(__doc__, quick="a few seconds: 4 prompts x 8, 8 slots, 32-token long rows, no recipe steps")
    ap.add_argument("--model", default="tiny-arith", help="a built-in model's architecture (random weights)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8, help="rows a prompt")
    ap.add_argument("--slots", type=int, default=64, help="rows decoded at once (rollout.max_num_seqs)")
    ap.add_argument("--short", type=int, default=8, help="most rows' token limit")
    ap.add_argument("--long", type=int, default=128, help="the long rows' token limit")
    ap.add_argument("--long-share", type=float, default=0.1, help="share of rows limited to --long")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the arms, alternating")
    ap.add_argument("--step-steps", type=int, default=8, help="default-recipe steps a run (0: not measured)")
    ap.add_argument("--step-runs", type=int, default=4, help="default-recipe runs an arm, alternating")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.slots, args.long, args.repeats, args.step_steps = 4, 8, 32, 1, 0
    bench = Bench(__file__, args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config, tok = load_config_and_tokenizer(args.model)
    model = AutoModelForCausalLM.from_config(config).eval()
    rows, params = workload(tok, args.prompts, args.group, args.short, args.long, args.long_share, seed=0)
    tokens = sum(p.max_new_tokens for p in params)
    n_long = sum(p.max_new_tokens == args.long for p in params)
    print(f"{args.model} architecture ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), "
          f"{args.threads} thread(s); {len(rows)} rows ({args.prompts} prompts x {args.group}), {args.slots} slots; "
          f"{n_long} rows of {args.long} tokens, {len(rows) - n_long} of {args.short}: {tokens} tokens; "
          f"load {load_avg():.2f}", flush=True)
    best = sampling(model, tok, rows, params, args.slots, args.repeats)
    for name, s in best.items():
        print(f"  {name:10s} {s:8.3f} s {tokens / s:9.0f} tokens/s")
    speedup = best["chunks"] / best["continuous"]
    sample_s = step_sampling(model, tok, 5 * args.repeats)
    print(f"default recipe, one step's Policy.sample (best of {5 * args.repeats}): off {sample_s['off']:.4f} s, "
          f"on {sample_s['on']:.4f} s", flush=True)
    bench.result("default_step_sampling_ratio", f"{sample_s['on'] / sample_s['off']:.3f}", target=f"<={STEP_TARGET}")
    if args.step_steps:
        with tempfile.TemporaryDirectory() as work:
            steps = step_times(args.model, args.step_steps, args.step_runs, Path(work))
        print(f"default recipe, median s a step ({args.step_runs} runs of {args.step_steps} steps an arm): "
              f"off {steps['off']:.3f}, on {steps['on']:.3f}; load {load_avg():.2f}", flush=True)
        bench.result("default_step_time_ratio", f"{steps['on'] / steps['off']:.3f}", target=f"<={STEP_TARGET}")
    bench.result("continuous_batching_speedup", f"{speedup:.2f}", target=f">={TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
