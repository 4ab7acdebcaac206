"""What a verifier pool (`pool.WorkerPool`) and its worker processes (`worker`) say to each other.

    parent -> worker: WorkerSpec (the command line's one argument), then one Job per stdin line
    worker -> parent: Ready or StartFailed (its first line), then one Answer per Job, in order

Each message is a frozen dataclass; on the wire it is one JSON object per line, its fields plus a
`type` tag: `encode(msg)` makes the line, `decode(line, *expected)` reads one back as one of the
expected types. JSON both ways: the parent never unpickles what a worker, which runs untrusted
answers, sends it; a line that is not JSON, or not one of the expected messages with the fields
it must have, is a ValueError (the parent then treats the worker as broken and replaces it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

STATUSES = ("ok", "timeout", "error")


@dataclass(frozen=True)
class WorkerSpec:
    """How to start a worker."""

    handler: str
    """The function ("module:function") called with each job's JSON value; returns a JSON value."""
    soft_timeout_s: float
    """The worker interrupts itself this long into a job (the parent kills it at its hard deadline)."""
    memory_mb: int
    """Address-space cap of the confined worker."""
    confine: bool = True
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the handler module's `warmup(**options)`, run once before the first job."""


@dataclass(frozen=True)
class Ready:
    """The worker loaded its handler, confined itself and waits for jobs."""

    isolation: str
    """The confinement that took effect: seccomp, rlimits+audit or none."""
    pid: int


@dataclass(frozen=True)
class StartFailed:
    """The worker could not load its handler or confine itself; it exits."""

    detail: str


@dataclass(frozen=True)
class Job:
    id: int
    """Counts up per worker: the answers come back in this order."""
    job: Any
    """The handler's argument (JSON)."""


@dataclass(frozen=True)
class Answer:
    id: int
    """The Job's id."""
    status: str
    """ok | timeout (the soft deadline interrupted it) | error"""
    value: Any = None
    """The handler's JSON result when status is ok, else None."""
    detail: str = ""
    seconds: float = 0.0
    """The worker's own time for the job."""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"answer status {self.status!r}: expected one of {', '.join(STATUSES)}")


Message = WorkerSpec | Ready | StartFailed | Job | Answer
_TAGS: dict[type, str] = {WorkerSpec: "spec", Ready: "ready", StartFailed: "start_failed", Job: "job", Answer: "answer"}
_TYPES = {tag: cls for cls, tag in _TAGS.items()}
M = TypeVar("M")


def encode(msg: Message) -> str:
    """One line of JSON, without its newline. TypeError or ValueError if a value is not JSON."""
    return json.dumps({"type": _TAGS[type(msg)], **{f.name: getattr(msg, f.name) for f in fields(msg)}})


def decode(line: str | bytes, *expected: type[M]) -> M:
    """The message on `line`, which must be one of the `expected` types; ValueError otherwise."""
    obj = json.loads(line)
    cls = _TYPES.get(obj.pop("type", None)) if isinstance(obj, dict) else None
    if cls not in expected:
        raise ValueError(f"expected {' or '.join(c.__name__ for c in expected)}, got {str(line)[:80]!r}")
    try:
        return cls(**obj)
    except TypeError as e:  # a field missing or unknown
        raise ValueError(f"{cls.__name__}: {e}") from None
