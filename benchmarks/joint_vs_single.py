"""Several domains trained jointly into one real model, against each trained alone and against the
domains trained one after the other: is there a seesaw, and does joint training avoid it?

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/joint_vs_single.py [--quick] [--out DIR] [--runs DIR]
        [--base FILE] [--fresh] [--steps N] [--set KEY=VALUE ...] [--arms ARM,ARM] [--seeds N]

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
T=0.7 with the same seeds, and greedy), and each change is reported with its paired standard error
against the base model (benchmarks/_gain.py). Besides its final weights:
  - a sequential arm's weights after each earlier stage (the run's checkpoint at the stage's end) are
    measured on every domain and the control, so the forgetting of each earlier domain is read from
    its record (`stages`);
  - each domain is also trained alone for the first third of the steps (`single_<domain>_equal`),
    about the completions its domain gets in a joint arm, and measured on its own domain: "joint
    against single at equal completions of the domain" is read from the records. A run of k steps
    is the first k steps of a longer run, weight for weight (the LR is constant after warm-up), so
    this costs what those steps cost and leaves the single arms' records as they are.
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
in the repository (the 10-step run's stay in benchmarks/results/joint_vs_single/, read with `--steps
10 --out benchmarks/results/joint_vs_single`): the arms take longer together than one sitting on a
2-core machine, so a sitting commits the arms it finished and the next goes on from them. The arms
run with the joint ones first, since the acceptance rests on them. The total time printed is the
sum of the arms' own times.

Targets (issue 31): in the joint curriculum arm every trained domain above its base by more than
2 SE and no domain below its base by more than 2 SE; on each domain the joint curriculum arm within
2 SE of, or above, the domain's single arm; the whole benchmark within 3 hours on 2 CPU cores;
`--quick` (fewer problems and steps: the shape of the result, not its significance) in 20 minutes.
Issue 46 adds: the joint curriculum's worst trained domain above each sequential arm's worst by
2 SE or more; the joint curriculum within 2 SE of each single arm at equal completions of its domain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import statistics
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from _gain import measure, paired_se, scores  # benchmarks/, on the path when this script runs
from _harness import Bench, Timed, commit, load_avg, parser, write_plot, write_record

from postrl.builtin_models import load_model
from postrl.checkpoint import CheckpointManager
from postrl.config.loading import load_config
from postrl.config.schema import generation_limits
from postrl.curriculum.schedule import SCHEDULES, weight_metrics
from postrl.files import write_atomic
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
BASE = "benchmarks/results/joint_vs_single_base.json"
"""The base model's measurement, one record for every --out of the full size (same problems and seeds)."""
TARGET_GAIN_SE = 2.0
TARGET_DROP_SE = 2.0
TARGET_HOURS = 4.0
"""Issue 46: every arm, summed over sittings (issue 31's was 3 h for the six arms it had)."""
REACH = {"word_problems": 0.28, "letter_counting": 0.20, "code": 0.28}
"""Held-out pass@1 each trained domain is to reach, stated on 2026-12-07 before the early joint arms
ran: the base plus three quarters of the smaller of the two joint arms' gains at 14 steps (word
problems 0.140 + 0.75 x 0.185, letter counting 0.115 + 0.75 x 0.115, code 0.155 + 0.75 x 0.160),
rounded to 0.01; both joint arms reach them by step 14, the question is how soon."""

FULL = {"problems": 200, "steps": 14, "prompts": 8, "samples": 8, "eval_every": 4, "eval_problems": 12, "max_tokens": 0}
"""14 steps x 8 prompts x 8 samples an arm (896 completions): on 2 CPU cores a step of 64 SmolLM2
completions takes 30-130 s (LoRA on the fused forward) and measuring one policy on 4 x 200 problems
5-13 min, so the six measurements fit the 3 hours with little to spare (16 steps would not). At 4
steps no joint arm lifted more than one domain past 2 SE; at 10 steps the joint curriculum's
smallest gain was 0.96-1.96 SE over three seeds (docs/joint.md)."""
QUICK = {"problems": 8, "steps": 3, "prompts": 2, "samples": 4, "eval_every": 3, "eval_problems": 4, "max_tokens": 64}
"""--quick: the same arms, 8 problems a domain, three steps of 8 completions (one a stage of the
sequential arms, whose paths it runs: the stage checkpoints and their measurements), replies cut at
64 tokens: the shape of the run, not its significance."""


@dataclasses.dataclass(frozen=True)
class Arm:
    """What an arm trains: its overrides of the recipe, and which domains."""

    overrides: tuple[str, ...]
    only: str | None = None
    """The one domain it trains (its recipe entry kept whole), the others measured only; None: all."""
    stages: tuple[str, ...] = ()
    """A sequential arm: the domains one after the other, in this order (`stage_lengths` steps each)."""
    measured: tuple[str, ...] = ()
    """The domains its weights are measured on (empty: every domain and the control)."""
    along: tuple[int, ...] = ()
    """Steps whose checkpoints are measured too, on the `measured` domains (the early joint arms)."""


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
    them), then each domain alone, then each domain alone for the first third of the steps
    (`single_<domain>_equal`, the `stage_lengths` first length: about the completions its domain
    gets in a joint arm, measured on that domain only), then the sequential arms, keeping a
    checkpoint at each stage's end for their measurements along the way, then each joint arm's
    first two thirds of the steps measured on the trained domains at one third and two thirds
    (`<joint arm>_early`: when each reaches a domain's target), then the joint curriculum again
    under each of `seeds` (`joint_curriculum_seed<N>`).

    An equal arm is its own short run, not a checkpoint of the single arm's: the LR is constant
    after warm-up and nothing else in a run depends on its length, so a run of k steps is the
    first k steps of a longer one, weight for weight (tests/test_joint_bench.py trains both and
    compares), and it costs what those steps cost, while a checkpoint would have meant training
    the measured single arms again."""
    third = stage_lengths(steps, len(trained))[0]
    alone = ("curriculum.schedule=fixed", "eval.every_steps=0", "eval.at_start=false")
    single = {f"single_{name}": Arm(alone, only=name) for name in trained}
    equal = {f"single_{name}_equal": Arm((*alone, f"train.total_steps={third}"), only=name, measured=(name,))
             for name in trained}
    in_turn = ("curriculum.schedule=sequential", "eval.every_steps=0", "eval.at_start=false",
               f"checkpoint.every_steps={third}", f"checkpoint.keep_last={steps // third}")
    joint = {"joint_curriculum": ("curriculum.schedule=learnability",), "joint_uniform": ("curriculum.schedule=fixed",)}
    early = {f"{name}_early": Arm((*o, f"train.total_steps={2 * third}", f"checkpoint.every_steps={third}",
                                   "checkpoint.keep_last=2"), measured=tuple(trained), along=(third,))
             for name, o in joint.items()}
    reseeded = {f"joint_curriculum_seed{n}": Arm((f"seed={n}", "curriculum.schedule=learnability")) for n in seeds}
    return {**{name: Arm(o) for name, o in joint.items()}, **single, **equal,
            "sequential": Arm(in_turn, stages=tuple(trained)),
            "sequential_rev": Arm(in_turn, stages=tuple(reversed(trained))), **early, **reseeded}


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
                 runs: Path | None = None, base: Path | None = None):
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
        on every domain's held-out problems (an equal arm: its own domain's), and a sequential arm
        after each stage (`along`)."""
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
        suites = {d: self.suites[d] for d in arm.measured} if arm and arm.measured else self.suites
        results = self.measure(name, model, suites)
        extra = self.along(name, arm, run_dir) if arm else {}
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

    def measure(self, name: str, model: str | Path, suites: dict) -> dict:
        print(f"{name}: measuring {model}", flush=True)
        policy = Policy(*load_model(str(model), self.bench.model.dtype, log=lambda *_: None))
        return measure(policy, suites, self.bench, self.tokens)

    def along(self, name: str, arm: Arm, run_dir: Path) -> dict:
        """The measurements along a run, from its checkpoints: a sequential arm's weights after each
        stage but the last, on every domain (`stages`, the last stage's results the arm's own); an
        early arm's at each of its `along` steps, on its measured domains (`along`)."""
        if arm.along:
            suites = {d: self.suites[d] for d in arm.measured}
            return {"along": [{"step": step, "results": self.measure(f"{name} at step {step}", checkpoint(run_dir, step),
                                                                     suites)} for step in arm.along]}
        if not arm.stages:
            return {}
        steps = self.size["steps"]
        return {"stages": [{"domain": d, "steps": [start, end], **({} if end == steps else {
            "results": self.measure(f"{name} after {d}", checkpoint(run_dir, end), self.suites)})}
            for d, start, end in stage_bounds(steps, arm.stages)]}

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


def completions(run_dir: Path) -> dict[str, int]:
    """The sampled completions a run trained on, per domain, counted in its rollout store."""
    rows = query(run_dir, "SELECT domain, count(*) FROM rollouts GROUP BY domain ORDER BY domain").rows
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




def stage_results(record: dict) -> list[tuple[str, list[int], dict]]:
    """A sequential arm's (domain, [first step, step after its last], held-out results after the
    stage) for each stage; the last stage's results are the arm's own."""
    return [(s["domain"], s["steps"], s.get("results", record["results"])) for s in record.get("stages", [])]


def forgetting(record: dict) -> list[tuple[str, float, float, float, float]]:
    """Each earlier stage's domain of a sequential arm: (domain, its pass@1 after its own stage, at
    the end, the change, its paired SE): what the later stages took from it, measured."""
    final, out = record["results"], []
    for d, _, after in stage_results(record)[:-1]:
        delta, se = change(after[d], final[d])
        out.append((d, scores(after[d], 1)["pass@1"], scores(final[d], 1)["pass@1"], delta, se))
    return out


def stage_table(record: dict, base: dict, domains: list[str], trained: list[str]) -> list[str]:
    """A sequential arm's held-out pass@1 on every domain after each stage, and its change against
    the base model in paired SE."""
    lines = ["| after stage | " + " | ".join(d + ("" if d in trained else " (control)") for d in domains) + " |",
             "|---|" + "---|" * len(domains)]
    for d, (start, end), r in stage_results(record):
        cells = [f"{scores(r[e], 1)['pass@1']:.3f} ({in_se(*change(base[e], r[e])):+.1f} SE)" for e in domains]
        lines.append(f"| {d} (steps {start}-{end - 1}) | " + " | ".join(cells) + " |")
    return lines


def worst_margin(results: dict[str, dict], joint: str, other: str, trained: list[str]) -> tuple[str, str, float, float]:
    """(`joint`'s trained domain of smallest gain against base, `other`'s, the first gain minus the
    second, its SE). One domain: the paired SE of the two arms on it; two: the two gains' paired SEs
    in quadrature (different problems)."""
    base = results["base"]["results"]
    gain = {arm: {d: change(base[d], results[arm]["results"][d]) for d in trained} for arm in (joint, other)}
    worst = {arm: min(trained, key=lambda d, arm=arm: gain[arm][d][0]) for arm in (joint, other)}
    if worst[joint] == worst[other]:
        d = worst[joint]
        return d, d, *change(results[other]["results"][d], results[joint]["results"][d])
    (gj, sj), (go, so) = gain[joint][worst[joint]], gain[other][worst[other]]
    return worst[joint], worst[other], gj - go, math.hypot(sj, so)


def equal_completions(results: dict[str, dict], trained: list[str], joint: str) -> list[tuple]:
    """Per trained domain whose equal arm ran: (domain, that arm's completions, the joint arm's
    completions of the domain, joint - single on it, paired SE)."""
    out = []
    for d in trained:
        equal = results.get(f"single_{d}_equal")
        if equal is not None and joint in results:
            out.append((d, sum(equal["completions"].values()), results[joint]["completions"].get(d, 0),
                        *change(equal["results"][d], results[joint]["results"][d])))
    return out


def time_split(record: dict) -> str:
    """Where an arm's time went: its run's `time/*` metrics summed (scoring: what it added after
    generation ended; the in-run eval where the run timed it, `time/eval_s`, all but the last),
    the rest of its training (checkpoints, loading and saving the model, and the in-run eval where
    it was not timed), and the script's measurements."""
    t = record.get("times")
    if not t:
        return "not recorded (a record from before issue 46)"
    scoring = t.get("time/reward_tail_s", t.get("time/reward_s", 0.0))
    parts = {"sampling": t.get("time/sample_s", 0.0), "scoring": scoring, "update": t.get("time/update_s", 0.0),
             "refill": t.get("time/refill_s", 0.0)}
    if "time/eval_s" in t:
        parts["in-run eval"] = t["time/eval_s"]
        parts["checkpoints, loading, last eval"] = t["train_s"] - sum(parts.values())
    else:
        parts["in-run eval, checkpoints, loading"] = t["train_s"] - sum(parts.values())
    parts["measurement"] = t["measure_s"]
    return ", ".join(f"{k} {v / 60:.1f}" for k, v in parts.items() if k != "refill" or v) + \
        f" min (scoring {t.get('time/reward_s', 0.0) / 60:.1f} min in all)"


def plot_stages(record: dict, base: dict, path: Path) -> None:
    """A sequential arm's held-out pass@1 per domain at the start and after each stage."""
    series = {d: [(0, scores(r, 1)["pass@1"]) for r in [base[d]]] for d in base}
    for _, (_, end), r in stage_results(record):
        for d in series:
            series[d].append((end, scores(r[d], 1)["pass@1"]))
    write_plot(path, f"{record['arm']}: held-out pass@1 after each stage", "pass@1", series)


def report_sequential(results: dict[str, dict], domains: list[str], trained: list[str], plot_to: str) -> dict[str, float]:
    """Print each sequential arm's stages and what it forgot, and the joint curriculum against it;
    returns {sequential arm: the joint curriculum's worst-domain margin over it, in SE}."""
    margins, base = {}, results["base"]["results"]
    for arm in ("sequential", "sequential_rev"):
        if arm not in results:
            continue
        record = results[arm]
        order = " then ".join(d for d, _, _ in stage_results(record))
        print(f"\n{arm} ({order}): held-out pass@1 after each stage (change against base in paired SE)")
        print("\n".join(stage_table(record, base, domains, trained)))
        for d, after, end, delta, se in forgetting(record):
            print(f"  {d}: {after:.3f} after its stage -> {end:.3f} at the end: {delta:+.3f} +/- {2 * se:.3f} "
                  f"({in_se(delta, se):+.1f} SE)")
        if plot_to:
            plot_stages(record, base, Path(f"{plot_to}-{arm}.svg"))
        if "joint_curriculum" in results:
            dj, do, delta, se = worst_margin(results, "joint_curriculum", arm, trained)
            margins[arm] = in_se(delta, se)
            print(f"joint curriculum's worst trained domain ({dj}) against {arm}'s ({do}), gains against base: "
                  f"{delta:+.3f} +/- {2 * se:.3f} ({margins[arm]:+.1f} SE; target >= +2)")
    return margins


def reach_points(results: dict[str, dict], joint: str, size: dict) -> list[tuple[int, dict]]:
    """(completions, held-out results on the trained domains) along `joint`'s run: its early arm's
    checkpoints and final weights, then the arm's own final weights; [] unless both ran. A run's
    first k steps are a k-step run's, so the early arm's measurements are the arm's own at k."""
    early, full = results.get(f"{joint}_early"), results.get(joint)
    if early is None or full is None:
        return []
    per_step = size["prompts"] * size["samples"]
    early_steps = [a["step"] for a in early["along"]] + [sum(early["completions"].values()) // per_step]
    return [*((step * per_step, r) for step, r in zip(early_steps, [a["results"] for a in early["along"]] +
                                                      [early["results"]])),
            (size["steps"] * per_step, full["results"])]


def first_reach(points: list[tuple[int, dict]], domain: str, target: float) -> int | None:
    """The completions at the first point where `domain`'s pass@1 is at least `target` (None: never)."""
    return next((n for n, r in points if scores(r[domain], 1)["pass@1"] >= target), None)


def report_reach(results: dict[str, dict], trained: list[str], size: dict) -> tuple[int, int] | None:
    """Print each joint arm's pass@1 along its run and the completions it took to reach each
    domain's `REACH` target; returns (domains where the curriculum got there in no more
    completions than the uniform mixture, domains with a target), None unless both early arms ran."""
    points = {j: reach_points(results, j, size) for j in ("joint_curriculum", "joint_uniform")}
    if not all(points.values()):
        return None
    targets = {d: REACH[d] for d in trained if d in REACH}
    print("\nheld-out pass@1 along the joint runs (completions: pass@1 per domain), and the completions each took "
          "to reach the targets stated first (" + ", ".join(f"{d} {t:.2f}" for d, t in targets.items()) + "):")
    not_later = 0
    for d, target in targets.items():
        at = {j: first_reach(p, d, target) for j, p in points.items()}
        curve = "; ".join(f"{j} " + " ".join(f"{n}:{scores(r[d], 1)['pass@1']:.3f}" for n, r in p)
                          for j, p in points.items())
        ok = at["joint_curriculum"] is not None and (at["joint_uniform"] is None
                                                     or at["joint_curriculum"] <= at["joint_uniform"])
        not_later += ok
        print(f"  {d}: {curve}; reached at " + ", ".join(f"{j} {n if n is not None else 'never'}"
                                                        for j, n in at.items()) + ("" if ok else " (curriculum later)"))
    return not_later, len(targets)


def report_equal(results: dict[str, dict], trained: list[str]) -> list[float]:
    """Print each joint arm against each single arm at (about) equal completions of the domain;
    returns the joint curriculum's differences in SE."""
    found = []
    for joint in ("joint_curriculum", "joint_uniform"):
        rows = equal_completions(results, trained, joint)
        if rows:
            print(f"\n{joint} vs single arms at equal domain completions (each domain alone for a third of the "
                  "steps; difference +/- 2 paired SE):")
        for d, n_single, n_joint, delta, se in rows:
            verdict = "within 2 SE or above" if in_se(delta, se) >= -2 else "BELOW by more than 2 SE"
            print(f"  {d}: {delta:+.3f} +/- {2 * se:.3f} ({in_se(delta, se):+.1f} SE, {verdict}); "
                  f"{n_joint} completions of it in {joint}, {n_single} in single_{d}_equal")
            if joint == "joint_curriculum":
                found.append(in_se(delta, se))
    return found


def report_joint(results: dict[str, dict], domains: list[str], trained: list[str], plot_to: str) -> dict[str, float]:
    """Print the joint arms' seesaw alerts, the joint curriculum against base and each single arm, and
    its run step by step; returns its gains in SE ({} when it did not run)."""
    for arm in ("joint_uniform", "joint_curriculum"):
        if arm in results:
            alerts = results[arm]["run"]["seesaw_alerts"]
            print(f"{arm}: {len(alerts)} seesaw alert(s)" + "".join(f"\n  step {a['step']}: {a['message']}" for a in alerts))
    if "joint_curriculum" not in results:
        return {}
    gains = gains_in_se(results, domains)
    print("\njoint curriculum vs base, in SE: " + ", ".join(f"{d} {g:+.1f}" for d, g in gains.items()))
    print("joint curriculum vs each single arm on its own domain, at the same total completions (difference +/- 2 "
          "paired SE):")
    for d, delta, se in joint_against_single(results, trained):
        verdict = "within 2 SE or above" if in_se(delta, se) >= -2 else "BELOW by more than 2 SE"
        print(f"  {d}: {delta:+.3f} +/- {2 * se:.3f} ({verdict})")
    joint = results["joint_curriculum"]
    print(f"\nthe joint curriculum run, step by step (postrl report {joint['run_dir']} draws it, where it is kept):")
    print("\n".join(joint["run"]["story"]))
    if plot_to:
        plot(joint["run"], Path(plot_to))
    return gains


def report_seeds(seeded: dict[str, dict]) -> None:
    print(f"\nthe joint curriculum over {len(next(iter(seeded.values()))['gains'])} seeds, pass@1 change against base: "
          "each run; their mean, in pooled paired SE (the problems' spread) and in the runs' own SE")
    for d, s in seeded.items():
        print(f"  {d}: {' '.join(f'{g:+.3f}' for g in s['gains'])}; mean {s['mean']:+.3f} "
              f"({in_se(s['mean'], s['pooled_se']):+.1f} pooled SE, {in_se(s['mean'], s['seed_se']):+.1f} seed SE)")


def report_costs(ran: dict[str, dict]) -> None:
    print("\n" + "\n".join(f"{arm}: {r['seconds'] / 60:.1f} min, {r.get('date', '?')}, at {r.get('commit') or '?'}"
                            + (f"; {time_split(r)}" if arm != "base" else "") for arm, r in ran.items()))
    seconds = sum(r["seconds"] for r in ran.values())
    loads = [x for r in ran.values() for x in r["load"]]
    print(f"\ntotal {seconds / 3600:.2f} h over the arms (target {TARGET_HOURS:.0f} h; --quick: 20 min); "
          f"load average {min(loads):.2f}-{max(loads):.2f} (median {statistics.median(loads):.2f}) on "
          f"{os.cpu_count()} CPUs")


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
                 Path(args.base or (out / "base.json" if args.quick else BASE)))
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
