"""Several domains trained jointly into one real model, against each trained alone and against the
domains trained one after the other: is there a seesaw, and does joint training avoid it?

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/joint_vs_single.py [--quick] [--out DIR] [--runs DIR]
        [--base FILE] [--fresh] [--steps N] [--set KEY=VALUE ...] [--arms ARM,ARM] [--seeds N] [--greedy]

The recipe (recipes/smollm2-joint.yaml) trains SmolLM2-135M-Instruct with LoRA on three domains of
different kinds, all from JSONL files a user could have brought: word problems graded by the math
verifier after a chain of thought (GSM8K format), reasoning-gym's letter_counting (exported with
`postrl export-rg`, an exact-number answer) and MBPP-format Python functions graded by their asserts
in the sandbox. An eval-only control (one-step multiplication word problems) is never trained on.

Arms, each given the same number of sampled completions (same steps x prompts x samples, dynamic
sampling off): the base model; each domain trained alone (`single_<domain>`); all three jointly with
a uniform mixture (`joint_uniform`, `curriculum.schedule: fixed`); all three jointly with the
learnability curriculum (`joint_curriculum`); and the three one after the other, what a user who
fine-tunes on one domain at a time gets (`sequential`: the recipe's order, word problems, letter
counting, code; `sequential_rev`: the reverse). A sequential arm is one run whose schedule
(`sequential`, registered by this script for its runs) draws only the first domain for a third of the
steps, then only the second, then only the third, so each stage goes on from the previous one's
weights, optimiser, LR schedule and KL reference (the base model) as one run does; the stages'
lengths are `stage_lengths` (14 steps: 5, 5, 4). The joint runs evaluate every few steps with the
seesaw alerts on. Every arm is measured on the same held-out problems (200 a domain; one sample at
T=0.7 with the same seeds: pass@1; greedy replies too with `--greedy`), and each change is reported
with its paired standard error against the base model (benchmarks/_gain.py). Every arm but the
reseeded ones keeps a checkpoint every third of the steps, and besides its final weights these are
measured, pass@1 alone, from the arm's own run (`stages`, `along` in its record):
  - a sequential arm's weights after each earlier stage, on every domain and the control: the
    forgetting of each earlier domain is read, not inferred;
  - a single arm's weights after a third of the steps, about the completions its domain gets in a
    joint arm, on its domain: "joint against single at equal completions of the domain";
  - a joint arm's weights after a third and two thirds of the steps, on the trained domains: how
    many completions each joint arm took to reach each domain's target (`REACH` in
    benchmarks/_joint_report.py, stated before they were first measured).
`--seeds N` runs the joint curriculum again under N-1 more seeds and reports each run's gains and
their mean: at 10 steps two runs of one recipe differ as much as the schedules could.

Each arm's result is kept in OUT/<arm>.json, with what the report needs of its run (the seesaw
alerts, the curriculum's weights step by step, the in-run eval curves, where its time went: the
`time/*` metrics summed), the date, the commit and the load it ran under; its run directory is
RUNS/<arm> (OUT/<arm>.trained.json once its training has finished). The base model's measurement is
one shared record (--base; the full size's in benchmarks/results/joint_vs_single_base.json, read by
every --out; an OUT/base.json of an older layout with the same measurement is taken up into it). Run
the script again and it goes on from the first arm it has not finished, without training again an
arm whose training had finished, as long as the settings are the same (`--fresh` starts over). With
`--arms` only those arms run; the others' kept records are reported with them, and the arms with no
record are named. The full size keeps its records in benchmarks/results/joint_vs_single_14steps/,
in the repository (those of earlier designs, which this one no longer reads: the 10-step run's in
benchmarks/results/joint_vs_single/, the prefix-run design's in ..._14steps_prefix/): the arms take
longer together than one sitting on a 2-core machine, so a sitting commits the arms it finished and
the next goes on from them. The arms run with the joint ones first, since the acceptance rests on
them. The total time printed is the sum of the arms' own times.

Targets (issue 31): in the joint curriculum arm every trained domain above its base by more than
2 SE and no domain below its base by more than 2 SE; on each domain the joint curriculum arm within
2 SE of, or above, the domain's single arm; the whole benchmark within 3 hours on 2 CPU cores;
`--quick` (fewer problems and steps: the shape of the result, not its significance) in 20 minutes.
Issue 46 adds: the joint curriculum's worst trained domain above each sequential arm's worst by
2 SE or more; the joint curriculum within 2 SE of each single arm at equal completions of its domain;
the curriculum at each domain's target in no more completions than the uniform mixture; all arms in
4 hours summed over sittings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from _gain import measure  # benchmarks/, on the path when this script runs
from _harness import Bench, Timed, commit, load_avg, parser, write_record
from _joint_report import (
    TARGET_DROP_SE,
    TARGET_GAIN_SE,
    curriculum_story,
    headline,
    over_seeds,
    report_costs,
    report_equal,
    report_joint,
    report_reach,
    report_seeds,
    report_sequential,
    seesaws,
    table,
)

from postrl.builtin_models import load_model
from postrl.checkpoint import CheckpointManager
from postrl.config.loading import load_config
from postrl.config.schema import generation_limits
from postrl.curriculum.schedule import SCHEDULES, weight_metrics
from postrl.files import write_atomic
from postrl.loop import train
from postrl.monitor.alerts import read_alerts
from postrl.monitor.report import read_evals
from postrl.monitor.sinks import read_metrics
from postrl.sampling.policy import Policy
from postrl.store.query import query
from postrl.tasks.catalog import build_domains

RECIPE = "recipes/smollm2-joint.yaml"
RESULTS = "benchmarks/results/joint_vs_single_14steps"
"""The full size's records, committed: the arms span sittings (see above). The records of the design
before (the equal-completions and along-the-run readings from separate shorter runs, greedy measured
too; reported by commit c80649b) are in benchmarks/results/joint_vs_single_14steps_prefix/."""
BASE = "benchmarks/results/joint_vs_single_base.json"
"""The base model's measurement, one record for every --out of the full size (same problems and seeds)."""

FULL = {"problems": 200, "steps": 14, "prompts": 8, "samples": 8, "eval_every": 4, "eval_problems": 12, "max_tokens": 0}
"""14 steps x 8 prompts x 8 samples an arm (896 completions): on 2 CPU cores a step of 64 SmolLM2
completions takes 30-130 s (LoRA on the fused forward) and measuring one policy on 4 x 200 problems
5-13 min, so the six measurements fit the 3 hours with little to spare (16 steps would not). At 4
steps no joint arm lifted more than one domain past 2 SE; at 10 steps the joint curriculum's
smallest gain was 0.96-1.96 SE over three seeds (docs/joint.md)."""
QUICK = {"problems": 8, "steps": 3, "prompts": 2, "samples": 4, "eval_every": 3, "eval_problems": 4, "max_tokens": 64}
"""--quick: the same arms, 8 problems a domain, three steps of 8 completions (one a stage of the
sequential arms; every path of the full size runs: the checkpoints and their measurements), replies
cut at 64 tokens: the shape of the run, not its significance."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """What an arm trains: its overrides of the recipe, and which domains."""

    overrides: tuple[str, ...]
    only: str | None = None
    """The one domain it trains (its recipe entry kept whole), the others measured only; None: all."""
    stages: tuple[str, ...] = ()
    """A sequential arm: the domains one after the other, in this order (`stage_lengths` steps each)."""
    along: tuple[int, ...] = ()
    """Steps whose checkpoint (the weights after that many steps) is measured too, pass@1 alone on
    the domains the arm trains: the equal-completions and completions-to-target readings."""


def stage_lengths(steps: int, stages: int) -> list[int]:
    """Steps of each of `stages` stages of a `steps`-step run: the nearest whole number to an equal
    share each, the last stage what is left (off by at most one for three stages), e.g. 14 steps in
    3 -> [5, 5, 4], 13 -> [4, 4, 5]. The first length is also where a single arm has seen its
    domain's share of a joint arm's completions."""
    share = max(1, (2 * steps + stages) // (2 * stages))  # steps / stages rounded half up
    last = steps - share * (stages - 1)
    if last < 1:
        raise ValueError(f"{steps} steps cannot make {stages} stages of at least one step each")
    return [share] * (stages - 1) + [last]


def stage_bounds(steps: int, order: tuple[str, ...]) -> list[tuple[str, int, int]]:
    """(domain, first step, step after its last) of each stage, in order: 14 steps over (a, b, c) ->
    [(a, 0, 5), (b, 5, 10), (c, 10, 14)]."""
    out, start = [], 0
    for domain, n in zip(order, stage_lengths(steps, len(order))):
        out.append((domain, start, start + n))
        start += n
    return out


class SequentialSchedule:
    """The domains one after the other: the whole draw goes to one domain for its stage's steps
    (`stage_bounds`), then to the next. Registered as `curriculum.schedule: sequential` for a
    sequential arm's run only (the order and lengths are the arm's, not a recipe's), so one run
    trains the stages with one optimiser: what fine-tuning the domains in turn would be if each
    stage resumed the previous one's full state. Its state is the step it has reached."""

    def __init__(self, weights: dict[str, float], *, order: tuple[str, ...], steps: int, **_):
        if sorted(order) != sorted(weights):
            raise ValueError(f"sequential stages {order} are not the run's domains {sorted(weights)}")
        self.bounds = stage_bounds(steps, order)
        self.step = 0
        self.weights = self.at(0)

    def at(self, step: int) -> dict[str, float]:
        """The draw's weights at `step`: 1 for its stage's domain, 0 for the others."""
        current = next((d for d, start, end in self.bounds if start <= step < end), self.bounds[-1][0])
        return {d: float(d == current) for d, _, _ in self.bounds}

    def update(self, step: int, samples: list) -> None:
        self.step = step + 1  # the next draw is step + 1's
        self.weights = self.at(self.step)

    def task_weight(self, task) -> float:
        return 1.0

    def metrics(self) -> dict[str, float]:
        return weight_metrics(self.weights)

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        self.weights = self.at(self.step)


@contextmanager
def in_turn(order: tuple[str, ...], steps: int) -> Iterator[None]:
    """Inside, `curriculum.schedule: sequential` names the `SequentialSchedule` of `order` over a
    `steps`-step run (a registry entry for one run, as a reward model's term is); an empty order
    registers nothing."""
    if not order:
        yield
        return
    SCHEDULES.add("sequential", partial(SequentialSchedule, order=order, steps=steps))
    try:
        yield
    finally:
        SCHEDULES.remove("sequential")


def arms(trained: list[str], steps: int, seeds: tuple[int, ...] = ()) -> dict[str, Arm]:
    """{arm: what it trains}, in the order they run: the joint arms first (the acceptance rests on
    them), then each domain alone, then the sequential arms, then the joint curriculum again under
    each of `seeds` (`joint_curriculum_seed<N>`, read by their final weights alone). Every other arm
    keeps a checkpoint every third of the steps (the `stage_lengths` first length): a sequential
    arm's are its stages' ends; a joint arm's after a third and two thirds are measured on the
    trained domains (when each reached a domain's target); a single arm's after a third, about the
    completions its domain gets in a joint arm, on its domain (joint against single at equal
    completions), all read from the arms' own runs."""
    third = stage_lengths(steps, len(trained))[0]
    kept = (f"checkpoint.every_steps={third}", f"checkpoint.keep_last={steps // third}")
    alone = ("curriculum.schedule=fixed", "eval.every_steps=0", "eval.at_start=false", *kept)
    single = {f"single_{name}": Arm(alone, only=name, along=(third,)) for name in trained}
    in_turn = ("curriculum.schedule=sequential", "eval.every_steps=0", "eval.at_start=false", *kept)
    along = tuple(range(third, steps, third))
    joint = {"joint_curriculum": Arm(("curriculum.schedule=learnability", *kept), along=along),
             "joint_uniform": Arm(("curriculum.schedule=fixed", *kept), along=along)}
    reseeded = {f"joint_curriculum_seed{n}": Arm((f"seed={n}", "curriculum.schedule=learnability")) for n in seeds}
    return {**joint, **single, "sequential": Arm(in_turn, stages=tuple(trained)),
            "sequential_rev": Arm(in_turn, stages=tuple(reversed(trained))), **reseeded}


def columns(trained: list[str]) -> list[str]:
    """The table's order: the base model, each domain alone, jointly, then one after the other."""
    return ["base", *(f"single_{name}" for name in trained), "joint_uniform", "joint_curriculum", "sequential",
            "sequential_rev"]


def fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


class Arms:
    """Runs and measures the arms, keeping each one's result on disk (OUT/<arm>.json; the base
    model's in the shared record `base`)."""

    def __init__(self, out: Path, recipe: str, size: dict, fresh: bool, extra: list[str] | None = None,
                 runs: Path | None = None, base: Path | None = None, greedy: bool = False):
        self.greedy = greedy
        """Measure each arm's final weights on greedy replies too (`--greedy`); every target reads pass@1."""
        self.out, self.recipe, self.size, self.extra = out, recipe, size, extra or []
        """`extra`: recipe overrides for every trained arm (`--set`), part of each trained arm's key."""
        self.runs = runs or out / "runs"
        """Where the trained arms' run directories go (weights, rollouts: never in the repository)."""
        self.base = base or out / "base.json"
        """The base model's measurement: one record, shared by every OUT of the same measurement."""
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

    def path(self, name: str) -> Path:
        return self.base if name == "base" else self.out / f"{name}.json"

    def kept(self, name: str, key: str) -> dict | None:
        """The arm's kept record when it was made with these settings. The base model's is also
        taken from OUT/base.json (one copy per OUT, the layout before the shared record) and then
        kept in the shared record as it was."""
        for path in [self.path(name), *([self.out / "base.json"] if name == "base" else [])]:
            record = json.loads(path.read_text()) if path.is_file() else {}
            if record.get("key") == key:
                if path != self.path(name):
                    self.base.parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(self.base, json.dumps(record))
                return record
        return None

    def run(self, name: str, arm: Arm | None) -> dict:
        """An arm's result, kept or made: train (unless `arm` is None: the base model), then measure
        on every domain's held-out problems, a sequential arm after each stage too (`stages`), and
        another arm at each of its `along` steps (`along`)."""
        key = self.key(*((arm.overrides, arm.only, arm.stages) if arm else (None, None)))
        if kept := self.kept(name, key):
            print(f"{name}: kept from {self.path(name)} ({kept['seconds'] / 60:.1f} min when it ran)", flush=True)
            return kept
        loads, run_dir, model, train_s = [load_avg()], None, self.bench.model.name, 0.0
        if arm is not None:
            run_dir = self.runs / name
            train_s, loads = self.train(name, arm, key, run_dir, loads)
            model = str(run_dir / "final")
        measuring = Timed()
        results = self.measure(name, model, self.suites)
        extra = {} if arm is None else self.stages(name, arm, run_dir) if arm.stages else self.along(name, arm, run_dir)
        loads.append(load_avg())
        kept = {"key": key, "arm": name, "results": results, "seconds": train_s + measuring.seconds,
                "train_seconds": train_s, "load": loads, "run_dir": str(run_dir) if run_dir else None,
                "completions": completions(run_dir) if run_dir else {},
                "run": run_record(run_dir, self.trained) if run_dir else None,
                "times": {**step_times(run_dir), "train_s": train_s, "measure_s": measuring.seconds} if run_dir else {},
                **extra}
        return write_record(self.path(name), kept, self.commit)

    def train(self, name: str, arm: Arm, key: str, run_dir: Path, loads: list[float]) -> tuple[float, list[float]]:
        """Train the arm into `run_dir` (unless its training is kept): (training seconds, loads)."""
        trained = self.trained_run(name, key, run_dir)
        if trained:
            print(f"{name}: its training kept from {run_dir} ({trained['train_seconds'] / 60:.1f} min when it ran)",
                  flush=True)
            return trained["train_seconds"], trained["load"]
        clock = Timed()
        with in_turn(arm.stages, self.size["steps"]):
            cfg = load_config(self.recipe, [*self.common(), *self.extra, *arm.overrides, f"run.dir={run_dir}"])
            if arm.only:  # one trained domain, its recipe entry kept whole; the others are measured only
                cfg = dataclasses.replace(cfg, domains={arm.only: cfg.domains[arm.only]})
            print(f"{name}: training {' then '.join(arm.stages) or ', '.join(cfg.domains)} for "
                  f"{cfg.train.total_steps} steps ({cfg.curriculum.schedule} schedule) -> {run_dir}", flush=True)
            train(cfg, log=lambda *_: None)
        loads = [*loads, load_avg()]
        write_record(self.out / f"{name}.trained.json", {"key": key, "train_seconds": clock.seconds, "load": loads},
                     self.commit)
        return clock.seconds, loads

    def measure(self, name: str, model: str | Path, suites: dict, greedy: bool = True) -> dict:
        """`model` on `suites`: one sample a problem at T=0.7, and greedy where asked here and by
        `self.greedy` (the readings along a run are pass@1 alone: the samples are the same)."""
        print(f"{name}: measuring {model}", flush=True)
        policy = Policy(*load_model(str(model), self.bench.model.dtype, log=lambda *_: None))
        return measure(policy, suites, self.bench, self.tokens, greedy and self.greedy)

    def stages(self, name: str, arm: Arm, run_dir: Path) -> dict:
        """A sequential arm's weights after each stage but the last, from the run's checkpoints, on
        every domain, pass@1 alone (`stages`, the last stage's results the arm's own)."""
        steps = self.size["steps"]
        return {"stages": [{"domain": d, "steps": [start, end], **({} if end == steps else {
            "results": self.measure(f"{name} after {d}", checkpoint(run_dir, end), self.suites, greedy=False)})}
            for d, start, end in stage_bounds(steps, arm.stages)]}

    def along(self, name: str, arm: Arm, run_dir: Path) -> dict:
        """An arm's weights after each of its `along` steps, from the run's checkpoints, on the domains
        it trains, pass@1 alone (`along`: the step, the completions it had trained on per domain, the
        results)."""
        suites = {d: self.suites[d] for d in ([arm.only] if arm.only else self.trained)}
        return {"along": [{"step": k, "completions": completions(run_dir, before=k),
                           "results": self.measure(f"{name} after {k} steps", checkpoint(run_dir, k), suites,
                                                   greedy=False)} for k in arm.along]} if arm.along else {}

    def trained_run(self, arm: str, key: str, run_dir: Path) -> dict | None:
        """The record of this arm's finished training, when it was made with these settings and its
        final weights are there (the arm was stopped while it was being measured)."""
        path = self.out / f"{arm}.trained.json"
        if not path.is_file() or not (run_dir / "final").is_dir():
            return None
        record = json.loads(path.read_text())
        return record if record.get("key") == key else None

    def key(self, overrides, only: str | None, stages: tuple[str, ...] = ()) -> str:
        """An arm's settings: the measurement's, and for a trained arm the recipe and the run's size
        (a sequential arm's order too)."""
        if overrides is None:
            return self.measure_key
        return fingerprint(self.measure_key, Path(self.recipe).read_text(), self.size, [*self.extra, *overrides], only,
                           *([list(stages)] if stages else []))

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


def completions(run_dir: Path, before: int | None = None) -> dict[str, int]:
    """The sampled completions a run trained on, per domain, counted in its rollout store (in its
    steps before `before` only, where given)."""
    where = "" if before is None else f" WHERE step < {int(before)}"
    rows = query(run_dir, f"SELECT domain, count(*) FROM rollouts{where} GROUP BY domain ORDER BY domain").rows
    return {domain: int(n) for domain, n in rows}


def checkpoint(run_dir: Path, step: int) -> Path:
    """The model directory of `run_dir`'s intact checkpoint of `step` (the weights after steps
    0..step-1); a missing or damaged one is an error, never a neighbour's weights."""
    found = CheckpointManager(run_dir, log=lambda *_: None).nearest_valid(step)
    if found is None or found.step != step:
        raise FileNotFoundError(f"{run_dir}: no intact checkpoint of step {step} to measure")
    return found.model_dir


def step_times(run_dir: Path) -> dict[str, float]:
    """The run's `time/*` metrics summed over its steps (seconds; metrics.jsonl)."""
    totals: dict[str, float] = {}
    for m in read_metrics(run_dir).values():
        for k, v in m.items():
            if k.startswith("time/") and not math.isnan(v):
                totals[k] = totals.get(k, 0.0) + v
    return totals


def main(argv: list[str]) -> int:
    ap = parser(__doc__, quick="8 problems a domain, three steps an arm: the shape, in minutes", out="",
                out_help=f"where the arms' results are kept (default: {RESULTS}, in the repository; --quick: "
                "runs/joint_vs_single_quick)")
    ap.add_argument("--recipe", default=RECIPE)
    ap.add_argument("--runs", default="", help="where the arms' run directories go (default: runs/joint_vs_single[_quick])")
    ap.add_argument("--base", default="", help=f"the base model's measurement, one record shared by every --out "
                    f"(default: {BASE}; --quick: OUT/base.json)")
    ap.add_argument("--fresh", action="store_true", help="forget the arms kept in --out and run them all")
    ap.add_argument("--plot", default="", help="write the joint curriculum run's curves to PATH-eval.svg and "
                    "PATH-weights.svg, each sequential arm's stages to PATH-<arm>.svg")
    ap.add_argument("--steps", type=int, default=0, help="training steps an arm (default: the size's, 14; --quick 3)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a recipe override for every trained arm (repeatable), e.g. curriculum.domain_draw=stratified")
    ap.add_argument("--arms", default="", help="comma-separated arms to run (default all); the base model always "
                    "runs, and the other arms' kept records are reported with them")
    ap.add_argument("--greedy", action="store_true", help="measure each arm's final weights on greedy replies "
                    "too (every target reads pass@1 alone, which is the same without it)")
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
    bench = Arms(out, args.recipe, size, args.fresh, args.set, runs,
                 Path(args.base or (out / "base.json" if args.quick else BASE)), greedy=args.greedy)
    trained, domains = bench.trained, list(bench.suites)
    every = arms(trained, size["steps"], tuple(bench.bench.seed + k for k in range(1, args.seeds)))
    chosen = args.arms.split(",") if args.arms else list(every)
    if unknown := sorted(set(chosen) - set(every)):
        ap.error(f"--arms: no arm {', '.join(unknown)} (the arms: {', '.join(every)})")
    print(f"{args.recipe}: trained {trained}, control {[d for d in domains if d not in trained]}; "
          f"{size['problems']} held-out problems a domain, {size['steps']} steps x {size['prompts']} prompts x "
          f"{size['samples']} samples an arm{''.join(f'; {o}' for o in args.set)}; load {load_avg():.2f}", flush=True)
    ran = {"base": bench.run("base", None)}
    for name in chosen:
        ran[name] = bench.run(name, every[name])
    for name, arm in every.items():  # the arms of other sittings, kept with these settings
        if name not in ran and (kept := bench.kept(name, bench.key(arm.overrides, arm.only, arm.stages))):
            ran[name] = kept
    print(f"\narms with no record at these settings in {out}: {', '.join(n for n in every if n not in ran) or 'none'}")
    seeded = over_seeds(ran, domains) if any(arm.startswith("joint_curriculum_seed") for arm in ran) else {}
    results = {arm: ran[arm] for arm in columns(trained) if arm in ran}

    table(results, domains, trained)
    print("\nsampled completions trained on, per arm: " + "; ".join(
        f"{arm} {sum(r['completions'].values())} ({', '.join(f'{d} {n}' for d, n in r['completions'].items())})"
        for arm, r in results.items() if r["completions"]))
    squeezed = seesaws(results, domains, trained)
    print("single-domain arms that squeezed another domain below its base by more than 2 SE: "
          + ("; ".join(squeezed) if squeezed else "none"))
    gains = report_joint(results, domains, trained, args.plot)
    equal = report_equal(ran, trained)
    margins = report_sequential(results, domains, trained, args.plot)
    reach = report_reach(ran, trained, size)
    if seeded:
        report_seeds(seeded)
    report_costs(ran)

    for arm, margin in margins.items():
        benchmark.result(f"joint_over_{arm}_worst_se", f"{margin:.2f}", target=">=2")
    if equal:
        benchmark.result("joint_vs_single_equal_min_se", f"{min(equal):.2f}", target=">=-2")
    if reach:
        benchmark.result("curriculum_reached_no_later", f"{reach[0]}/{reach[1]}", target=f"{reach[1]}/{reach[1]}")
    if not gains:
        benchmark.result("joint_min_gain_se", "nan", "(the joint_curriculum arm was not run)", target=2)
        return 0
    min_gain, worst_drop = headline(gains, trained)
    benchmark.result("joint_min_gain_se", f"{min_gain:.2f}", target=f"{TARGET_GAIN_SE:.0f}")
    benchmark.result("joint_worst_drop_se", f"{worst_drop:.2f}", target=f"<={TARGET_DROP_SE:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
