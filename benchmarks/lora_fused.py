"""LoRA training steps on postrl's fused forward against the Hugging Face (peft) forward.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/lora_fused.py [--recipe R] [--steps 2] [--out DIR]

`FastLM` runs plain LoRA models of the Llama family: under autograd each adapted projection adds
its low-rank term beside the frozen weight (the update back-propagates through the small factors
only, a group's shared prompt runs once, padding is never computed); sampling and the reference
pass fold the factors into the weights once per call. Before, a LoRA model ran peft's forward
everywhere: every module call in Python, every row padded whole.

Both arms train the same recipe (default: the joint recipe, SmolLM2-135M with r=16 LoRA on all
seven projections, 8 prompts x 8 samples a step) for `--steps` steps, one after the other, each in
a process of its own (so each peak resident set is its own), with the same seed: the `hf` arm with FastLM declining every LoRA model (the path as it was),
the `fused` arm as postrl runs now. Their first steps draw the same samples (the two forwards agree
to float32 rounding), so the first loss must agree; the per-step sampling and update seconds come
from each run's metrics. Prints the table and

    RESULT lora_update_speedup=<hf update seconds / fused update seconds> target=1.5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _harness import Bench, load_avg, parser, timed  # benchmarks/, on the path when this script runs

import postrl
from postrl.model.fastlm import FastLM
from postrl.model.lora import is_lora

TARGET = 1.5


def hf_for_lora():
    """Patch FastLM.wrap to decline LoRA models and the adapter-free reference; returns the undo."""
    wrap = FastLM.__dict__["wrap"]

    def declining(cls, model, adapters=True):
        if is_lora(model) or callable(getattr(model, "fast_lm", None)):
            return None
        return wrap.__func__(cls, model, adapters)

    FastLM.wrap = classmethod(declining)
    return lambda: setattr(FastLM, "wrap", wrap)


def train_arm(name: str, recipe: str, steps: int, out: Path) -> None:
    """In this process: one arm's run into OUT/<name>."""
    overrides = [f"train.total_steps={steps}", "eval.at_start=false", "eval.every_steps=0", "eval.num_problems=2",
                 f"run.dir={out / name}", "run.progress=false", "run.overwrite=true"]
    if name == "hf":
        hf_for_lora()
    postrl.train(recipe, overrides, log=lambda *_: None)


def run_arm(name: str, recipe: str, steps: int, out: Path) -> tuple[list[dict], float]:
    """One arm in a process of its own: its per-step metrics and wall seconds."""
    with timed() as t:
        subprocess.run([sys.executable, __file__, "--recipe", recipe, "--steps", str(steps), "--out", str(out),
                        "--arm", name], check=True)
    wall = t.seconds
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "time/update_s" in r], wall


def main(argv: list[str]) -> int:
    ap = parser(__doc__, out="", out_help="where the two runs go (default: a temporary directory)")
    ap.add_argument("--recipe", default="recipes/smollm2-joint.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--arm", choices=("hf", "fused"), help=argparse.SUPPRESS)  # the child process of one arm
    args = ap.parse_args(argv)
    bench = Bench(__file__, args)
    out = Path(args.out or tempfile.mkdtemp(prefix="lora_fused-"))
    if args.arm:
        train_arm(args.arm, args.recipe, args.steps, out)
        return 0
    print(f"{args.recipe}, {args.steps} steps an arm, runs in {out}; load {load_avg():.2f}", flush=True)
    arms = {}
    for name in ("hf", "fused"):
        arms[name] = run_arm(name, args.recipe, args.steps, out)
        rows, wall = arms[name]
        print(f"  {name}: {wall:.0f} s wall; load {load_avg():.2f}", flush=True)
    print("\n| arm | step | sampling s | update s | tokens/s | loss | reward | peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (rows, _) in arms.items():
        for r in rows:
            print(f"| {name} | {r['step']} | {r['time/sample_s']:.1f} | {r['time/update_s']:.1f} | "
                  f"{r['tokens_per_s']:.1f} | {r['loss']:.6f} | {r['reward/mean']:.4f} | {r['learner/peak_mib']:.0f} |")
    hf, fused = arms["hf"][0], arms["fused"][0]
    same = hf[0]["reward/mean"] == fused[0]["reward/mean"] and hf[0]["response_len/mean"] == fused[0]["response_len/mean"]
    print(f"\nfirst step: same samples {'yes' if same else 'NO'} (reward and length); loss {hf[0]['loss']:.6f} "
          f"(hf) vs {fused[0]['loss']:.6f} (fused), |diff| {abs(hf[0]['loss'] - fused[0]['loss']):.2e}")

    def mean(rows, key):
        return statistics.fmean(r[key] for r in rows)

    sample = mean(hf, "time/sample_s") / mean(fused, "time/sample_s")
    update = mean(hf, "time/update_s") / mean(fused, "time/update_s")
    print(f"mean over steps: sampling {mean(hf, 'time/sample_s'):.1f} s -> {mean(fused, 'time/sample_s'):.1f} s "
          f"({sample:.2f}x), update {mean(hf, 'time/update_s'):.1f} s -> {mean(fused, 'time/update_s'):.1f} s "
          f"({update:.2f}x); peak {mean(hf, 'learner/peak_mib'):.0f} -> {mean(fused, 'learner/peak_mib'):.0f} MiB")
    bench.result("lora_update_speedup", f"{update:.2f}", target=TARGET)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
