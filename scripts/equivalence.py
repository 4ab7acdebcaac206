"""Bitwise equivalence of training runs between two source trees (a refactor's acceptance check).

    python scripts/equivalence.py --base 72dee7c                 # base commit vs this working tree
    python scripts/equivalence.py --base 72dee7c --new /tmp/other --runs default,async --keep

The base tree is a `git worktree` of `--base`, made (and removed) by this script; the new tree is
`--new` (default: the repository holding this script, uncommitted edits included). Both are run
in the same invocation on the same machine with the same Python, so float results are compared
bit for bit and the check holds on any CPU, rather than against numbers recorded elsewhere.

Each tree runs its own code: every `postrl train` is a subprocess with `cwd` and `PYTHONPATH` set
to that tree (the `postrl.__file__` each one imports is printed), using that tree's recipe files.
Both start from one base model built once by the base tree (a multi-domain spec small enough to
pretrain in seconds, whose char tokenizer covers arith, sort and generated code prompts), passed
as `model.name`, with `POSTRL_CACHE` in the temp dir so nothing pretrains the big demo models and
the user's cache is untouched. (`postrl pretrain` is not used: it builds only the full-size
arith-only spec, whose tokenizer cannot encode code or sort prompts.) One torch thread (`OMP_NUM_THREADS=1`, `run.threads=1`).

Runs: `default` (recipes/default.yaml, with checkpoints), `multidomain` (learnability curriculum
and dynamic sampling, eval every 2 steps), `async` (default recipe, `pipeline.max_staleness=2`)
and `code` (generated code problems graded in the sandbox, a recipe written to the temp dir).

Compared per run, required:
  rollouts  every Parquet shard under rollouts/, rows sorted by (step, sample), every column but
            `timings` (seconds measured on the host) exactly equal; floats compared by their bits.
  weights   every tensor of every final/*.safetensors file, `torch.equal` (max |diff| if not).
Reported, not required:
  metrics   metrics.jsonl on the keys that do not measure time: `time/*`, `pipeline/*` (waits and
            queue depths), `tokens_per_s` and any `*_s` key are left out.
  eval      eval/*.json, exactly equal.
  trained   whether the final weights differ from the base model (an equal pair of untrained
            models would prove nothing).
Exit status 0 when every run's rollouts and weights are equal, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file

DEFAULT_BASE = "72dee7c"
REPO = Path(__file__).resolve().parent.parent
TREES = ("base", "new")
EXCLUDED_COLUMNS = {"timings": "per-sample sampling/reward seconds measured on the host"}
TIMED_METRIC_PREFIXES = ("time/", "pipeline/")
TIMED_METRIC_KEYS = {"tokens_per_s"}
SUBPROCESS_TIMEOUT_S = 900

MODEL_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
from postrl.pretrain import MultiPretrainSpec, pretrain
spec = MultiPretrainSpec(steps=400, batch_size=32, hidden_size=32, layers=2, heads=2)
print(pretrain(spec, sys.argv[1], log=lambda *a: None))
"""
"""A 2-layer, hidden-32 model on the arith+code+sort corpus: ~10 s, and enough skill (a few percent
pass@1) that rewards vary within groups, so the runs really update the weights."""

CODE_RECIPE = """\
# equivalence.py: generated code problems, graded in the sandbox
seed: 0
domains:
  code:
    weight: 1.0
    params:
      source: generated
      levels: [1, 2]
      workers: 1
      timeout_s: 20.0   # generous: a timeout on a loaded machine would change a reward
train:
  total_steps: 3
  prompts_per_step: 8
  samples_per_prompt: 8
  max_new_tokens: 10
  lr: 3.0e-4
eval:
  k: [1, 4]
  samples_per_problem: 4
  num_problems: 8
run:
  name: code
"""

SMALL_EVAL = ["eval.num_problems=8", "eval.samples_per_problem=4", "eval.k=[1,4]"]


@dataclass
class RunSpec:
    name: str
    recipe: Callable[[Path, Path], Path]
    """(tree, temp dir) -> the recipe file that tree runs."""
    steps: int
    overrides: list[str]
    probes: tuple[str, ...] = ()
    """Metrics printed per step, to show the run exercised its feature."""


def tree_recipe(name: str) -> Callable[[Path, Path], Path]:
    return lambda tree, tmp: tree / "recipes" / name


def code_recipe(tree: Path, tmp: Path) -> Path:
    path = tmp / "code.yaml"
    if not path.exists():
        path.write_text(CODE_RECIPE)
    return path


RUNS = {
    "default": RunSpec("default", tree_recipe("default.yaml"), 4,
                       ["train.prompts_per_step=8", *SMALL_EVAL, "checkpoint.every_steps=2"]),
    "multidomain": RunSpec("multidomain", tree_recipe("multidomain.yaml"), 6,
                           ["train.prompts_per_step=6", "eval.every_steps=2", "eval.num_problems=12",
                            "eval.samples_per_problem=4", "eval.k=[1,4]", "checkpoint.every_steps=2"],
                           probes=("dynamic/extra_draws", "curriculum/parked")),
    "async": RunSpec("async", tree_recipe("default.yaml"), 5,
                     ["pipeline.max_staleness=2", "train.prompts_per_step=8", *SMALL_EVAL,
                      "checkpoint.every_steps=2"],
                     probes=("staleness/max",)),
    "code": RunSpec("code", code_recipe, 3, [], probes=("reward/mean", "pass_rate")),
}


@dataclass
class Verdict:
    equal: bool
    note: str = ""


@dataclass
class Outcome:
    run: str
    ok: dict[str, bool] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    checks: dict[str, Verdict] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return all(self.ok.values()) and all(self.checks[k].equal for k in ("rollouts", "weights"))


# ---------------------------------------------------------------------------- trees and runs


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def tree_env(tree: Path, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTRL_")}
    env.update(PYTHONPATH=str(tree), POSTRL_CACHE=str(tmp / "cache"), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def check_import(tree: Path, tmp: Path) -> None:
    code = "import postrl; print(postrl.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=tree_env(tree, tmp),
                         check=True, capture_output=True, text=True).stdout.strip()
    print(f"  {tree}: imports {out}")
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"error: {tree} imports postrl from {out}, not from its own tree")


def build_model(base: Path, tmp: Path) -> Path:
    out = tmp / "model"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", MODEL_SCRIPT, str(out)], cwd=base, env=tree_env(base, tmp),
                   check=True, capture_output=True, text=True)
    print(f"base model: {out} ({time.perf_counter() - t0:.0f}s, built by the base tree)")
    return out


def launch(tree: Path, spec: RunSpec, run_dir: Path, model: Path, tmp: Path) -> tuple[bool, float]:
    """One `postrl train` in `tree`; its stdout and stderr are kept next to the run directory."""
    recipe = spec.recipe(tree, tmp)
    overrides = [f"train.total_steps={spec.steps}", *spec.overrides, f"model.name={model}",
                 "run.progress=false", "run.threads=1", f"run.dir={run_dir}"]
    cmd = [sys.executable, "-m", "postrl", "train", str(recipe), *overrides]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=tree, env=tree_env(tree, tmp), capture_output=True, text=True,
                              timeout=SUBPROCESS_TIMEOUT_S)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = -1, str(e.stdout or ""), f"{e.stderr or ''}\ntimed out after {e.timeout}s"
    seconds = time.perf_counter() - t0
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    (run_dir.parent / f"{spec.name}.stdout").write_text(stdout)
    (run_dir.parent / f"{spec.name}.stderr").write_text(stderr)
    if rc != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        print(f"  FAILED ({rc}): {' '.join(cmd)}\n  cwd={tree}\n{tail}")
    return rc == 0, seconds


# ---------------------------------------------------------------------------- comparisons


def bits(value):
    """A hashable, bit-exact form of a Parquet value (floats by their IEEE bytes, NaN included)."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, list | tuple):
        return tuple(bits(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, bits(v)) for k, v in value.items()))
    return value


def short(value, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def read_rollouts(run_dir: Path) -> pa.Table | None:
    shards = sorted((run_dir / "rollouts").glob("step_*.parquet"))
    if not shards:
        return None
    table = pa.concat_tables([pq.read_table(s) for s in shards])
    return table.sort_by([("step", "ascending"), ("sample", "ascending")])


def column_difference(col: str, a: pa.ChunkedArray, b: pa.ChunkedArray, keys: list) -> str | None:
    if a.type != b.type:
        return f"{col}: type {a.type} vs {b.type}"
    if a.equals(b):
        return None
    left, right = a.to_pylist(), b.to_pylist()
    for key, x, y in zip(keys, left, right):
        if bits(x) != bits(y):
            return f"{col}: first difference at (step, sample)={key}: {short(x)} vs {short(y)}"
    return None  # only NaNs with identical bits: equal


def compare_rollouts(base: pa.Table | None, new: pa.Table | None) -> Verdict:
    if base is None or new is None:
        return Verdict(False, "no rollouts in " + ("base" if base is None else "new"))
    missing = [c for c in base.column_names if c not in new.column_names]
    extra = [c for c in new.column_names if c not in base.column_names]
    diffs = [f"columns only in base: {missing}"] if missing else []
    if base.num_rows != new.num_rows:
        diffs.append(f"rows {base.num_rows} vs {new.num_rows}")
    else:
        keys = list(zip(base.column("step").to_pylist(), base.column("sample").to_pylist()))
        compared = [c for c in base.column_names if c not in EXCLUDED_COLUMNS and c not in missing]
        diffs += filter(None, (column_difference(c, base.column(c), new.column(c), keys) for c in compared))
    notes = [f"columns only in new (not compared): {extra}"] if extra else []
    return Verdict(not diffs, "; ".join(diffs + notes))


def load_weights(final_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every safetensors file in `final_dir` (the model, and adapters if any)."""
    return {f"{f.name}:{k}": t for f in sorted(final_dir.glob("*.safetensors")) for k, t in load_file(f).items()}


def compare_tensors(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> Verdict:
    if not base:
        return Verdict(False, "no safetensors in base final/")
    if base.keys() != new.keys():
        return Verdict(False, f"tensor names differ: only base {sorted(base.keys() - new.keys())[:3]}, "
                              f"only new {sorted(new.keys() - base.keys())[:3]}")
    different, max_diff = [], 0.0
    for name, a in base.items():
        b = new[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            different.append(f"{name} {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        elif not torch.equal(a, b):
            different.append(name)
            max_diff = max(max_diff, (a.double() - b.double()).abs().max().item())
    if not different:
        return Verdict(True)
    return Verdict(False, f"{len(different)}/{len(base)} tensors differ (max |diff| {max_diff:.3g}), "
                          f"e.g. {different[0]}")


def compare_weights(base_dir: Path, new_dir: Path) -> Verdict:
    if not (base_dir / "final").is_dir() or not (new_dir / "final").is_dir():
        return Verdict(False, "final/ missing")
    return compare_tensors(load_weights(base_dir / "final"), load_weights(new_dir / "final"))


def timed(key: str) -> bool:
    return key.startswith(TIMED_METRIC_PREFIXES) or key in TIMED_METRIC_KEYS or key.endswith("_s")


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def compare_metrics(base: list[dict], new: list[dict]) -> Verdict:
    if not base or len(base) != len(new):
        return Verdict(False, f"metric lines {len(base)} vs {len(new)}")
    differing, one_sided = [], set()
    for a, b in zip(base, new):
        one_sided |= {k for k in a.keys() ^ b.keys() if not timed(k)}
        differing += [(a.get("step"), k, a[k], b[k]) for k in a.keys() & b.keys() if not timed(k) and a[k] != b[k]]
    notes = [f"keys in one tree only: {sorted(one_sided)[:5]}"] if one_sided else []
    if differing:
        step, key, x, y = differing[0]
        notes.insert(0, f"{len(differing)} values differ, first step {step} {key}: {x} vs {y}")
    return Verdict(not differing, "; ".join(notes))


def compare_eval(base_dir: Path, new_dir: Path) -> Verdict:
    def read(d: Path) -> dict:
        return {f.name: json.loads(f.read_text()) for f in sorted((d / "eval").glob("*.json"))}

    a, b = read(base_dir), read(new_dir)
    if a.keys() != b.keys():
        return Verdict(False, f"eval files {sorted(a)} vs {sorted(b)}")
    different = [name for name in a if a[name] != b[name]]
    return Verdict(not different, f"differ: {different}" if different else "")


def trained(run_dir: Path, model: Path) -> Verdict:
    final = run_dir / "final" / "model.safetensors"
    if not final.exists():
        return Verdict(False, "no final/model.safetensors")
    start, end = load_file(model / "model.safetensors"), load_file(final)
    moved = sum(not torch.equal(start[k], end[k]) for k in start if k in end)
    return Verdict(moved > 0, f"{moved}/{len(start)} tensors moved from the base model")


# ---------------------------------------------------------------------------- report


def compare_run(spec: RunSpec, dirs: dict[str, Path], model: Path, outcome: Outcome) -> None:
    tables = {t: read_rollouts(dirs[t]) if outcome.ok[t] else None for t in TREES}
    outcome.rows = {t: 0 if tables[t] is None else tables[t].num_rows for t in TREES}
    if not all(outcome.ok.values()):
        failed = Verdict(False, "run failed in " + ", ".join(t for t in TREES if not outcome.ok[t]))
        outcome.checks = dict.fromkeys(("rollouts", "weights", "metrics", "eval", "trained"), failed)
        return
    metrics = {t: read_metrics(dirs[t]) for t in TREES}
    outcome.checks = {
        "rollouts": compare_rollouts(tables["base"], tables["new"]),
        "weights": compare_weights(dirs["base"], dirs["new"]),
        "metrics": compare_metrics(metrics["base"], metrics["new"]),
        "eval": compare_eval(dirs["base"], dirs["new"]),
        "trained": trained(dirs["base"], model),
    }
    for key in spec.probes:
        for tree in TREES:
            values = [m.get(key) for m in metrics[tree]]
            print(f"  {tree:4s} {key} per step: {values}")
    if "dynamic/extra_draws" in spec.probes and not any(m.get("dynamic/extra_draws") for m in metrics["base"]):
        print("  WARNING: dynamic sampling drew no extra rounds; the feature was not exercised")


def print_table(outcomes: list[Outcome]) -> None:
    def yes(v: Verdict) -> str:
        return "yes" if v.equal else "NO"

    header = f"{'run':12s} | {'rollout rows (base/new)':23s} | rollouts equal | weights equal | " \
             f"metrics equal | eval equal | trained | seconds (base/new)"
    print("\n" + header + "\n" + "-" * len(header))
    for o in outcomes:
        c = o.checks
        rows = f"{o.rows['base']}/{o.rows['new']}"
        secs = f"{o.seconds['base']:.0f}/{o.seconds['new']:.0f}"
        print(f"{o.run:12s} | {rows:23s} | {yes(c['rollouts']):14s} | {yes(c['weights']):13s} | "
              f"{yes(c['metrics']):13s} | {yes(c['eval']):10s} | {yes(c['trained']):7s} | {secs}")
    for o in outcomes:
        for name, v in o.checks.items():
            if v.note and (not v.equal or name == "trained"):
                print(f"  {o.run}/{name}: {v.note}")
    print("excluded rollout columns: " + "; ".join(f"{c} ({why})" for c, why in EXCLUDED_COLUMNS.items()))
    print("excluded metrics: time/*, pipeline/*, tokens_per_s, *_s (they measure time, not the run)")


# ---------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default=DEFAULT_BASE, help=f"git commit of the code before the change ({DEFAULT_BASE})")
    p.add_argument("--new", type=Path, default=REPO, help="tree with the new code (default: this repository)")
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {','.join(RUNS)}")
    p.add_argument("--steps", type=int, help="train.total_steps for every run (default: each run's own)")
    p.add_argument("--keep", action="store_true", help="keep the base worktree and the run directories")
    args = p.parse_args(argv)
    args.runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown:
        p.error(f"unknown runs {unknown}; choose from {list(RUNS)}")
    return args


def describe_trees(commit: str, trees: dict[str, Path], tmp: Path) -> None:
    print(f"base: {commit} in worktree {trees['base']}")
    head = git("rev-parse", "--short", "HEAD", cwd=trees["new"])
    dirty = len(git("status", "--porcelain", "--untracked-files=no", cwd=trees["new"]).splitlines())
    print(f"new:  {trees['new']} (HEAD {head}, {dirty} modified tracked files)")
    for tree in TREES:
        check_import(trees[tree], tmp)


def run_all(args: argparse.Namespace, trees: dict[str, Path], tmp: Path) -> list[Outcome]:
    model = build_model(trees["base"], tmp)
    outcomes = []
    for name in args.runs:
        spec = RUNS[name]
        if args.steps is not None:
            spec = RunSpec(spec.name, spec.recipe, args.steps, spec.overrides, spec.probes)
        print(f"[{name}] {spec.steps} steps")
        outcome, dirs = Outcome(name), {t: tmp / "runs" / t / name for t in TREES}
        for tree in TREES:
            outcome.ok[tree], outcome.seconds[tree] = launch(trees[tree], spec, dirs[tree], model, tmp)
        compare_run(spec, dirs, model, outcome)
        outcomes.append(outcome)
    return outcomes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    commit = git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    tmp = Path(tempfile.mkdtemp(prefix="postrl-equivalence-"))
    trees = {"base": tmp / "base", "new": args.new.resolve()}
    git("worktree", "add", "--detach", str(trees["base"]), commit)
    try:
        describe_trees(commit[:12], trees, tmp)
        outcomes = run_all(args, trees, tmp)
    finally:
        if args.keep:
            print(f"kept: {tmp} (remove the worktree with `git worktree remove --force {trees['base']}`)")
        else:
            git("worktree", "remove", "--force", str(trees["base"]))
            shutil.rmtree(tmp, ignore_errors=True)
    print_table(outcomes)
    same = sum(o.identical for o in outcomes)
    print(f"total {time.perf_counter() - t0:.0f}s")
    print(f"RESULT identical_runs={same}/{len(outcomes)} target={len(outcomes)}/{len(outcomes)}")
    return 0 if same == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
