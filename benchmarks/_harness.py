"""What every benchmark shares, so that each benchmark's file holds its measurement and nothing else:
its command line, its clock, its `RESULT` lines, its records (written whole, with the commit and the
date) and its SVG plots.

    ap = parser(__doc__, out="runs/bench-x")          # --help prints the docstring; --record FILE; --out
    ap.add_argument("--steps", type=int, default=8)   # the benchmark's own flags
    args = ap.parse_args(argv)
    bench = Bench(__file__, args)                     # the clock starts; the commit is read once, now
    with timed() as t:
        arm()                                         # t.seconds: the wall time of the block
    bench.result("speedup", f"{x:.2f}", target=1.5)   # prints `RESULT speedup=1.52 target=1.5`

`RESULT <metric>=<value> target=<target>` is the line a reader (and a script) takes a benchmark's
answer from, so it is printed in one format: `key=value` fields in the order given, a bound written
as `target<=3`. With `--record FILE` every result so far is also kept in FILE as JSON (the
benchmark, its arguments, the commit, the date, the seconds since it started), rewritten whole at
each result, so a benchmark killed later still leaves the results it printed.

Records are replaced atomically (`postrl.files`: a temporary sibling, fsync, rename): a reader or a
later sitting never finds half a record. Each is stamped with the commit the code ran at (`+` when
tracked files differed from it) and the UTC date.

A benchmark is a script (`python benchmarks/NAME.py`): its directory is first on `sys.path`, so it
imports this module as `_harness`, and imports no other benchmark (import-linter's benchmarks
contract in pyproject.toml). This module knows nothing of what a benchmark measures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from postrl.files import write_atomic
from postrl.monitor.svgplot import Line, VLine, line_plot

DATE_FORMAT = "%Y-%m-%d %H:%M UTC"


def parser(doc: str, *, out: str | None = None, out_help: str = "", quick: str = "",
           seed: int | None = None, record: bool = True) -> argparse.ArgumentParser:
    """The benchmark's argument parser: `--help` prints its docstring (`doc`) as written, and
    `--record FILE` keeps its results (`record`: it prints `RESULT` lines, through `Bench`). The
    flags benchmarks share, each only when asked for: `--out DIR` (its default `out`; ""
    conventionally a temporary directory), `--quick` (`quick`: what it shrinks, its help text) and
    `--seed N` (its default `seed`)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if record:
        ap.add_argument("--record", default="", metavar="FILE",
                        help="keep this run's RESULT values, arguments, commit and date in FILE (JSON)")
    if out is not None:
        ap.add_argument("--out", default=out, help=out_help or f"where the outputs go (default: {out or 'a temporary directory'})")
    if quick:
        ap.add_argument("--quick", action="store_true", help=quick)
    if seed is not None:
        ap.add_argument("--seed", type=int, default=seed, help=f"the seed of every random draw (default {seed})")
    return ap


def parse_recipe_args(ap: argparse.ArgumentParser, argv: list[str] | None,
                      default: str) -> tuple[argparse.Namespace, str, list[str]]:
    """Parse a command line of flags and `[RECIPE.yaml] [dotted.key=value ...]`: (the arguments, the
    recipe: the first word when it ends in .yaml, else `default`, the overrides). Any other word is a
    one-line error."""
    ap.add_argument("words", nargs="*", metavar="[RECIPE.yaml] [dotted.key=value ...]")
    args = ap.parse_args(argv)
    recipe = args.words[0] if args.words and args.words[0].endswith(".yaml") else default
    overrides = [w for w in args.words if "=" in w]
    if stray := [w for w in args.words if w != recipe and "=" not in w]:
        ap.error(f"not a recipe (.yaml) first nor a dotted.key=value override: {' '.join(stray)}")
    return args, recipe, overrides


def commit(cwd: str | Path | None = None) -> str:
    """The commit the checkout at `cwd` is at ('' outside a git checkout), with '+' when tracked
    files differ from it (untracked ones do not count: runs/ and caches are not the code)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""
    return head.stdout.strip() + ("+" if dirty else "")


def now() -> str:
    """The UTC date and minute, as records carry it: 2026-12-05 14:02 UTC."""
    return time.strftime(DATE_FORMAT, time.gmtime())


def load_avg() -> float:
    """The one-minute load average: the times of a shared machine mean little without it."""
    return os.getloadavg()[0]


def write_record(path: str | Path, record: dict, code: str) -> dict:
    """Write `record` to `path` as one JSON object, atomically (parent directories made), with
    `date` (now) and `commit` (`code`: read once when the benchmark started, since the checkout may
    move while it runs). Returns what was written."""
    stamped = {**record, "date": now(), "commit": code}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(stamped, default=str))
    return stamped


def write_plot(path: str | Path, title: str, ylabel: str, series: dict[str, Sequence[tuple[float, float]]],
               vlines: Sequence[VLine] = (), xlabel: str = "step") -> None:
    """A line plot of named (x, y) series, with `vlines` across it, written atomically as SVG."""
    svg = line_plot(title, ylabel, [Line(name, list(points)) for name, points in series.items()], vlines, xlabel)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, svg)


class Timed:
    """The wall time of a `with timed()` block: `seconds` runs on inside it and is fixed at its end."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.end: float | None = None

    @property
    def seconds(self) -> float:
        return (self.end if self.end is not None else time.perf_counter()) - self.start


@contextmanager
def timed() -> Iterator[Timed]:
    t = Timed()
    try:
        yield t
    finally:
        t.end = time.perf_counter()


def result_line(metric: str, value: object, note: str = "", **fields: object) -> str:
    """`RESULT metric=value key=value ...`: the fields in the order given; a field whose value is
    written as a bound ("<=3", ">=0.5") reads `key<=3`; `note`, free text, ends the line."""
    parts = [f"{metric}={value}"]
    for key, v in fields.items():
        text = str(v)
        parts.append(f"{key}{text}" if text.startswith(("<=", ">=", "<", ">")) else f"{key}={text}")
    return "RESULT " + " ".join(parts) + (f" {note}" if note else "")


class Bench:
    """One run of a benchmark: its name, arguments, start and commit, and the results it printed."""

    def __init__(self, file: str, args: argparse.Namespace):
        self.name = Path(file).stem
        self.args = args
        self.clock = Timed()
        self.commit = commit(Path(file).resolve().parent)
        """The code the benchmark runs with: its checkout when it started."""
        self.results: list[dict] = []

    def result(self, metric: str, value: object, note: str = "", **fields: object) -> str:
        """Print the `RESULT` line (`result_line`) and, with `--record FILE`, rewrite FILE with every
        result so far. Returns the line."""
        line = result_line(metric, value, note, **fields)
        print(line, flush=True)
        self.results.append({"metric": metric, "value": str(value), **{k: str(v) for k, v in fields.items()},
                             **({"note": note} if note else {})})
        if getattr(self.args, "record", ""):
            write_record(self.args.record, {"benchmark": self.name, "args": vars(self.args), "results": self.results,
                                            "seconds": round(self.clock.seconds, 3)}, self.commit)
        return line
