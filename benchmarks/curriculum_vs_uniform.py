"""Dynamic curriculum against uniform fixed weights, side by side, on the multi-domain recipe.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/curriculum_vs_uniform.py [--seeds 0 1 2] [--steps 40]

For each seed, both arms start from the same base model (`recipes/multidomain.yaml`'s
`tiny-multi`) with that seed and the same settings; they differ only in what the curriculum does:

    curriculum  curriculum.schedule=learnability, curriculum.dynamic_sampling=true (the recipe)
    uniform     curriculum.schedule=fixed (the recipe's equal domain weights, all levels drawn
                uniformly), curriculum.dynamic_sampling=false

The target is the base model's mean held-out pass@1 over the domains plus `--target-gain`. Each
arm evaluates every `--eval-every` steps (the held-out sets of all domains, the recipe's eval
sizes); "steps to target" is the first eval step at or above it, and "train time" the sum of the
loop's own sample, reward, refill and update times up to that step (evaluation excluded: both
arms spend the same on it). The default target is +0.20: +0.10 is reached in 4-6 steps by any arm
through one fast fix (sort's descending-order habit), so it says little about where compute
goes; the curve also prints steps to +0.05, +0.10, +0.15 and +0.20. Evaluation every 2 steps.

Base and final models are also scored problem by problem on the same held-out problems
(`--final-problems` per domain x `--final-samples`, larger than the recipe's eval), so each
domain's final-minus-base pass@1 comes with a paired standard error (over problems, so it covers
both which problems were drawn and the sampling noise), per domain and per level.

Target (issue 5): the curriculum reaches the target in at most 0.7x the steps of uniform sampling,
and no domain ends below its base pass@1, on every seed. The last line is
`RESULT steps_ratio=<worst seed's x> target=0.7 below_base=<domains or none>` (curriculum steps /
uniform steps; when uniform never gets there, its step count is taken as --steps, so the ratio is
an upper bound, and says so).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from _harness import Bench, parser, timed  # benchmarks/, on the path when this script runs

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.evaluation import count_correct
from postrl.loop import train
from postrl.sampling.policy import Policy
from postrl.tasks.catalog import build_domains

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "multidomain.yaml"
ARMS = {
    "curriculum": [],
    "uniform": ["curriculum.schedule=fixed", "curriculum.dynamic_sampling=false"],
    # ablations (--arms): which half of the curriculum arm does the work
    "schedule-only": ["curriculum.dynamic_sampling=false"],
    "dynamic-only": ["curriculum.schedule=fixed"],
}
TRAIN_TIMES = ("time/sample_s", "time/reward_s", "time/update_s", "time/refill_s")


@dataclass
class Scores:
    """One model's held-out results, problem by problem: pass@1 estimates (correct / samples) and levels."""

    p: dict[str, list[float]]
    levels: dict[str, list[int]]

    def means(self) -> dict[str, float]:
        return {d: self.mean(d) for d in self.p}

    def mean(self, domain: str, level: int | None = None) -> float:
        return _mean(self._pick(self.p[domain], domain, level))

    def se(self, domain: str, level: int | None = None) -> float:
        return _se(self._pick(self.p[domain], domain, level))

    def diff(self, base: Scores, domain: str, level: int | None = None) -> tuple[float, float]:
        """Paired difference self - base over the same problems: (mean, standard error)."""
        d = [a - b for a, b in zip(self.p[domain], base.p[domain])]
        d = self._pick(d, domain, level)
        return _mean(d), _se(d)

    def _pick(self, values: list[float], domain: str, level: int | None) -> list[float]:
        return [v for v, lv in zip(values, self.levels[domain]) if level is None or lv == level]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _se(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))


def score(cfg, model_name: str, num_problems: int, samples: int) -> Scores:
    """Pass@1 per held-out problem of every domain (the recipe's eval temperature and seed)."""
    domains = build_domains(cfg)
    model, tok = load_model(model_name, log=lambda *a: None)
    policy, p, levels = Policy(model, tok), {}, {}
    for name, domain in domains.items():
        tasks = domain.heldout(num_problems)
        _, correct = count_correct(policy, domain, tasks, samples, cfg.eval.temperature,
                                   cfg.train.max_new_tokens, cfg.seed, greedy=False)
        p[name] = [c / samples for c in correct]
        levels[name] = [t.level for t in tasks]
    return Scores(p, levels)


def curve(run_dir: Path) -> dict[int, dict[str, float]]:
    """step -> {domain: pass@1} from the run's eval/step_N.json files."""
    out = {}
    for path in (run_dir / "eval").glob("step_*.json"):
        out[int(path.stem.split("_")[1])] = {d: r["pass@1"] for d, r in json.loads(path.read_text()).items()}
    return dict(sorted(out.items()))


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def train_seconds(rows: list[dict]) -> dict[int, float]:
    """Cumulative loop time (no eval) after each step."""
    total, out = 0.0, {}
    for m in rows:
        total += sum(m.get(k) or 0.0 for k in TRAIN_TIMES)
        out[m["step"] + 1] = total
    return out


def run_arm(name: str, seed: int, args, out_dir: Path) -> dict:
    overrides = [f"seed={seed}", f"train.total_steps={args.steps}", f"eval.every_steps={args.eval_every}",
                 f"run.dir={out_dir / f'seed{seed}' / name}", "run.progress=false", "checkpoint.every_steps=0",
                 *ARMS[name]]
    cfg = load_config(RECIPE, args.override + overrides)
    with timed() as t:
        run_dir = train(cfg, log=lambda *a: None)
    wall = t.seconds
    rows = metrics(run_dir)
    return {"dir": run_dir, "wall_s": wall, "curve": curve(run_dir), "secs": train_seconds(rows), "rows": rows,
            "final": score(cfg, str(run_dir / "final"), args.final_problems, args.final_samples)}


def first_reaching(arm: dict, target: float) -> int | None:
    for step, scores in arm["curve"].items():
        if mean(scores) >= target:
            return step
    return None


def mean(scores: dict[str, float]) -> float:
    return sum(scores.values()) / len(scores)


def fmt(scores: dict[str, float]) -> str:
    return " ".join(f"{d}={v:.2f}" for d, v in scores.items())


def print_curves(arms: dict, every: int) -> None:
    print(f"{'step':>5} " + " ".join(f"{name:>34}" for name in arms))
    all_steps = sorted({s for arm in arms.values() for s in arm["curve"]})
    for s in all_steps:
        if s % every and s != all_steps[-1]:
            continue
        cells = [f"{mean(a['curve'][s]):.3f} ({fmt(a['curve'][s])})" if s in a["curve"] else "" for a in arms.values()]
        print(f"{s:>5} " + " ".join(f"{c:>34}" for c in cells))


def print_trajectory(rows: list[dict], every: int = 10) -> None:
    """What the curriculum did: domain weights, level frontiers, dropped groups, parked problems."""
    print("curriculum over time (domain weight / frontier level; groups dropped, extra draws, parked):")
    for m in rows:
        if m["step"] % every and m is not rows[-1]:
            continue
        doms = sorted(k.split("/")[-1] for k in m if k.startswith("curriculum/weight/"))
        cells = [f"{d}={m[f'curriculum/weight/{d}']:.2f}/L{m.get(f'curriculum/level/{d}', 0):.0f}" for d in doms]
        print(f"  step {m['step']:>3}: " + " ".join(cells) + f"; dropped {m.get('dynamic/dropped_groups', 0):.0f}, "
              f"extra draws {m.get('dynamic/extra_draws', 0):.0f}, parked {m.get('curriculum/parked', 0):.0f}")


def print_finals(arms: dict, base: Scores) -> list[str]:
    """Final pass@1 per domain and level against base (paired SE); returns the curriculum's domains below base."""
    print("final held-out pass@1, base -> arm (final - base +- paired SE):")
    below = []
    for d in base.p:
        for level in [None, *sorted(set(base.levels[d]))]:
            label = d if level is None else f"  L{level} (n={base.levels[d].count(level)})"
            cells = []
            for name, arm in arms.items():
                diff, se = arm["final"].diff(base, d, level)
                cells.append(f"{name} {arm['final'].mean(d, level):.3f} ({diff:+.3f} +- {se:.3f})")
                if level is None and name == "curriculum" and diff < 0:
                    below.append(d)
            print(f"  {label:<12} base {base.mean(d, level):.3f} +- {base.se(d, level):.3f}  " + "  ".join(cells))
    return below


def run_seed(seed: int, args) -> dict:
    cfg = load_config(RECIPE, args.override + [f"seed={seed}"])
    e = cfg.eval
    base_mean = mean(score(cfg, cfg.model.name, e.num_problems, e.samples_per_problem).means())
    base = score(cfg, cfg.model.name, args.final_problems, args.final_samples)
    target = base_mean + args.target_gain
    arms = {name: run_arm(name, seed, args, Path(args.out)) for name in args.arms}

    print(f"\n=== seed {seed}: base mean pass@1 {base_mean:.3f}; target {target:.3f}\n")
    print_curves(arms, args.print_every)
    print()
    print_trajectory(arms["curriculum"]["rows"])
    print()
    below = print_finals(arms, base)
    hits = {}
    for name, arm in arms.items():
        hit = hits[name] = first_reaching(arm, target)
        when = f"step {hit}, train time {arm['secs'].get(hit, math.nan):.0f} s" if hit else "not reached"
        print(f"{name:>10}: target {when}; run wall time {arm['wall_s']:.0f} s")
    print("steps to reach base mean + gain (-: not reached): " + "; ".join(
        f"+{g:.2f} " + " ".join(f"{n}={first_reaching(a, base_mean + g) or '-'}" for n, a in arms.items())
        for g in (0.05, 0.10, 0.15, 0.20)))
    cur, uni = hits["curriculum"], hits["uniform"]
    ratio = (cur / (uni or args.steps)) if cur else math.inf
    print(f"seed {seed}: steps curriculum/uniform {cur or '-'}/{uni or '-'} = {ratio:.2f}"
          f"{' (uniform never reached it: an upper bound)' if cur and not uni else ''}; "
          f"curriculum domains below base: {', '.join(below) or 'none'}")
    return {"ratio": ratio, "below": below}


def main() -> None:
    p = parser(__doc__, out="runs/bench-curriculum",
               out_help="the arms' run directories go under OUT/seedN/ (default: runs/bench-curriculum)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["curriculum", "uniform"], choices=list(ARMS),
                   help="curriculum and uniform always; the ablations on request")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--print-every", type=int, default=5, help="rows of the eval curves to print")
    p.add_argument("--final-problems", type=int, default=240, help="held-out problems per domain, base and final")
    p.add_argument("--final-samples", type=int, default=16, help="samples per problem, base and final")
    p.add_argument("--target-gain", type=float, default=0.20, help="target = base mean pass@1 + this")
    p.add_argument("override", nargs="*", help="dotted overrides applied to both arms")
    args = p.parse_args()
    bench = Bench(__file__, args)
    args.arms = ["curriculum", "uniform", *(a for a in args.arms if a not in ("curriculum", "uniform"))]
    results = {seed: run_seed(seed, args) for seed in args.seeds}
    worst = max(r["ratio"] for r in results.values())
    below = sorted({f"{d}(seed {s})" for s, r in results.items() for d in r["below"]})
    per_seed = " ".join(f"{s}:{r['ratio']:.2f}" for s, r in results.items())
    print()
    bench.result("steps_ratio", f"{worst:.3f}", f"(per seed: {per_seed})", target=0.7, below_base=",".join(below) or "none")


if __name__ == "__main__":
    main()
