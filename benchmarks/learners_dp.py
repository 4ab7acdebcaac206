"""Two data-parallel learner ranks vs one, side by side in one run: the loss curve and update throughput.

    .venv/bin/python benchmarks/learners_dp.py [--steps 8] [key=value ...]

Arms, each the real training loop (`postrl.loop.train`, engine: local, synchronous) for the same
steps from the same model, on the same 2 cores:

  1 rank/1t    train.learners 1, 1 torch thread
  1 rank/2t    train.learners 1, 2 torch threads (both cores)
  2 ranks      train.learners 2: rank 0 in the trainer and one learner process, 1 thread each
               during the update (rank 0 samples and builds the batch with both)

Update throughput: completions per second of `Learner.update` (rank 0's call: sending the batch,
its share of every minibatch, the all-reduces), median over the steps after the first. The loss
curve: each step's loss, KL and mean reward of the 2-rank run against the 1-rank run with the same
thread count during the update (1 thread): the same gradients summed in another order, so the
curves agree to float rounding while the sampled completions stay the same, and drift apart
slowly once a rounding difference changes a sampled token. The machine is shared: state `uptime`.

The target is 2 ranks no slower than the better single rank on the same cores. On one CPU, data
parallelism competes with the intra-op threads of one process, which need no batch sent and no
all-reduce; its use is more machines or more GPUs, where one process cannot use the others.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from _harness import Bench, parser, timed  # benchmarks/, on the path when this script runs

from postrl.builtin_models import resolve_model_path
from postrl.config.loading import load_config
from postrl.learner import learner as update_module
from postrl.loop import train

ARMS = {
    "1 rank/1t": ["run.threads=1", "train.learners=1"],
    "1 rank/2t": ["run.threads=2", "train.learners=1"],
    "2 ranks": ["run.threads=2", "train.learners=2"],
}
TOLERANCE = 1e-3
"""Largest |difference| of a step's loss, KL and mean reward between 2 ranks and 1 allowed while
the two runs sample the same completions."""


def run_arm(cfg) -> dict:
    update_s, original = [], update_module.Learner.update

    def timed_update(self, *a, **k):
        with timed() as t:
            out = original(self, *a, **k)
        update_s.append(t.seconds)
        return out

    update_module.Learner.update = timed_update
    try:
        run_dir = train(cfg, log=lambda *a: None)
    finally:
        update_module.Learner.update = original
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = cfg.train.prompts_per_step * cfg.train.samples_per_prompt
    return {"update_s": update_s, "metrics": metrics,
            "completions_per_s": rows / statistics.median(update_s[1:] or update_s)}


def curve_diff(a: dict, b: dict) -> dict[str, float]:
    """Largest |difference| per metric over the steps, and the first step where any exceeds TOLERANCE."""
    out, over = {}, []
    for key in ("loss", "kl/mean", "reward/mean"):
        diffs = [abs(x[key] - y[key]) for x, y in zip(a["metrics"], b["metrics"], strict=True)]
        out[key] = max(diffs)
        over += [i for i, d in enumerate(diffs) if d > TOLERANCE]
    out["first_step_over"] = min(over, default=None)
    return out


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--model", default="tiny-arith")
    ap.add_argument("--recipe", default="recipes/default.yaml")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("overrides", nargs="*", help="dotted recipe overrides for every arm")
    a = ap.parse_args()
    bench = Bench(__file__, a)
    path = resolve_model_path(a.model)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for arm, overrides in ARMS.items():
            cfg = load_config(a.recipe, [
                f"model.name={path}", f"run.dir={Path(work) / arm.replace('/', '-').replace(' ', '')}",
                f"train.total_steps={a.steps}", "run.progress=false", "monitor.spot_check_every_steps=0",
                "eval.every_steps=0", *overrides, *a.overrides])
            results[arm] = r = run_arm(cfg)
            print(f"  {arm}: update {statistics.median(r['update_s'][1:]) * 1000:.0f} ms/step "
                  f"(median of {len(r['update_s']) - 1}), {r['completions_per_s']:.0f} completions/s", flush=True)
    best = max(("1 rank/1t", "1 rank/2t"), key=lambda k: results[k]["completions_per_s"])
    base = results[best]["completions_per_s"]
    print(f"\n{a.steps} steps of {a.recipe} {' '.join(a.overrides)}")
    print(f"| arm | update ms/step | completions/s | vs {best} |")
    print("|---|---|---|---|")
    for arm, r in results.items():
        print(f"| {arm} | {statistics.median(r['update_s'][1:]) * 1000:.0f} | {r['completions_per_s']:.0f} | "
              f"{r['completions_per_s'] / base:.2f}x |")
    diff = curve_diff(results["1 rank/1t"], results["2 ranks"])
    print(f"loss curve, 2 ranks vs 1 rank/1t: max |diff| loss {diff['loss']:.2e}, kl/mean {diff['kl/mean']:.2e}, "
          f"reward/mean {diff['reward/mean']:.2e} (tolerance {TOLERANCE:g}; first step over it: "
          f"{diff['first_step_over'] if diff['first_step_over'] is not None else 'none'})")
    bench.result("dp_update_speedup", f"{results['2 ranks']['completions_per_s'] / base:.2f}", target="1.0")


if __name__ == "__main__":
    main()
