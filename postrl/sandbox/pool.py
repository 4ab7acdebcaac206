"""A pool of warm, isolated workers that run programs.

    with SandboxPool(SandboxConfig(workers=2)) as pool:
        result = pool.run(RunRequest(code="print(1 + 1)"))
        result.stdout, result.status, result.isolation   # '2\\n', 'finished', 'bwrap+seccomp+uid+rlimits'

Each worker is one long-lived isolated environment (one bubblewrap sandbox) holding a warm
interpreter; a run is a fork of it, so a run does not pay a process and namespace start. A
worker is restarted after `runs_per_worker` runs, after any run that killed it, and after any
run whose reply did not come in time.

This module is the queueing: which worker takes a request, when one is replaced, growing and
shrinking. A worker's own life (start, a run, stop) is `postrl.sandbox.worker`'s; the request,
the result and the settings are `postrl.sandbox.runs`'.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from postrl.sandbox import isolation
from postrl.sandbox.runs import RunRequest, RunResult, SandboxConfig, SandboxUnavailable
from postrl.sandbox.worker import PRELOAD, Launcher, Mode, Worker, try_start

_log = logging.getLogger("postrl.sandbox")


class SandboxPool:
    """Warm isolated workers; `run` is thread-safe and blocks until a worker is free."""

    preloaded = tuple(PRELOAD)

    def __init__(self, cfg: SandboxConfig | None = None):
        self.cfg = cfg or SandboxConfig()
        self._lock = threading.Lock()
        self._idle: queue.Queue[Worker] = queue.Queue()
        self._workers: list[Worker] = []
        self._closed = False
        self._launcher = Launcher()
        first = self._start_first()
        self._workers.append(first)
        n = self.cfg.n_workers()
        uids = [self._uid_for(i) for i in range(1, n)]
        rest = [Worker(i, self.cfg, first.mode, uid, self._launcher) for i, uid in zip(range(1, n), uids)]
        with ThreadPoolExecutor(max_workers=max(1, len(rest))) as ex:
            errors = [e for e in ex.map(try_start, rest) if e is not None]
        if errors:
            for w in [first, *rest]:
                w.stop()
            self._launcher.stop()
            raise errors[0]
        self._workers += rest
        for w in self._workers:
            self._idle.put(w)
        self.isolation = first.layers
        """Layers in force, e.g. 'bwrap+seccomp+uid+rlimits' (the same for every worker)."""
        self.info = dict(first.hello)
        self._min, self._max = n, max(n, self.cfg.max_workers)
        self._idle_since: dict[int, float] = {}
        """Slot -> when that worker last became idle (for shrinking)."""
        self.sizes: list[tuple[float, int]] = [(time.monotonic(), n)]
        """(time, number of workers) at start and after every grow or shrink."""

    @property
    def isolated(self) -> bool:
        return self.isolation.startswith("bwrap")

    def _uid_for(self, slot: int) -> int | None:
        if os.geteuid() != 0:
            return None
        # A uid per slot, away from system and user ranges; derived from our pid so that two
        # pools on one machine do not share uids.
        return 200_000 + (os.getpid() % 50_000) * 16 + slot

    def _start_first(self) -> Worker:
        cfg = self.cfg
        bpf = isolation.build_seccomp_bpf()
        python = isolation.find_python()
        bwrap = isolation.find_bwrap() if cfg.use_bwrap else None
        failure = "bubblewrap not found" if bwrap is None else ""
        if bwrap is not None:
            w = Worker(0, cfg, Mode(bwrap, python, bpf), self._uid_for(0), self._launcher)
            try:
                w.start()
                if w.isolated:
                    return w
                w.stop()
                failure = "bubblewrap started but the worker shares our namespaces"
            except SandboxUnavailable as e:
                failure = str(e)
        if not cfg.allow_unisolated:
            raise SandboxUnavailable(
                f"no namespace isolation available ({failure or 'disabled by config'}); " + (
                    f"turn on {cfg.allow_unisolated_key} to run with rlimits/seccomp/uid only"
                    if cfg.allow_unisolated_key else "this sandbox runs isolated only (install bubblewrap)")
            )
        w = Worker(0, cfg, Mode(None, python, bpf), self._uid_for(0), self._launcher)
        w.start()
        return w

    def run(self, req: RunRequest) -> RunResult:
        if self._closed:
            raise RuntimeError("sandbox pool is closed")
        w = self._acquire()
        try:
            result = w.run(req)
        except ValueError as e:
            result = RunResult("error", None, "", "", 0.0, 0.0, w.layers, message=str(e))
        finally:
            self._release(w)
        return result

    def _release(self, w: Worker) -> None:
        if w.sock is None or w.runs >= self.cfg.runs_per_worker:
            w.stop()
            if not self._closed:
                try:
                    w.start()
                except SandboxUnavailable:
                    time.sleep(0.5)
                    w.start()
        if self._retire_if_idle_extra(w):
            return
        self._idle_since[w.slot] = time.monotonic()
        self._idle.put(w)

    # -- elasticity: grow while requests wait, shrink back after `idle_shrink_s` of quiet
    def _acquire(self) -> Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        grown = self._grow()
        return grown if grown is not None else self._idle.get()

    def _grow(self) -> Worker | None:
        with self._lock:
            if self._closed or len(self._workers) >= self._max:
                return None
            slot = max(w.slot for w in self._workers) + 1
            w = Worker(slot, self.cfg, self._workers[0].mode, self._uid_for(slot), self._launcher)
            self._workers.append(w)
        if try_start(w) is not None:
            with self._lock:
                self._workers.remove(w)
            return None
        self._resized()
        return w

    def shrink_idle(self) -> int:
        """Stop workers above the base size that have been idle `idle_shrink_s`; returns how many."""
        stopped, keep = 0, []
        while True:
            try:
                keep.append(self._idle.get_nowait())
            except queue.Empty:
                break
        for w in keep:
            if not self._retire_if_idle_extra(w, idle_for=time.monotonic() - self._idle_since.get(w.slot, 0.0)):
                self._idle.put(w)
            else:
                stopped += 1
        return stopped

    def _retire_if_idle_extra(self, w: Worker, idle_for: float = 0.0) -> bool:
        with self._lock:
            if len(self._workers) <= self._min or idle_for < self.cfg.idle_shrink_s or self._closed:
                return False
            self._workers.remove(w)
        w.stop()
        self._resized()
        return True

    def _resized(self) -> None:
        self.sizes.append((time.monotonic(), len(self._workers)))
        _log.info("sandbox pool resized to %d workers (base %d, max %d)", len(self._workers), self._min, self._max)

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]:
        """Run requests concurrently on all workers; results in request order."""
        if not reqs:
            return []
        self.shrink_idle()  # between batches: extra workers that sat out the last idle_shrink_s go
        with ThreadPoolExecutor(max_workers=min(len(reqs), self._max)) as ex:
            return list(ex.map(self.run, reqs))

    @property
    def n_workers(self) -> int:
        return len(self._workers)

    def close(self) -> None:
        self._closed = True
        for w in self._workers:
            w.stop()
        self._launcher.stop()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
