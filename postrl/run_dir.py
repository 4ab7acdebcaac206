"""The run directory: what holds a run, and where a new one may start.

    check_run_dir(path, overwrite)        # a run there: ConfigError (one line), unless run.overwrite
    path = make_run_dir(cfg, resume, log)  # run.dir, made; a run in it moved aside (run.overwrite)

A directory that holds a run is never written over by a new `postrl train`: that refuses, naming
`postrl train --resume DIR` and `run.overwrite=true`, which renames the old run to DIR.old-N
beside it (never copied, never deleted). Both happen before the run writes anything. Knows the
config and nothing of the run's contents beyond the names in RUN_MARKS.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from postrl.config.schema import Config
from postrl.errors import ConfigError, UserError

RUN_MARKS = ("config.yaml", "checkpoints", "rollouts", "metrics.jsonl", "final")
"""A directory holds a run when any of these is in it (config.yaml is the first thing a run writes,
atomically; the others count too, for a run whose config.yaml was deleted by hand). An absent or empty directory, or one
with other files only (a user's data, a half-written `.config.yaml.tmpPID` of a run killed at its
first write, the `data/` that `postrl.train` writes for a run before it starts) holds none: a new
run starts there and leaves those files alone."""


def held_run(path: Path) -> str | None:
    """The first of RUN_MARKS in `path`, or None when `path` holds no run."""
    return next((mark for mark in RUN_MARKS if (path / mark).exists()), None)


def check_run_dir(path: Path, overwrite: bool) -> None:
    """Refuse a new run in a directory that holds one (before anything is written), unless
    `run.overwrite`; a path that is a file is refused either way."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"config key 'run.dir' = {path}: a file, not a directory")
    mark = held_run(path)
    if mark and not overwrite:
        raise ConfigError(f"run directory {path} already holds a run ({mark}); continue it with "
                          f"`postrl train --resume {path}`, or start anew with run.overwrite=true "
                          f"(the old run is moved to {path}.old-N, not deleted)")


def move_aside(path: Path, log) -> Path:
    """`run.overwrite`: the run in `path` is renamed to `path.old-N` beside it (N one past the highest
    there, from 1): on the same filesystem, never copied, never deleted."""
    taken = [p.name.rpartition(".old-")[2] for p in path.parent.glob(f"{path.name}.old-*")]
    n = 1 + max((int(t) for t in taken if t.isdigit()), default=0)
    dest = path.with_name(f"{path.name}.old-{n}")
    path.rename(dest)
    log(f"run.overwrite: the run that was in {path} is now in {dest}")
    return dest


def make_run_dir(cfg: Config, resume: bool, log=print) -> Path:
    """The run's directory: with `resume`, the existing one; else `run.dir` (made if absent; one that
    holds a run refused, or moved aside with run.overwrite) or, unset, a new runs/NAME-TIME."""
    if resume:
        path = Path(cfg.run.dir)
        if not path.is_dir():
            raise UserError(f"cannot resume: run directory {path} does not exist")
        return path
    if cfg.run.dir:
        path = Path(cfg.run.dir)
        check_run_dir(path, cfg.run.overwrite)
        if held_run(path):
            move_aside(path, log)
    else:  # two runs started in the same second each get their own
        stem = Path("runs") / f"{cfg.run.name}-{datetime.now():%Y%m%d-%H%M%S}"
        path = next(p for p in [stem, *(Path(f"{stem}-{n}") for n in range(2, 100))] if not held_run(p))
    path.mkdir(parents=True, exist_ok=True)
    cfg.run.dir = str(path)  # the saved config names the directory it ran in
    return path
