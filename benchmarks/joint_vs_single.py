"""Several domains trained jointly into one real model, against each trained alone: is there a seesaw?

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/joint_vs_single.py [--quick] [--out DIR] [--runs DIR]
        [--fresh] [--steps N] [--set KEY=VALUE ...] [--arms ARM,ARM] [--seeds N]

The recipe (recipes/smollm2-joint.yaml) trains SmolLM2-135M-Instruct with LoRA on three domains of
different kinds, all from JSONL files a user could have brought: word problems graded by the math
verifier after a chain of thought (GSM8K format), reasoning-gym's letter_counting (exported with
`postrl export-rg`, an exact-number answer) and MBPP-format Python functions graded by their asserts
in the sandbox. An eval-only control (one-step multiplication word problems) is never trained on.

Arms, each given the same number of sampled completions (same steps x prompts x samples, dynamic
sampling off): the base model; each domain trained alone; all three jointly with a uniform mixture
(`curriculum.schedule: fixed`); all three jointly with the learnability curriculum. The joint runs
evaluate every few steps with the seesaw alerts on. Every arm is measured on the same held-out
problems (200 a domain; one sample at T=0.7 with the same seeds, and greedy), and each change is
reported with its paired standard error against the base model (benchmarks/_gain.py).
`--seeds N` runs the joint curriculum again under N-1 more seeds and reports each run's gains and
their mean: at 10 steps two runs of one recipe differ as much as the schedules could.

Each arm's result is kept in OUT/<arm>.json, with what the report needs of its run (the seesaw
alerts, the curriculum's weights step by step, the in-run eval curves), the date, the commit and
the load it ran under; its run directory is RUNS/<arm> (OUT/<arm>.trained.json once its training
has finished). Run the script again and it goes on from the first arm it has not finished, without
training again an arm whose training had finished, as long as the settings are the same (`--fresh`
starts over). The full size keeps its records in benchmarks/results/joint_vs_single_14steps/, in
the repository (the 10-step run's stay in benchmarks/results/joint_vs_single/, read with `--steps 10
--out benchmarks/results/joint_vs_single`): the arms take longer together than one sitting on a
2-core machine, so a sitting commits the arms it finished and the next goes on from them. The arms
run with the joint ones first, since the acceptance rests on them. The total time printed is the
sum of the arms' own times.

Targets (issue 31): in the joint curriculum arm every trained domain above its base by more than
2 SE and no domain below its base by more than 2 SE; on each domain the joint curriculum arm within
2 SE of, or above, the domain's single arm; the whole benchmark within 3 hours on 2 CPU cores;
`--quick` (fewer problems and steps: the shape of the result, not its significance) in 20 minutes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import sys
from pathlib import Path

from _gain import measure, paired_se, scores  # benchmarks/, on the path when this script runs
from _harness import Bench, Timed, commit, load_avg, parser, write_plot, write_record

from postrl.builtin_models import load_model
from postrl.config.loading import load_config
from postrl.config.schema import generation_limits
from postrl.loop import train
from postrl.monitor.alerts import Alert, read_alerts
from postrl.monitor.report import alert_lines, read_evals
from postrl.monitor.sinks import read_metrics
from postrl.sampling.policy import Policy
from postrl.store.query import query
from postrl.tasks.catalog import build_domains

RECIPE = "recipes/smollm2-joint.yaml"
RESULTS = "benchmarks/results/joint_vs_single_14steps"
"""The full size's records, committed: the arms span sittings (see above)."""
TARGET_GAIN_SE = 2.0
TARGET_DROP_SE = 2.0
TARGET_HOURS = 3.0

FULL = {"problems": 200, "steps": 14, "prompts": 8, "samples": 8, "eval_every": 4, "eval_problems": 12, "max_tokens": 0}
"""14 steps x 8 prompts x 8 samples an arm (896 completions): on 2 CPU cores a step of 64 SmolLM2
completions takes 30-130 s (LoRA on the fused forward) and measuring one policy on 4 x 200 problems
5-13 min, so the six measurements fit the 3 hours with little to spare (16 steps would not). At 4
steps no joint arm lifted more than one domain past 2 SE; at 10 steps the joint curriculum's
smallest gain was 0.96-1.96 SE over three seeds (docs/joint.md)."""
QUICK = {"problems": 8, "steps": 1, "prompts": 4, "samples": 4, "eval_every": 1, "eval_problems": 4, "max_tokens": 64}
"""--quick: the same arms, 8 problems a domain, one step of 16 completions, replies cut at 64 tokens:
the shape of the run, not its significance."""


def arms(trained: list[str], seeds: tuple[int, ...] = ()) -> dict[str, tuple[list[str], str | None]]:
    """{arm: (its overrides of the recipe, the one domain it trains or None for all)}, in the order
    they run: the joint arms first (the acceptance rests on them), then each domain alone, then the
    joint curriculum again under each of `seeds` (`joint_curriculum_seed<N>`)."""
    single = {f"single_{name}": (["curriculum.schedule=fixed", "eval.every_steps=0", "eval.at_start=false"], name)
              for name in trained}
    reseeded = {f"joint_curriculum_seed{n}": ([f"seed={n}", "curriculum.schedule=learnability"], None) for n in seeds}
    return {"joint_curriculum": (["curriculum.schedule=learnability"], None),
            "joint_uniform": (["curriculum.schedule=fixed"], None), **single, **reseeded}


def columns(trained: list[str]) -> list[str]:
    """The table's order: the base model, each domain alone, then jointly."""
    return ["base", *(f"single_{name}" for name in trained), "joint_uniform", "joint_curriculum"]


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Arms:
    """Runs and measures the arms, keeping each one's result on disk (OUT/<arm>.json)."""

    def __init__(self, out: Path, recipe: str, size: dict, fresh: bool, extra: list[str] | None = None,
                 runs: Path | None = None):
        self.out, self.recipe, self.size, self.extra = out, recipe, size, extra or []
        """`extra`: recipe overrides for every trained arm (`--set`), part of each trained arm's key."""
        self.runs = runs or out / "runs"
        """Where the trained arms' run directories go (weights, rollouts: never in the repository)."""
        self.commit = commit(Path(__file__).resolve().parent)
        """The code the arms run with: the checkout when this process started."""
        self.bench = load_config(recipe, [f"eval.num_problems={size['problems']}", *self.token_cap(recipe)])
        self.trained = list(self.bench.domains)
        domains = build_domains(self.bench) | build_domains(dataclasses.replace(self.bench, domains=self.bench.eval.domains))
        self.suites = {name: (d, d.heldout(size["problems"])) for name, d in domains.items()}
        self.tokens = {name: generation_limits(self.bench, name)[0] for name in self.suites}
        b = self.bench
        self.measure_key = fingerprint(b.model, b.domains, b.eval.domains, b.eval.temperature, b.seed, self.tokens,
                                       {name: [t.task_id for t in tasks] for name, (_, tasks) in self.suites.items()})
        """What a measurement depends on: the base model's result is kept while only training settings change."""
        out.mkdir(parents=True, exist_ok=True)
        if fresh:
            for path in out.glob("*.json"):
                path.unlink()

    def run(self, arm: str, overrides: list[str] | None, only: str | None = None) -> dict:
        """An arm's result, kept or made: train (unless `overrides` is None: the base model), then
        measure on every domain's held-out problems."""
        path = self.out / f"{arm}.json"
        key = self.key(overrides, only)
        if path.is_file():
            kept = json.loads(path.read_text())
            if kept.get("key") == key:
                print(f"{arm}: kept from {path} ({kept['seconds'] / 60:.1f} min when it ran)", flush=True)
                return kept
        clock, loads = Timed(), [load_avg()]
        run_dir, model, train_s = None, self.bench.model.name, 0.0
        if overrides is not None:
            run_dir = self.runs / arm
            trained = self.trained_run(arm, key, run_dir)
            if trained:
                train_s, loads = trained["train_seconds"], trained["load"]
                print(f"{arm}: its training kept from {run_dir} ({train_s / 60:.1f} min when it ran)", flush=True)
            else:
                cfg = load_config(self.recipe, [*self.common(), *self.extra, *overrides, f"run.dir={run_dir}"])
                if only:  # one trained domain, its recipe entry kept whole; the others are measured only
                    cfg = dataclasses.replace(cfg, domains={only: cfg.domains[only]})
                print(f"{arm}: training {', '.join(cfg.domains)} for {cfg.train.total_steps} steps "
                      f"({cfg.curriculum.schedule} schedule) -> {run_dir}", flush=True)
                train(cfg, log=lambda *_: None)
                train_s = clock.seconds
                loads.append(load_avg())
                write_record(self.out / f"{arm}.trained.json", {"key": key, "train_seconds": train_s, "load": loads},
                             self.commit)
            model = str(run_dir / "final")
        measuring = Timed()
        print(f"{arm}: measuring {model}", flush=True)
        policy = Policy(*load_model(model, self.bench.model.dtype, log=lambda *_: None))
        results = measure(policy, self.suites, self.bench, self.tokens)
        loads.append(load_avg())
        kept = {"key": key, "arm": arm, "results": results, "seconds": train_s + measuring.seconds,
                "train_seconds": train_s, "load": loads, "run_dir": str(run_dir) if run_dir else None,
                "completions": completions(run_dir) if run_dir else {},
                "run": run_record(run_dir, self.trained) if run_dir else None}
        return write_record(path, kept, self.commit)

    def trained_run(self, arm: str, key: str, run_dir: Path) -> dict | None:
        """The record of this arm's finished training, when it was made with these settings and its
        final weights are there (the arm was stopped while it was being measured)."""
        path = self.out / f"{arm}.trained.json"
        if not path.is_file() or not (run_dir / "final").is_dir():
            return None
        record = json.loads(path.read_text())
        return record if record.get("key") == key else None

    def key(self, overrides: list[str] | None, only: str | None) -> str:
        """An arm's settings: the measurement's, and for a trained arm the recipe and the run's size."""
        if overrides is None:
            return self.measure_key
        return fingerprint(self.measure_key, Path(self.recipe).read_text(), self.size, [*self.extra, *overrides], only)

    def token_cap(self, recipe: str) -> list[str]:
        """Overrides that cut every domain's replies at size["max_tokens"] (0: the recipe's own)."""
        cap = self.size["max_tokens"]
        if not cap:
            return []
        cfg = load_config(recipe, [])
        return [f"train.max_new_tokens={min(cap, cfg.train.max_new_tokens)}",
                *(f"domains.{name}.max_new_tokens={min(cap, generation_limits(cfg, name)[0])}" for name in cfg.domains),
                *(f"eval.domains.{name}.max_new_tokens={min(cap, generation_limits(cfg, name)[0])}"
                  for name in cfg.eval.domains)]

    def common(self) -> list[str]:
        s = self.size
        return [*self.token_cap(self.recipe), f"train.total_steps={s['steps']}", f"train.prompts_per_step={s['prompts']}",
                f"train.samples_per_prompt={s['samples']}", f"eval.every_steps={s['eval_every']}",
                f"eval.num_problems={s['eval_problems']}", "curriculum.dynamic_sampling=false",
                "run.progress=false", "checkpoint.every_steps=0", "run.overwrite=true"]


def run_record(run_dir: Path, trained: list[str]) -> dict:
    """What the report needs of a trained arm's run, kept in its record so that the report holds
    where the run directory does not (another machine, a later sitting)."""
    evals: dict[str, list] = {}
    for e in read_evals(run_dir):
        if e.step is not None:
            for d, r in e.results.items():
                evals.setdefault(d, []).append((e.step, r["pass@1"]))
    metrics = read_metrics(run_dir)
    weights = {d: [(s, m[f"curriculum/weight/{d}"]) for s, m in metrics.items() if f"curriculum/weight/{d}" in m]
               for d in trained}
    return {"seesaw_alerts": [{"step": a.step, "message": a.message} for a in read_alerts(run_dir) if a.name == "seesaw"],
            "story": curriculum_story(metrics, trained), "evals": evals, "weights": weights}


def completions(run_dir: Path) -> dict[str, int]:
    """The sampled completions a run trained on, per domain, counted in its rollout store."""
    rows = query(run_dir, "SELECT domain, count(*) FROM rollouts GROUP BY domain ORDER BY domain").rows
    return {domain: int(n) for domain, n in rows}


# ---------------------------------------------------------------------------- the report


def change(base: dict, after: dict) -> tuple[float, float]:
    """(pass@1 after - before, its paired standard error): one sample a problem."""
    return scores(after, 1)["pass@1"] - scores(base, 1)["pass@1"], paired_se(base, after, 1)


def in_se(delta: float, se: float) -> float:
    """A change in standard errors; a change on identical answers (SE 0) is 0 or +/-inf."""
    return delta / se if se > 0 else (0.0 if delta == 0 else math.copysign(math.inf, delta))


def table(results: dict[str, dict], domains: list[str], trained: list[str]) -> None:
    base = results["base"]["results"]
    names = list(results)
    print("\nheld-out pass@1 at T=0.7, one sample a problem (change vs base +/- 2 paired SE); greedy in brackets")
    print("| domain | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for d in domains:
        cells = []
        for arm in names:
            r = results[arm]["results"][d]
            s = scores(r, 1)
            cell = f"{s['pass@1']:.3f} ({s['greedy']:.3f})"
            if arm != "base":
                delta, se = change(base[d], r)
                cell += f" {delta:+.3f}+/-{2 * se:.3f}"
            cells.append(cell)
        role = "" if d in trained else " (control)"
        print(f"| {d}{role} | " + " | ".join(cells) + " |")


def gains_in_se(results: dict[str, dict], domains: list[str]) -> dict[str, float]:
    """Each domain's pass@1 change in the joint curriculum arm against the base model, in paired SE."""
    base, joint = results["base"]["results"], results["joint_curriculum"]["results"]
    return {d: in_se(*change(base[d], joint[d])) for d in domains}


def headline(gains: dict[str, float], trained: list[str]) -> tuple[float, float]:
    """(the smallest trained domain's gain, the largest drop below base of any domain, 0 if none), in SE."""
    return min(gains[d] for d in trained), max(0.0, *(-g for g in gains.values()))


def seesaws(results: dict[str, dict], domains: list[str], trained: list[str]) -> list[str]:
    """Where a single-domain arm pushed another domain below its base by more than 2 SE (the
    single arms that ran)."""
    base, found = results["base"]["results"], []
    for name in trained:
        if f"single_{name}" not in results:
            continue
        arm = results[f"single_{name}"]["results"]
        for d in domains:
            delta, se = change(base[d], arm[d])
            if d != name and in_se(delta, se) < -2:
                found.append(f"single_{name} squeezed {d}: {delta:+.3f} ({in_se(delta, se):+.1f} SE)")
    return found


def joint_against_single(results: dict[str, dict], trained: list[str]) -> list[tuple[str, float, float]]:
    """Per trained domain whose single arm ran: (domain, joint curriculum - single arm, paired SE
    between the two arms)."""
    joint = results["joint_curriculum"]["results"]
    return [(d, *change(results[f"single_{d}"]["results"][d], joint[d])) for d in trained if f"single_{d}" in results]


def over_seeds(results: dict[str, dict], domains: list[str]) -> dict[str, dict]:
    """The joint curriculum arm and its reseeded runs (`joint_curriculum_seed<N>`), per domain:
    {"gains": each run's pass@1 change against base, "mean": their mean, "pooled_se": the paired SE
    of the mean over runs (per problem: the runs' mean minus the base's; the problems' spread
    only), "seed_se": the runs' own spread, stdev(gains) / sqrt(runs)}."""
    runs = [r["results"] for arm, r in results.items() if arm == "joint_curriculum" or arm.startswith("joint_curriculum_seed")]
    base, out = results["base"]["results"], {}
    for d in domains:
        gains = [change(base[d], r[d])[0] for r in runs]
        pooled = {"correct": [statistics.mean(c) for c in zip(*(r[d]["correct"] for r in runs))]}
        out[d] = {"gains": gains, "mean": statistics.mean(gains), "pooled_se": paired_se(base[d], pooled, 1),
                  "seed_se": statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else math.nan}
    return out


def curriculum_story(metrics: dict[int, dict], trained: list[str]) -> list[str]:
    """What a joint run spent its samples on, step by step, and its domain weights (its metrics)."""
    lines = ["| step | " + " | ".join(f"{d} weight / batch share / pass rate" for d in trained) + " |",
             "|---|" + "---|" * len(trained)]
    for step, m in metrics.items():
        cells = [f"{m.get(f'curriculum/weight/{d}', math.nan):.2f} / {m.get(f'batch/{d}', 0):.2f} / "
                 f"{m.get(f'pass_rate/{d}', math.nan):.2f}" for d in trained]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def plot(run: dict, path: Path) -> None:
    """Held-out pass@1 per domain at each in-run eval, and the curriculum's domain weights (a run record)."""
    alerts = [Alert(a["step"], "seesaw", a["message"]) for a in run["seesaw_alerts"]]
    for series, title, ylabel, suffix in [(run["evals"], "Joint curriculum run: held-out pass@1 (in-run eval)", "pass@1", "eval"),
                                          (run["weights"], "Joint curriculum run: domain weights", "sampling weight", "weights")]:
        write_plot(path.with_name(f"{path.stem}-{suffix}.svg"), title, ylabel,
                   {k: [tuple(p) for p in v] for k, v in series.items() if v}, alert_lines(alerts))


def main(argv: list[str]) -> int:
    ap = parser(__doc__, quick="8 problems a domain, one step an arm: the shape, in minutes", out="",
                out_help="where the arms' results are kept (default: benchmarks/results/joint_vs_single, in the "
                "repository; --quick: runs/joint_vs_single_quick)")
    ap.add_argument("--recipe", default=RECIPE)
    ap.add_argument("--runs", default="", help="where the arms' run directories go (default: runs/joint_vs_single[_quick])")
    ap.add_argument("--fresh", action="store_true", help="forget the arms kept in --out and run them all")
    ap.add_argument("--plot", default="", help="write the joint curriculum run's curves to PATH-eval.svg and PATH-weights.svg")
    ap.add_argument("--steps", type=int, default=0, help="training steps an arm (default: the size's, 14; --quick 1)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a recipe override for every trained arm (repeatable), e.g. curriculum.domain_draw=stratified")
    ap.add_argument("--arms", default="", help="comma-separated arms to run (default all); the base model always runs")
    ap.add_argument("--seeds", type=int, default=1, help="run the joint curriculum under N seeds (the recipe's, then "
                    "the next ones; default 1): the report adds each run's gains and their mean")
    args = ap.parse_args(argv)
    benchmark = Bench(__file__, args)
    if args.seeds < 1:
        ap.error(f"--seeds: at least 1 run (got {args.seeds})")
    size = QUICK if args.quick else FULL
    if args.steps:
        size = size | {"steps": args.steps}
    out = Path(args.out or ("runs/joint_vs_single_quick" if args.quick else RESULTS))
    runs = Path(args.runs or ("runs/joint_vs_single_quick/runs" if args.quick else "runs/joint_vs_single"))
    bench = Arms(out, args.recipe, size, args.fresh, args.set, runs)
    trained, domains = bench.trained, list(bench.suites)
    chosen = arms(trained, tuple(bench.bench.seed + k for k in range(1, args.seeds)))
    if args.arms:
        unknown = sorted(set(args.arms.split(",")) - set(chosen))
        if unknown:
            ap.error(f"--arms: no arm {', '.join(unknown)} (the arms: {', '.join(chosen)})")
        chosen = {arm: chosen[arm] for arm in args.arms.split(",")}
    print(f"{args.recipe}: trained {trained}, control {[d for d in domains if d not in trained]}; "
          f"{size['problems']} held-out problems a domain, {size['steps']} steps x {size['prompts']} prompts x "
          f"{size['samples']} samples an arm{''.join(f'; {o}' for o in args.set)}; load {load_avg():.2f}", flush=True)
    results = {"base": bench.run("base", None)}
    for arm, (overrides, only) in chosen.items():
        results[arm] = bench.run(arm, overrides, only)
    ran = results
    seeded = over_seeds(ran, domains) if any(arm.startswith("joint_curriculum_seed") for arm in ran) else {}
    results = {arm: ran[arm] for arm in columns(trained) if arm in ran}

    table(results, domains, trained)
    print("\nsampled completions trained on, per arm: " + "; ".join(
        f"{arm} {sum(r['completions'].values())} ({', '.join(f'{d} {n}' for d, n in r['completions'].items())})"
        for arm, r in results.items() if r["completions"]))

    squeezed = seesaws(results, domains, trained)
    print("single-domain arms that squeezed another domain below its base by more than 2 SE: "
          + ("; ".join(squeezed) if squeezed else "none"))
    for arm in ("joint_uniform", "joint_curriculum"):
        if arm in results:
            alerts = results[arm]["run"]["seesaw_alerts"]
            print(f"{arm}: {len(alerts)} seesaw alert(s)" + "".join(f"\n  step {a['step']}: {a['message']}" for a in alerts))
    gains = gains_in_se(results, domains) if "joint_curriculum" in results else {}
    if gains:
        print("\njoint curriculum vs base, in SE: " + ", ".join(f"{d} {g:+.1f}" for d, g in gains.items()))
        print("joint curriculum vs each single arm on its own domain (difference +/- 2 paired SE):")
        for d, delta, se in joint_against_single(results, trained):
            verdict = "within 2 SE or above" if in_se(delta, se) >= -2 else "BELOW by more than 2 SE"
            print(f"  {d}: {delta:+.3f} +/- {2 * se:.3f} ({verdict})")
        joint = results["joint_curriculum"]
        print(f"\nthe joint curriculum run, step by step (postrl report {joint['run_dir']} draws it, where it is kept):")
        print("\n".join(joint["run"]["story"]))
        if args.plot:
            plot(joint["run"], Path(args.plot))
    if seeded:
        print(f"\nthe joint curriculum over {len(next(iter(seeded.values()))['gains'])} seeds, pass@1 change against base: "
              "each run; their mean, in pooled paired SE (the problems' spread) and in the runs' own SE")
        for d, s in seeded.items():
            print(f"  {d}: {' '.join(f'{g:+.3f}' for g in s['gains'])}; mean {s['mean']:+.3f} "
                  f"({in_se(s['mean'], s['pooled_se']):+.1f} pooled SE, {in_se(s['mean'], s['seed_se']):+.1f} seed SE)")

    print("\n" + "\n".join(f"{arm}: {r['seconds'] / 60:.1f} min, {r.get('date', '?')}, at {r.get('commit') or '?'}"
                            for arm, r in ran.items()))
    seconds = sum(r["seconds"] for r in ran.values())
    loads = [x for r in ran.values() for x in r["load"]]
    print(f"\ntotal {seconds / 3600:.2f} h over the arms (target {TARGET_HOURS:.0f} h; --quick: 20 min); "
          f"load average {min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f}) on "
          f"{os.cpu_count()} CPUs")
    if not gains:
        benchmark.result("joint_min_gain_se", "nan", "(the joint_curriculum arm was not run)", target=2)
        return 0
    min_gain, worst_drop = headline(gains, trained)
    benchmark.result("joint_min_gain_se", f"{min_gain:.2f}", target=f"{TARGET_GAIN_SE:.0f}")
    benchmark.result("joint_worst_drop_se", f"{worst_drop:.2f}", target=f"<={TARGET_DROP_SE:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
