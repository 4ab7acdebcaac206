"""Full-state checkpoints, written atomically, validated on load.

Layout under `RUN_DIR/checkpoints/`:

    step_00000010/
        model/            the policy as a Hugging Face directory (from_pretrained loads it)
        state.pt          optimiser, LR schedule, step counters, RNG states, sampler, curriculum,
                          KL controller, monitors, last rollout shard: everything else
        meta.json         step, time, and the sha256 of every file above (written last)
    latest                name of the newest complete checkpoint (replaced atomically)
    best.json             step and score of the best checkpoint by eval

Writing: everything goes to a temporary sibling directory, every file is fsynced, the directory
is renamed into place, then `latest` is replaced. A crash at any point leaves either the old
checkpoint set or the new one, never a half-written checkpoint that claims to be complete.
Loading walks from the newest checkpoint back, skipping (with a warning) any whose files do not
match meta.json. A rollback to an earlier checkpoint (`nearest_valid`) drops the later ones
(`drop_after`): they hold a branch the run abandoned, which a resume must not pick up.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from postrl.faults import crash_point
from postrl.files import write_atomic

PREFIX = "step_"


@dataclass
class Checkpoint:
    step: int
    """The next step to run: the checkpoint holds the state after steps 0..step-1."""
    path: Path

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def load_state(self) -> dict:
        return torch.load(self.path / "state.pt", weights_only=False)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    for d in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep_last: int = 2, log=print):
        self.root = Path(run_dir) / "checkpoints"
        self.keep_last = keep_last
        self.log = log

    def save(self, step: int, state: dict, save_model, score: float | None = None) -> Checkpoint:
        """`save_model(dir)` writes the HF model directory; `state` is torch-saveable."""
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"{PREFIX}{step:08d}"
        final = self.root / name
        tmp = self.root / f".tmp-{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_model(tmp / "model")
        torch.save(state, tmp / "state.pt")
        files = {str(p.relative_to(tmp)): sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        (tmp / "meta.json").write_text(json.dumps({"step": step, "time": time.time(), "files": files}, indent=1))
        fsync_tree(tmp)
        crash_point("checkpoint.write")  # files written, not yet renamed into place
        if final.exists():  # a re-run of the same step after a resume: replace it
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_atomic(self.root / "latest", name)
        if score is not None:
            self._update_best(step, score)
        self._prune()
        return Checkpoint(step, final)

    def _update_best(self, step: int, score: float) -> None:
        best = self.best()
        if best is None or score > best["score"]:
            write_atomic(self.root / "best.json", json.dumps({"step": step, "score": score}))

    def best(self) -> dict | None:
        path = self.root / "best.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def _prune(self) -> None:
        steps = self.steps()
        best = self.best()
        keep = set(steps[-self.keep_last :]) | ({best["step"]} if best else set())
        for step in steps:
            if step not in keep:
                shutil.rmtree(self.root / f"{PREFIX}{step:08d}", ignore_errors=True)
        for stale in self.root.glob(".tmp-*"):  # left by a crash mid-write
            shutil.rmtree(stale, ignore_errors=True)

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(p.name[len(PREFIX):]) for p in self.root.glob(f"{PREFIX}*") if p.name[len(PREFIX):].isdigit())

    def validate(self, path: Path) -> str | None:
        """None if the checkpoint is complete and intact, else what is wrong with it."""
        meta_path = path / "meta.json"
        if not meta_path.is_file():
            return "no meta.json (incomplete write)"
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError:
            return "meta.json is not valid JSON"
        for rel, digest in meta.get("files", {}).items():
            f = path / rel
            if not f.is_file():
                return f"missing {rel}"
            if sha256(f) != digest:
                return f"{rel} does not match its checksum"
        return None

    def latest_valid(self) -> Checkpoint | None:
        """The newest intact checkpoint; damaged ones are skipped with a warning."""
        return self._first_valid(reversed(self.steps()))

    def nearest_valid(self, step: int) -> Checkpoint | None:
        """The intact checkpoint nearest `step` from below (the newest at or before it), else the
        oldest after it; damaged ones are skipped with a warning."""
        steps = self.steps()
        return self._first_valid([s for s in reversed(steps) if s <= step] + [s for s in steps if s > step])

    def _first_valid(self, steps) -> Checkpoint | None:
        for step in steps:
            path = self.root / f"{PREFIX}{step:08d}"
            problem = self.validate(path)
            if problem is None:
                return Checkpoint(step, path)
            self.log(f"warning: skipping checkpoint {path.name}: {problem}")
        return None

    def drop_after(self, step: int) -> list[int]:
        """Delete the checkpoints of steps after `step` (and best.json, if it names one of them);
        returns their steps. After a rollback to `step` they belong to a branch the run abandoned."""
        dropped = [s for s in self.steps() if s > step]
        best = self.best()
        if best is not None and best["step"] > step:
            (self.root / "best.json").unlink()
        for s in dropped:
            shutil.rmtree(self.root / f"{PREFIX}{s:08d}")
        if dropped:
            kept = self.steps()
            if kept:
                write_atomic(self.root / "latest", f"{PREFIX}{kept[-1]:08d}")
            else:
                (self.root / "latest").unlink(missing_ok=True)
            self.log(f"dropped checkpoints of steps {', '.join(map(str, dropped))}: the run goes on from step {step}")
        return dropped
