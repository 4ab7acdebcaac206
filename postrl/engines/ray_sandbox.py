"""The sandbox pool as a Ray actor (engine: ray), and the backend that reaches it.

    RewardWorker: code domain -> RaySandbox.run_many(reqs) --> SandboxActor (max_concurrency callers)
    trainer:      eval        -> RaySandbox.run_many(reqs) -/      SandboxPool: elastic, warm workers

The actor holds an ordinary `postrl.sandbox.SandboxPool`, elastic as configured (it grows toward
`max_workers` while runs wait and stops extra workers after `idle_shrink_s`); several callers
share it at once, which is what backs its queue up. Its worker processes are OS processes on the
actor's node, outside Ray's CPU accounting (the actor itself asks for no CPU).

Faults: Ray restarts a dead actor (up to `ray.max_restarts` times; `__init__` runs again and
starts a fresh pool). The calls it had in flight fail with `RayActorError` on the caller's side;
`RaySandbox` sends the same requests again, which wait for the restarted actor. A request's
outcome depends only on the request (its program, limits and inputs), and its first result was
never delivered, so nothing is lost or counted twice. Each re-queue is recorded as an event that
the engine logs (`drain_events`).
"""

from __future__ import annotations

import os
import threading
import time

import ray

from postrl.errors import UserError
from postrl.sandbox.pool import RunRequest, RunResult, SandboxConfig, SandboxPool


class SandboxActor:
    def __init__(self, cfg: SandboxConfig):
        self.pool = SandboxPool(cfg)
        self._lock = threading.Lock()
        self.in_flight = 0
        """run_many calls under way (the actor is threaded: one per concurrent caller)."""
        self.runs = 0

    def info(self) -> dict:
        """What callers need to know about the pool, and how it is doing."""
        p = self.pool
        return {"pid": os.getpid(), "preloaded": p.preloaded, "isolation": p.isolation, "n_workers": p.n_workers,
                "sizes": list(p.sizes), "in_flight": self.in_flight, "runs": self.runs}

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]:
        with self._lock:
            self.in_flight += 1
        try:
            results = self.pool.run_many(reqs)
        finally:
            with self._lock:
                self.in_flight -= 1
        with self._lock:
            self.runs += len(reqs)
        return results


def start_sandbox_actor(cfg: SandboxConfig, max_restarts: int, domain: str):
    """The actor (restarted by Ray when it dies) and a first `info()` of it (it has started)."""
    actor = ray.remote(num_cpus=0, max_restarts=max_restarts, max_concurrency=16)(SandboxActor).remote(cfg)
    try:
        return actor, ray.get(actor.info.remote())
    except ray.exceptions.RayActorError as e:  # its pool could not start (no isolation, ...): say why
        reason = [line for line in str(e).splitlines() if line.strip()][-1]
        raise UserError(f"domain {domain}: the sandbox actor could not start: {reason}") from None


class RaySandbox:
    """A sandbox backend (`run_many`, like `SandboxPool` and `RemoteSandbox`) on the sandbox actor.
    Picklable: the reward worker gets its own copy, whose events it hands back with its scores."""

    def __init__(self, actor, info: dict, max_restarts: int):
        self.actor, self.max_restarts = actor, max_restarts
        self.preloaded, self.n_workers = tuple(info["preloaded"]), info["n_workers"]
        self.events: list[str] = []

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]:
        if not reqs:
            return []
        attempt = 0
        while True:
            try:
                return ray.get(self.actor.run_many.remote(reqs))
            except ray.exceptions.RayActorError as e:  # Ray restarts the actor; the calls sent meanwhile wait
                if attempt == self.max_restarts:
                    raise
                attempt += 1
                self.events.append(f"sandbox actor died ({type(e).__name__}) with {len(reqs)} runs of this caller "
                                   f"in flight (pid {os.getpid()}); runs queued again on the restarted actor")
                time.sleep(0.1 * attempt)

    def drain_events(self) -> list[str]:
        out, self.events = self.events, []
        return out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "events": []}
