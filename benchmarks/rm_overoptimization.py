"""Reward-model over-optimisation on CPU: a proxy reward model, a gold rule, and the monitor between them.

    nice .venv/bin/python benchmarks/rm_overoptimization.py [--steps 40] [--seeds 0,1,2,3,4] [--heldout-problems 200]
        [--out docs/rm-overoptimization.png]

Steps 2-5 run once per seed (the seed drives the preference samples, the reward model's head and
training, and the RL run; the prompts stay the same); seed 0 is the run this benchmark always made.

1. The gold rule is the project's own (`postrl.rewards.models.concise`): a reply that answers right and
   stays short beats one that is long, evasive or wrong.
2. The tiny built-in policy (`tiny-arith`) answers training prompts twice each; the rule labels
   each pair of its own samples (ties dropped): the preference set.
3. A Bradley-Terry reward model on the same tiny pretrained backbone is trained on those pairs
   (`postrl.rewards.models.rm`), and its held-out pairwise accuracy printed.
4. RL (`postrl.train`) with that reward model as the domain's verifier (`verifier: rm:DIR`, the
   proxy), the rule attached as the domain's monitoring-only `gold`, the `proxy_gold` monitor
   watching both (action warn: the run goes on so that the curves show what follows), held-out
   gold scored every step (an eval-only domain graded by the rule: pass@1 = share of held-out
   replies that are right and short), checkpoints every 2 steps, the best checkpoint kept by
   held-out score. Eval also scores the base model (step 0). The eval domain is graded by the
   gold spec and evaluated every step, so the monitor pools its 800 held-out scores
   (`--heldout-problems` 200, 4 samples each) with the 128 trained samples' gold each step (`monitor.proxy_gold.heldout_domains: [auto]`).
5. Prints the proxy and gold curves, the step where gold peaked (the peak of the 3-step moving
   average of held-out gold), the step where the monitor fired, and the held-out gold of the best
   checkpoint kept, each seed's lag (fire step - peak step); saves the plot of the first seed;
   ends with `RESULT fire_minus_peak_max=<steps> seeds=<n> target<=3`.

Targets (issues 19, 30): the monitor fires within 3 steps of the gold peak on every seed; the kept
checkpoint's gold is within 2 standard errors of the best seen. One seed's lag is one draw: another
machine's floats make another trajectory, as another seed does (`benchmarks/proxy_gold_lag.py`
shows how far the lag moves between draws, and why). A run of fewer steps is the same trajectory
cut short (the learning rate does not depend on train.total_steps): `--steps 20` finds the same
peaks and lags when they fall before step 20.

Measured (docs/rewards.md, 2026-12-03, 2-core CPU, 40 steps, 241 s for five seeds): lags 2, 2, 2,
2, 2 (`RESULT fire_minus_peak_max=2`); the same trajectories with `--heldout-problems 64` (the
eval this benchmark had before, 384 gold scores a step pooled instead of 928): 3, 3, 8, 2, 2.
More gold evidence, not other thresholds, is what brought the lag under 3 (proxy_gold_lag.py:
a peak followed by a plateau still lags above 3 in 8-14% of simulated draws).
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
from pathlib import Path

import torch
from _harness import Bench, Timed, parser  # benchmarks/, on the path when this script runs

import postrl
from postrl.builtin_models import resolve_model_path
from postrl.model.load import load_model
from postrl.monitor.alerts import read_alerts
from postrl.records import Task
from postrl.rewards.models.concise import concise_gold
from postrl.rewards.models.preferences import Pair
from postrl.rewards.models.rm import RewardModel, train_reward_model
from postrl.sampling.generate import GenParams
from postrl.sampling.policy import Policy

GOLD = "python:postrl.rewards.models.concise:concise"
TARGET_STEPS = 3


def sums(rng: random.Random, n: int, taken: set[str]) -> list[dict]:
    """Two-digit sums below 100 with a carry (arith level 2 with require_carry, what tiny-arith was
    pretrained on), none of them in `taken`."""
    rows = []
    while len(rows) < n:
        a, b = rng.randint(10, 89), rng.randint(10, 89)
        q = f"{a}+{b}="
        if (a % 10 + b % 10) >= 10 and a + b < 100 and q not in taken:
            taken.add(q)
            rows.append({"q": q, "answer": str(a + b)})
    return rows


def own_preferences(model_dir: Path, rows: list[dict], seed: int) -> list[Pair]:
    """Two samples of the policy per prompt, labelled by the gold rule; ties dropped."""
    model, tok = load_model(str(model_dir), log=lambda *a: None)
    policy = Policy(model, tok)
    tasks = [Task("prefs", f"p{i}", r["q"], r["answer"]) for i, r in enumerate(rows)]
    samples = policy.sample(tasks, 2, GenParams(max_new_tokens=8), generator=torch.Generator().manual_seed(seed))
    pairs = []
    for i in range(0, len(samples), 2):
        x, y = samples[i], samples[i + 1]
        gx, gy = (concise_gold(s.text, s.task.answer) for s in (x, y))
        if gx != gy:
            good, bad = (x, y) if gx > gy else (y, x)
            pairs.append(Pair(x.task.prompt, good.text, bad.text))
    return pairs


def recipe(work: Path, rm_dir: Path, steps: int, lr: float, heldout_problems: int = 200) -> dict:
    return {
        "seed": 0, "model": {"name": "tiny-arith"},
        "domains": {"open": {
            "type": "dataset", "gold": GOLD,
            "params": {"path": str(work / "train.jsonl"), "prompt": "{q}", "verifier": f"rm:{rm_dir}",
                       "heldout_percent": 5}}},
        "train": {"total_steps": steps, "prompts_per_step": 16, "samples_per_prompt": 8, "max_new_tokens": 8,
                  "lr": lr, "minibatches": 2},
        "rl": {"kl_coef": 0.0},
        "eval": {"every_steps": 1, "at_start": True, "k": [1], "samples_per_problem": 4, "num_problems": heldout_problems,
                 "temperature": 1.0,
                 "domains": {"gold_heldout": {"type": "dataset", "params": {
                     "path": str(work / "train.jsonl"), "heldout_path": str(work / "heldout.jsonl"),
                     "heldout_percent": 0, "prompt": "{q}", "answer": "answer", "verifier": GOLD}}}},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "monitor": {"proxy_gold": {"action": "warn"}, "spot_check_every_steps": 0},
        "run": {"dir": str(work / "run"), "progress": False, "threads": 1},
    }


def curves(run_dir: Path, held_n: int) -> dict:
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    proxy = {m["step"]: m["reward/mean"] for m in metrics if "reward/mean" in m}
    train_gold = {m["step"]: m["monitor/gold"] for m in metrics if "monitor/gold" in m}
    gold = {}
    for path in (run_dir / "eval").glob("step_*.json"):
        gold[int(path.stem.split("_")[1])] = json.loads(path.read_text())["gold_heldout"]["pass@1"]
    return {"proxy": proxy, "train_gold": train_gold, "gold": dict(sorted(gold.items())), "held_n": held_n}


def moving_peak(gold: dict[int, float], k: int = 3) -> tuple[int, float]:
    """(step, value) of the peak of the k-step trailing moving average, named by the step it ends at:
    the last step whose gold it knows, as the monitor's own 3-step means are."""
    steps = sorted(gold)
    averaged = {s: sum(gold[t] for t in steps[i - k + 1 : i + 1]) / k for i, s in enumerate(steps) if i >= k - 1}
    step = max(averaged, key=lambda s: averaged[s])
    return step, averaged[step]


def plot(c: dict, peak: int, fired: int | None, kept: int | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(list(c["proxy"]), list(c["proxy"].values()), label="proxy: reward model (train samples)")
    ax.plot(list(c["gold"]), list(c["gold"].values()), label="gold: the rule, held-out pass@1", marker=".")
    if c["train_gold"]:
        ax.plot(list(c["train_gold"]), list(c["train_gold"].values()), ":",
                label="gold the monitor pools: train samples + held-out (3-step mean)")
    ax.axvline(peak, color="green", linestyle="--", label=f"gold peak (3-step mean), step {peak}")
    if fired is not None:
        ax.axvline(fired, color="red", linestyle="--", label=f"proxy_gold monitor fired, step {fired}")
    if kept is not None:
        ax.axvline(kept, color="purple", linestyle=":", label=f"best checkpoint kept, step {kept}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("score")
    ax.set_title("Reward-model over-optimisation (tiny-arith, CPU)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-4, help="policy learning rate")
    p.add_argument("--pairs-from", type=int, default=300, help="training prompts sampled twice for preferences")
    p.add_argument("--rm-steps", type=int, default=40)
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated; each seeds preferences, reward model and RL")
    p.add_argument("--out", default="docs/rm-overoptimization.png", help="plot of the first seed")
    p.add_argument("--work", default="", help="working directory (default: a temporary one)")
    p.add_argument("--heldout-problems", type=int, default=200,
                   help="held-out sums, 4 samples each, scored by the gold rule every step")
    args = p.parse_args()
    bench = Bench(__file__, args)
    torch.set_num_threads(1)
    work = Path(args.work or tempfile.mkdtemp(prefix="rm-overopt-"))
    work.mkdir(parents=True, exist_ok=True)
    rng, taken = random.Random(0), set()
    train_rows, held_rows = sums(rng, 600, taken), sums(rng, args.heldout_problems, taken)
    for name, rows in (("train", train_rows), ("heldout", held_rows)):
        (work / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    backbone = resolve_model_path("tiny-arith", log=lambda m: print(m, file=sys.stderr))
    lags = {}
    for i, seed in enumerate(int(x) for x in args.seeds.split(",")):
        seed_clock = Timed()
        run_dir = one_seed(work, backbone, train_rows[: args.pairs_from], seed, args)
        lags[seed] = report(run_dir, len(held_rows) * 4, seed, Path(args.out) if i == 0 else None)
        print(f"seed {seed}: wall {seed_clock.seconds:.0f}s; run {run_dir}")
    worst = max(abs(v) for v in lags.values())
    print(f"lag (fire - peak) by seed: {lags}; wall {bench.clock.seconds:.0f}s")
    bench.result("fire_minus_peak_max", worst, seeds=len(lags), target=f"<={TARGET_STEPS}")
    return 0


def one_seed(work: Path, backbone: Path, rows: list[dict], seed: int, args) -> Path:
    """Preferences of the policy's own samples, a reward model, then RL against it, all seeded by `seed`."""
    out = work / f"seed-{seed}"
    pairs = own_preferences(backbone, rows, seed=seed)
    rm = RewardModel.from_backbone(backbone, seed=seed)
    _, rm_report = train_reward_model(pairs, out / "rm", rm=rm, steps=args.rm_steps, batch_size=16, lr=1e-3,
                                      seed=seed)
    print(f"seed {seed}: preferences: {len(pairs)} pairs of the policy's own samples; reward model held-out "
          f"accuracy {rm_report['heldout_accuracy']:.3f} ({rm_report['heldout_pairs']} pairs)")
    cfg = recipe(work, out / "rm", args.steps, args.lr, args.heldout_problems)
    cfg["seed"], cfg["run"]["dir"] = seed, str(out / "run")
    return postrl.train(cfg, log=lambda m: print(m, file=sys.stderr))


def report(run_dir: Path, held_n: int, seed: int, plot_to: Path | None) -> float:
    """Print one seed's curves and verdicts; returns the monitor's lag behind the gold peak (inf: never fired)."""
    c = curves(run_dir, held_n)
    peak, peak_value = moving_peak(c["gold"])
    fires = [a for a in read_alerts(run_dir) if a.name == "proxy_gold"]
    fired = fires[0].step if fires else None
    best = json.loads((run_dir / "checkpoints" / "best.json").read_text()) if (run_dir / "checkpoints" / "best.json").is_file() else None
    kept = best["step"] if best else None
    best_seen = max(c["gold"].values())
    se = math.sqrt(best_seen * (1 - best_seen) / held_n)  # binomial SE of a held-out pass@1 (correlated samples: a floor)
    print(f"seed {seed}\n{'step':>5}{'proxy':>9}{'gold (held-out)':>17}{'gold (monitor, pooled)':>24}")
    for s in sorted(c["gold"]):
        print(f"{s:>5}{c['proxy'].get(s, float('nan')):>9.3f}{c['gold'][s]:>17.3f}"
              f"{c['train_gold'].get(s, float('nan')):>24.3f}")
    print(f"seed {seed}: gold peak (3-step moving average, steps {peak - 2}..{peak}: centred on {peak - 1}): step {peak} "
          f"({peak_value:.3f}); best single step "
          f"{max(c['gold'], key=c['gold'].get)} ({best_seen:.3f}, SE {se:.3f})")
    print(f"seed {seed}: proxy_gold monitor fired: step {fired}" + (f" ({fires[0].message})" if fires else ""))
    if kept is not None:
        kept_gold = c["gold"].get(kept, float("nan"))
        print(f"seed {seed}: best checkpoint kept: step {kept}, held-out gold {kept_gold:.3f} "
              f"({(best_seen - kept_gold) / se if se else 0:.2f} SE below the best seen; target <= 2)")
    if plot_to is not None:
        plot(c, peak, fired, kept, plot_to)
        print(f"plot: {plot_to}")
    lag = fired - peak if fired is not None else float("inf")
    print(f"seed {seed}: fire_minus_peak={lag}")
    return lag


if __name__ == "__main__":
    sys.exit(main())
