"""A supervised pool of verifier worker processes with a hard deadline per call.

    pool = WorkerPool("postrl.rewards.math:verify_job", workers=2, timeout_s=5.0)
    outcomes = pool.map([["1/2", "\\boxed{0.5}"], ...])   # [Outcome(status, value, detail, seconds)]
    pool.close()

Why processes and not threads or signals in the caller: math-verify's own timeout is SIGALRM,
which only works in the main thread of the main interpreter, and a hang inside C code (sympy
evaluating `9^{9^{9^9}}` as a Python int) cannot be interrupted from Python at all. Here every
call runs in a worker (`postrl.rewards.workers.worker`; what the two say to each other is typed,
in `postrl.rewards.workers.messages`), so the pool is safe to call from any thread, thread pool
or actor. Each call gets `timeout_s` from the moment its worker starts on it (time spent
queueing, for a worker or behind the jobs sent ahead of it, does not count): the worker
interrupts itself at 80% of it, and if it has not answered at 100% it is SIGKILLed and replaced.
The result then says `timeout`; a crash says `error`. Neither is ever reported as a verdict.

Workers start lazily on first use and are killed by `close()`, when the pool is garbage
collected, or when the interpreter exits.
"""

from __future__ import annotations

import os
import queue
import select
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postrl.rewards.workers.messages import Answer, Job, Ready, StartFailed, WorkerSpec, decode, encode

_SOFT_FRACTION = 0.8  # of timeout_s: the worker's own interrupt, before the parent's kill
_CHUNK = 16  # most jobs pipelined to one worker at once
_REPO_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Outcome:
    status: str
    """ok | timeout | error"""
    value: Any
    """The handler's JSON result when status is ok, else None."""
    detail: str = ""
    seconds: float = 0.0
    """Wall time from hand-off to answer (or to the kill)."""


class _WorkerDied(Exception):
    pass


class _Worker:
    def __init__(self, spec: WorkerSpec, procs: set):
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "postrl.rewards.workers.worker", encode(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C in the trainer's terminal is the trainer's to handle
        )
        self._procs = procs
        procs.add(self.proc)
        self._buf = b""
        self._poll = select.poll()
        self._poll.register(self.proc.stdout.fileno(), select.POLLIN | select.POLLHUP)
        self.ready = False
        self.isolation = "unknown"
        self._next_id = 0
        self._expect: list[int] = []
        """Ids of the jobs sent and not yet answered, oldest first."""

    def wait_ready(self, timeout_s: float) -> None:
        msg = self._read(time.monotonic() + timeout_s, Ready, StartFailed)
        if not isinstance(msg, Ready):
            detail = "no answer" if msg is None else msg.detail
            self.kill()
            raise RuntimeError(f"verifier worker failed to start: {detail}")
        self.ready, self.isolation = True, msg.isolation

    def send(self, jobs: list[Any]) -> None:
        """Queue jobs on the worker's stdin; it answers them in order, one line each. Sending a
        few at once keeps the worker busy: it never waits a round trip for its next job."""
        lines = []
        for job in jobs:
            self._next_id += 1
            lines.append(encode(Job(self._next_id, job)) + "\n")
        self._expect += range(self._next_id - len(jobs) + 1, self._next_id + 1)
        try:
            self.proc.stdin.write("".join(lines).encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise _WorkerDied(f"worker gone before the call ({type(e).__name__})") from e

    def answer(self, timeout_s: float) -> Answer | None:
        """The answer to the oldest queued job, or None when `timeout_s` passed without it."""
        msg = self._read(time.monotonic() + timeout_s, Answer)
        if msg is not None and msg.id != self._expect.pop(0):
            raise _WorkerDied("worker answered out of order")
        return msg

    def _read(self, deadline: float, *expected: type) -> Any:
        """The next message, one of `expected`, or None at the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0 or not self._poll.poll(remaining_ms):
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _WorkerDied(f"worker exited (code {self.proc.wait()})")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            return decode(line, *expected)
        except ValueError as e:
            raise _WorkerDied("worker sent a malformed line") from e

    def kill(self) -> None:
        _kill(self.proc)
        self._procs.discard(self.proc)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:
            pass


def _kill_all(procs: set) -> None:
    for proc in list(procs):
        _kill(proc)
    procs.clear()


class _Cursor:
    """Hands out runs of consecutive job indices to the drivers of one `map`: each run is
    1/(2*workers) of what is left, at most `_CHUNK` and at least one job."""

    def __init__(self, n: int, workers: int):
        self.next, self.n, self.workers = 0, n, workers
        self._lock = threading.Lock()

    def take(self) -> tuple[int, int] | None:
        with self._lock:
            left = self.n - self.next
            if left <= 0:
                return None
            size = max(1, min(_CHUNK, -(-left // (2 * self.workers))))
            start, self.next = self.next, self.next + size
            return start, self.next


class WorkerPool:
    def __init__(
        self,
        handler: str,
        *,
        workers: int | None = None,
        timeout_s: float = 5.0,
        memory_mb: int = 2048,
        confine: bool = True,
        startup_timeout_s: float = 120.0,
        options: dict | None = None,
    ):
        """`options` (JSON) go to the handler module's `warmup(**options)` in each worker."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.workers = workers or os.cpu_count() or 1
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._spec = WorkerSpec(handler, timeout_s * _SOFT_FRACTION, memory_mb, confine, options or {})
        self._procs: set = set()
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self.stats = {"calls": 0, "ok": 0, "timeout": 0, "error": 0, "respawns": 0}
        self.isolation = "not started"
        self._finalizer = weakref.finalize(self, _kill_all, self._procs)

    def map(self, jobs: list[Any]) -> list[Outcome]:
        """Run every job, concurrently over the workers; outcomes in the order of `jobs`.

        One driver thread per worker takes runs of consecutive jobs from a shared cursor until none
        are left (guided scheduling: long runs first, for cache locality within a worker, since
        a group's samples share a gold answer; then shorter ones, so that no worker sits idle
        while another finishes a long tail). A run is pipelined to its worker, and every job
        still has its own deadline, counted from the answer before it; a job that overruns kills
        only its worker, and the rest of its run goes on with the replacement."""
        if len(jobs) <= 1:
            return [self.call(job) for job in jobs]
        cursor = _Cursor(len(jobs), self.workers)
        outcomes: list[Outcome | None] = [None] * len(jobs)
        drivers = [self._pool().submit(self._drive, jobs, cursor, outcomes)
                   for _ in range(min(self.workers, len(jobs)))]
        for d in drivers:
            d.result()
        return outcomes  # type: ignore[return-value]  (every slot is filled by the drivers)

    def _drive(self, jobs: list[Any], cursor: _Cursor, outcomes: list) -> None:
        worker = self._acquire()
        try:
            while (span := cursor.take()) is not None:
                start, stop = span
                done: list[Outcome] = []
                while len(done) < stop - start:
                    if not worker.ready:  # a replacement after a kill: its first line is its greeting
                        worker.wait_ready(self.startup_timeout_s)
                    more, worker = self._chunk_on(worker, jobs[start + len(done) : stop])
                    done += more
                outcomes[start:stop] = done
                with self._lock:
                    self.stats["calls"] += len(done)
                    for o in done:
                        self.stats[o.status] += 1
        finally:
            self._idle.put(worker)

    def _chunk_on(self, worker: _Worker, jobs: list[Any]) -> tuple[list[Outcome], _Worker]:
        """Outcomes of a prefix of `jobs` (all of them unless one failed the worker), and the worker
        to go on with (a fresh one after a kill)."""
        done: list[Outcome] = []
        t0 = time.monotonic()
        try:
            worker.send(jobs)
            for _ in jobs:
                t0 = time.monotonic()
                msg = worker.answer(self.timeout_s)
                if msg is None:
                    detail = f"killed at the {self.timeout_s:g}s deadline"
                    done.append(Outcome("timeout", None, detail, time.monotonic() - t0))
                    return done, self._replace(worker)
                done.append(Outcome(msg.status, msg.value, msg.detail, time.monotonic() - t0))
        except _WorkerDied as e:
            done.append(Outcome("error", None, str(e), time.monotonic() - t0))
            return done, self._replace(worker)
        return done, worker

    def call(self, job: Any) -> Outcome:
        """Run one job on the next free worker, in this thread."""
        outcomes: list[Outcome | None] = [None]
        self._drive([job], _Cursor(1, 1), outcomes)
        return outcomes[0]  # type: ignore[return-value]  (filled by the driver)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._finalizer()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        with self._lock:
            self.stats["respawns"] += 1
        return _Worker(self._spec, self._procs)

    def _acquire(self) -> _Worker:
        self._start_workers()
        worker = self._idle.get()
        if not worker.ready:
            try:
                worker.wait_ready(self.startup_timeout_s)
            except (RuntimeError, _WorkerDied):
                worker.kill()
                self._idle.put(_Worker(self._spec, self._procs))
                raise
            self.isolation = worker.isolation
        return worker

    def _start_workers(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("WorkerPool is closed")
            if self._idle.qsize() or self._procs:
                return
            for _ in range(self.workers):
                self._idle.put(_Worker(self._spec, self._procs))

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="verify")
            return self._executor
