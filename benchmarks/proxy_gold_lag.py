"""Why the proxy_gold monitor's lag behind the gold peak is not one number: a Monte Carlo in seconds.

    nice .venv/bin/python benchmarks/proxy_gold_lag.py [--seeds 100] [--heldout] [--plateau 3] [--settings '{"noise_z": 3}']

`benchmarks/rm_overoptimization.py` measures, on one RL trajectory, the step where the monitor fires
minus the step where held-out gold peaked. Another machine's floats (other matmul kernels) flip a
sampled token now and then, and from there the trajectory is another draw, as another seed is.
This script draws many of them from a model of that benchmark's curves, with the monitor itself:

- gold rises 0.27 -> 0.46 over steps 0..4, then falls `slope` a step (0.03, 0.05, 0.08); with
  `--plateau N` it first eases 0.01 a step for N steps (seed 3 of the benchmark: 0.453, 0.422,
  0.418, 0.406, then 0.332), so that its 3-step mean peaks at the plateau's start;
- each step the monitor sees 128 samples' gold (`--samples-per-step`) (0 or 1, drawn at that step's gold) and a rising
  proxy; held-out gold is 256 samples a step, its peak the benchmark's (3-step trailing mean);
- with `--heldout` the monitor also reads that held-out eval before each step's update, as a run
  does when an eval-only domain is graded by the gold scorer (`monitor.proxy_gold.heldout_domains`),
  and pools its 256 scores with the 128 trained ones;
- prints, per slope, the lag's mean, spread and share above 3 steps, where the held-out peak
  landed, and the share of 100-step runs of flat gold (proxy jittering) on which it fired at all.

The monitor's lag is about one step of smoothing plus the time gold takes to fall `noise_z`
standard errors (4 x ~0.033) below its best, with both the firing step and the reference peak
moving by a step or two with sampling noise.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

from _harness import parser  # benchmarks/, on the path when this script runs

from postrl.monitor.proxy_gold import ProxyGold
from postrl.monitor.settings import ProxyGoldConfig

PEAK_STEP, BASE, PEAK = 4, 0.27, 0.46
HELDOUT = 256
"""Held-out gold scores an eval (64 problems x 4 samples)."""


def gold_at(step: int, slope: float, plateau: int = 0) -> float:
    if step <= PEAK_STEP:
        return BASE + (PEAK - BASE) * step / PEAK_STEP
    eased = min(step - PEAK_STEP, plateau)
    return max(0.0, PEAK - 0.01 * eased - slope * (step - PEAK_STEP - eased))


def step_samples(rng: random.Random, proxy: float, gold: float, n: int) -> list:
    return [SimpleNamespace(score=SimpleNamespace(reward=proxy, components={"gold": float(rng.random() < gold)}))
            for _ in range(n)]


def trailing_peak(values: list[float], k: int = 3) -> int:
    """The benchmark's peak: the step ending the highest k-step trailing mean."""
    return max(range(k - 1, len(values)), key=lambda s: sum(values[s - k + 1 : s + 1]))


def heldout_eval(rng: random.Random, gold: float, n: int = HELDOUT) -> dict[str, float]:
    """One domain's eval result as `postrl.evaluation` writes it: n replies scored 0 or 1 at `gold`."""
    mean = sum(rng.random() < gold for _ in range(n)) / n
    return {"pass@1": mean, "reward_mean": mean, "reward_sem": (mean * (1 - mean) / (n - 1)) ** 0.5, "n_scored": n}


def make_monitor(settings: dict, heldout: bool) -> ProxyGold:
    return ProxyGold(ProxyGoldConfig(**(settings | {"heldout_domains": ["gold_heldout"] if heldout else []})), None)


def one_run(seed: int, slope: float, settings: dict, per_step: int = 128, steps: int = 20,
            heldout: bool = False, plateau: int = 0, heldout_n: int = HELDOUT) -> tuple[int, int | None]:
    """(held-out peak step, step the monitor fired or None) of one simulated run."""
    rng = random.Random(seed)
    monitor = make_monitor(settings, heldout)
    held, fired = [], None
    for step in range(steps):
        gold = gold_at(step, slope, plateau)
        result = heldout_eval(rng, gold, heldout_n)
        held.append(result["pass@1"])
        monitor.observe_eval(step, {"gold_heldout": result})  # the eval of step N comes before its update
        if monitor.update(step, {}, step_samples(rng, 0.3 + 0.03 * step, gold, per_step)) and fired is None:
            fired = step
    return trailing_peak(held), fired


def false_alarm_share(settings: dict, runs: int, per_step: int = 128, steps: int = 100, heldout: bool = False,
                      heldout_n: int = HELDOUT) -> float:
    fired = 0
    for seed in range(runs):
        rng = random.Random(10_000 + seed)
        monitor = make_monitor(settings, heldout)
        for s in range(steps):
            monitor.observe_eval(s, {"gold_heldout": heldout_eval(rng, 0.45, heldout_n)})
            if monitor.update(s, {}, step_samples(rng, 0.5 + rng.uniform(-0.1, 0.1), 0.45, per_step)):
                fired += 1
                break
    return fired / runs


def main() -> None:
    p = parser(__doc__, record=False)  # a simulation's lag distribution: no RESULT line
    p.add_argument("--seeds", type=int, default=100)
    p.add_argument("--samples-per-step", type=int, default=128, help="gold-scored samples the monitor sees a step")
    p.add_argument("--heldout", action="store_true", help="the monitor also pools the held-out eval's gold")
    p.add_argument("--heldout-samples", type=int, default=HELDOUT, help="held-out gold scores an eval (problems x samples)")
    p.add_argument("--plateau", type=int, default=0, help="steps gold eases 0.01 a step after its peak before falling")
    p.add_argument("--settings", default="{}", help="ProxyGoldConfig fields as JSON, e.g. '{\"noise_z\": 3}'")
    args = p.parse_args()
    settings = json.loads(args.settings)
    print(f"proxy_gold settings: {make_monitor(settings, args.heldout).cfg}")
    for slope in (0.03, 0.05, 0.08):
        runs = [one_run(seed, slope, settings, args.samples_per_step, heldout=args.heldout, plateau=args.plateau,
                        heldout_n=args.heldout_samples)
                for seed in range(args.seeds)]
        lags = [fired - peak for peak, fired in runs if fired is not None]
        peaks = sorted({peak for peak, _ in runs})
        print(f"gold falling {slope:.2f}/step: lag mean {sum(lags) / max(len(lags), 1):.1f}, "
              f"range {min(lags, default=None)}..{max(lags, default=None)}, "
              f"above 3 in {sum(lag > 3 for lag in lags) / max(len(lags), 1):.0%}, never fired "
              f"{args.seeds - len(lags)}; held-out peak found at steps {peaks[0]}..{peaks[-1]}")
    flat = false_alarm_share(settings, args.seeds // 2, args.samples_per_step, heldout=args.heldout,
                             heldout_n=args.heldout_samples)
    print(f"fired on flat gold (100 steps, proxy jittering): {flat:.0%} of {args.seeds // 2} runs")


if __name__ == "__main__":
    main()
