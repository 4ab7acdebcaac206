"""What a run is: the request, its result, the settings a pool runs requests under, and the one
error a pool raises when it cannot isolate. Plain data: nothing here starts a process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

LANGUAGES = ("python", "bash")


class SandboxUnavailable(RuntimeError):
    """No worker could be started with the isolation the config demands."""


@dataclass
class SandboxConfig:
    workers: int = 0
    """Concurrent workers; 0 means one per CPU core."""
    timeout_s: float = 10.0
    """Default wall-clock limit of a run (a request may set its own)."""
    memory_mb: int = 512
    """Default address-space limit of a run."""
    max_output_bytes: int = 1 << 20
    """stdout + stderr kept per run; a run that writes more is stopped (output_limit)."""
    max_file_bytes: int = 16 << 20
    """Largest file a run may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the private /tmp (and of /dev/shm) of each worker."""
    max_procs: int = 32
    """Processes and threads a run may have at once (RLIMIT_NPROC)."""
    max_open_files: int = 128
    runs_per_worker: int = 1000
    """A worker is replaced by a fresh one after this many runs."""
    allow_unisolated: bool = False
    """Run even without namespace isolation (only rlimits, seccomp and a separate uid)."""
    allow_unisolated_key: str = "SandboxConfig.allow_unisolated"
    """How this config's user turns `allow_unisolated` on (a recipe key, a command-line flag), named
    by the refusal when isolation is unavailable; empty: there is no such setting for them."""
    use_bwrap: bool = True
    """Try bubblewrap; False forces the unisolated mode (tests of the fallback)."""
    max_queue: int = 0
    """Requests allowed to wait for a worker (used by the server); 0 means 4 per worker."""
    max_workers: int = 0
    """Elastic pool: grow toward this many workers while requests wait (0 = fixed at `workers`)."""
    idle_shrink_s: float = 30.0
    """Elastic pool: a worker above `workers` idle this long is stopped."""

    def n_workers(self) -> int:
        return self.workers if self.workers > 0 else (os.cpu_count() or 1)


@dataclass
class RunRequest:
    code: str
    language: str = "python"
    stdin: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    """Path (relative to the working directory) -> base64 content, written before the run."""
    fetch_files: list[str] = field(default_factory=list)
    """Paths read back after the run (base64 in `RunResult.files`)."""
    timeout_s: float | None = None
    memory_mb: int | None = None
    max_output_bytes: int | None = None


@dataclass
class RunResult:
    status: str
    """finished | timeout | output_limit | error (the sandbox could not run or lost the run)."""
    exit_code: int | None
    """Exit status; negative for a signal (-9 = SIGKILL); None when the run did not end."""
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    isolation: str
    """Isolation layers that were in force, e.g. 'bwrap+seccomp+uid+rlimits'."""
    files: dict[str, str] = field(default_factory=dict)
    message: str = ""
    worker_lost: bool = False
    """The worker died during the run (a program that kills its own sandbox)."""

    @property
    def memory_exceeded(self) -> bool:
        return "MemoryError" in self.stderr or "Cannot allocate memory" in self.stderr
