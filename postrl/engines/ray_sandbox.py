"""The sandbox as a fleet of Ray actors (engine: ray), and the backend that reaches it.

    RewardWorker: code domain -> RaySandbox.run_many(reqs) -> SandboxFleet (one per code domain)
    trainer:      eval        -> RaySandbox.run_many(reqs) -/  queue of runs, one dispatcher thread
                                                               | each run to the least-busy actor
                                     SandboxActor 0 (node A) <-+-> SandboxActor 1 (node B) ... up to
                                     SandboxPool: elastic,         (extra: num_cpus=1, SPREAD)    ray.max_sandbox_actors
                                     warm workers

A `SandboxActor` holds an ordinary `postrl.sandbox.SandboxPool`, elastic as configured (it grows
toward `max_workers` while runs wait and stops extra workers after `idle_shrink_s`). Its worker
processes are OS processes on the actor's node, outside Ray's CPU accounting.

The `SandboxFleet` (a threaded actor, one per code domain) owns between `ray.sandbox_actors` and
`ray.max_sandbox_actors` sandbox actors. Callers' runs wait in its queue; its dispatcher thread
sends each run, one actor call per run, to the live actor with the most free slots. An actor is
given at most its pool's maximum of workers at once, so its pool still sees runs wait (and grows)
and the fleet knows where every run is. A call's runs may go to several actors: the reward actor
makes one call at a time, which would otherwise keep one actor busy and the others idle.
Checked every `_TICK_S`:
- up: while more runs are queued than the actors being started will take, one more is started,
  asking for `num_cpus=1` with the SPREAD strategy, so Ray puts it on a node with a free CPU.
  Runs keep going to the running actors meanwhile; the new one takes runs once it has started.
  One still unplaced (the cluster is full) after `sandbox_idle_s` without queued runs is
  cancelled, and so is, for `sandbox_idle_s`, any further start after one failed to start.
- down: an actor above `ray.sandbox_actors` with nothing in flight for `sandbox_idle_s` is
  stopped (having nothing in flight, it takes no run with it). The first `ray.sandbox_actors`
  ask for no CPU, as the single actor always has.
Every change of the actor count (time, count, node, why) is recorded for the engine to log.
With `max_sandbox_actors: 1` (the default) the fleet is one actor, elastic inside.

Faults: a run whose actor died (`RayActorError`) goes back to the head of the queue and is sent
to another live actor, or to the same one once Ray has restarted it (up to `ray.max_restarts`
times; `__init__` starts a fresh pool). An actor dead for good is dropped and, if it was one of
the first `ray.sandbox_actors`, replaced (at most `ray.max_restarts` times in all). A request's
outcome depends only on the request (its program, limits and inputs), and each run's result is
taken once, from the one call that came back, so nothing is lost or counted twice. A call's
re-queued runs become one event per dead actor, handed back with its results; `RaySandbox` keeps
them for the engine to log (`drain_events`). A dead fleet is restarted by Ray (with fresh actors:
its own die with it) and `RaySandbox` sends its calls again.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from postrl.errors import UserError
from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import RunRequest, RunResult, SandboxConfig

_log = logging.getLogger("postrl.engines.ray_sandbox")
_TICK_S = 0.1
"""How often the fleet looks at starting, dead, busy and idle actors."""
_POLL_S = 0.01
"""Longest wait for a run to come back before the dispatcher looks at the queue again."""


class SandboxActor:
    def __init__(self, cfg: SandboxConfig):
        self.pool = SandboxPool(cfg)
        self._lock = threading.Lock()
        self.in_flight = 0
        """run_many calls under way (the actor is threaded: one per concurrent caller)."""
        self.runs = 0

    @ray.method(concurrency_group="info")  # answers while every caller thread waits on the pool
    def info(self) -> dict:
        """What callers need to know about the pool, how it is doing, and where it runs."""
        p = self.pool
        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "preloaded": p.preloaded, "isolation": p.isolation, "n_workers": p.n_workers,
                "capacity": max(p.cfg.n_workers(), p.cfg.max_workers), "sizes": list(p.sizes),
                "in_flight": self.in_flight, "runs": self.runs, "node_id": context.get_node_id(),
                "node_ip": ray.util.get_node_ip_address()}

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


@dataclass(frozen=True)
class FleetSpec:
    """How many sandbox actors a domain has and how they are kept (from `RayConfig`)."""

    domain: str
    min_actors: int = 1
    """Started at once, and never fewer (`ray.sandbox_actors`)."""
    max_actors: int = 1
    """`ray.max_sandbox_actors`."""
    idle_s: float = 30.0
    """An extra actor idle this long is stopped (`ray.sandbox_idle_s`)."""
    max_restarts: int = 3
    """Ray restarts of each actor, and replacements of actors dead for good (`ray.max_restarts`)."""


@dataclass
class _Member:
    """One sandbox actor of the fleet: starting -> live (-> checking, after a call to it failed,
    -> live again once Ray restarted it) until it is removed, lost or cancelled."""

    key: int
    handle: Any
    extra: bool
    """Above `min_actors`: asks for a CPU, and is stopped when idle."""
    why: str
    state: str = "starting"
    probe: Any = None
    """Ref of the `info()` call that tells when it has started (or restarted)."""
    info: dict = field(default_factory=dict)
    in_flight: int = 0
    since: float = field(default_factory=time.monotonic)
    """When it was asked for, then when it last had nothing in flight."""

    @property
    def cap(self) -> int:
        return max(1, int(self.info.get("capacity", 1)))

    @property
    def node(self) -> str:
        i = self.info
        return f"{i['node_ip']}/{i['node_id'][:8]}" if i else "?"


class _Call:
    """One caller's run_many: its results fill in, in request order, as its runs come back."""

    def __init__(self, reqs: list[RunRequest]):
        self.reqs = reqs
        self.results: list[RunResult | None] = [None] * len(reqs)
        self.left = len(reqs)
        self.lost: dict[str, int] = {}
        """'ActorDiedError, actor 2 on node ...' -> this call's runs sent again after it died."""
        self.retries: dict[int, int] = {}
        """Request index -> times it was sent again."""
        self.error: BaseException | None = None
        self.done = threading.Event()

    def put(self, i: int, result: RunResult) -> None:
        if self.results[i] is None:
            self.results[i], self.left = result, self.left - 1
        if self.left == 0:
            self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = self.error or error
        self.done.set()

    def events(self) -> list[str]:
        return [f"sandbox actor died ({where}) with {n} runs of this caller in flight; runs queued again "
                f"on the fleet's live or restarted actors" for where, n in self.lost.items()]


class SandboxFleet:
    """Between `spec.min_actors` and `spec.max_actors` sandbox actors behind one queue of runs."""

    def __init__(self, cfg: SandboxConfig, spec: FleetSpec):
        self.cfg, self.spec = cfg, spec
        self._lock = threading.Lock()
        self._members: list[_Member] = []
        self._queue: collections.deque[tuple[_Call, int]] = collections.deque()
        self._outstanding: dict[Any, tuple[_Member, _Call, int]] = {}
        self._keys = 0
        self._replaced = 0
        self.runs = 0
        """Runs whose result was delivered (each once)."""
        self.changes: list[dict] = []
        """Every change of the actor count: t (unix time), actors, change, node_ip, node_id, why."""
        self._empty_since = time.monotonic()
        """When the queue was last seen with runs in it."""
        self._no_start_until = 0.0
        self._failed: str | None = None
        self._wake = threading.Event()
        self._closed = False
        for _ in range(spec.min_actors):
            self._start_member(extra=False, why="at start")
        self.first = ray.get(self._members[0].probe)  # raises, with the pool's reason, if it cannot start
        self._poll_members(wait=True)
        threading.Thread(target=self._loop, name="sandbox-fleet", daemon=True).start()

    # -- callers
    def run_many(self, reqs: list[RunRequest]) -> tuple[list[RunResult], list[str]]:
        """Results in request order, and events (actors that died with some of these runs)."""
        if not reqs:
            return [], []
        call = _Call(reqs)
        with self._lock:
            if self._failed:
                raise RuntimeError(self._failed)
            self._queue.extend((call, i) for i in range(len(reqs)))
        self._wake.set()
        call.done.wait()
        if call.error is not None:
            raise call.error
        return list(call.results), call.events()

    @ray.method(concurrency_group="info")
    def info(self, changes_since: int = 0) -> dict:
        """The pool's kind, the fleet's size and runs, its size changes from `changes_since`, and
        each live actor's pool (an actor that does not answer within 10 s is left out)."""
        with self._lock:
            live = [m for m in self._members if m.state in ("live", "checking")]
            out = {"pid": os.getpid(), "preloaded": self.first["preloaded"], "isolation": self.first["isolation"],
                   "actors": len(live), "starting": sum(m.state == "starting" for m in self._members),
                   "queued": len(self._queue), "in_flight": sum(m.in_flight for m in live), "runs": self.runs,
                   "n_changes": len(self.changes), "changes": self.changes[changes_since:]}
        answering = [m for m in live if m.state == "live"]  # one being restarted would make us wait
        refs = [m.handle.info.remote() for m in answering]
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=10.0)[0]) if refs else set()
        out["pools"] = []
        for m, ref in zip(answering, refs):
            try:
                if ref in ready:
                    out["pools"].append(ray.get(ref) | {"key": m.key})
            except ray.exceptions.RayActorError:
                pass
        out["n_workers"] = sum(p["n_workers"] for p in out["pools"])
        return out

    @ray.method(concurrency_group="info")
    def actors(self) -> list:
        """Handles of the live actors (tests kill them)."""
        with self._lock:
            return [m.handle for m in self._members if m.state in ("live", "checking")]

    @ray.method(concurrency_group="info")
    def close(self) -> None:
        self._closed = True
        with self._lock:
            members, self._members = self._members, []
        for m in members:
            ray.kill(m.handle)
        self._fail_all(RuntimeError(f"domain {self.spec.domain}: the sandbox fleet is closed"))

    # -- the dispatcher thread: runs out to actors, results back to calls, the fleet's size
    def _loop(self) -> None:
        next_tick = 0.0
        while not self._closed:
            try:
                self._dispatch()
                self._collect()
                if time.monotonic() >= next_tick:
                    self._maintain()
                    next_tick = time.monotonic() + _TICK_S
            except Exception as e:  # a bug here must not leave callers waiting forever
                _log.exception("sandbox fleet of domain %s", self.spec.domain)
                self._fail_all(e)

    def _dispatch(self) -> None:
        """Queued runs, one call each, to the live actors with free slots, least busy first."""
        with self._lock:
            while self._queue:
                free = [m for m in self._members if m.state == "live" and m.in_flight < m.cap]
                if not free:
                    return
                member = min(free, key=lambda m: (m.in_flight / m.cap, m.key))
                call, i = self._queue.popleft()
                if call.error is not None:  # the call has failed: its other runs are not wanted
                    continue
                member.in_flight += 1
                self._outstanding[member.handle.run_many.remote([call.reqs[i]])] = (member, call, i)

    def _collect(self) -> None:
        with self._lock:
            refs = list(self._outstanding)
        if not refs:
            self._wake.wait(_TICK_S)
            self._wake.clear()
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=_POLL_S)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            with self._lock:
                member, call, i = self._outstanding.pop(ref)
            try:
                result = ray.get(ref)[0]
            except ray.exceptions.RayTaskError as e:  # the pool refused the run: the caller sees why
                result, error = None, e
            except ray.exceptions.RayError as e:  # its actor died (or the node with its result)
                self._requeue(member, call, i, e)
                continue
            else:
                error = None
            with self._lock:
                self._done_with(member)
                self.runs += error is None
            if error is not None:
                call.fail(error)
            else:
                call.put(i, result)

    def _done_with(self, member: _Member) -> None:
        member.in_flight -= 1
        if member.in_flight == 0:
            member.since = time.monotonic()

    def _requeue(self, member: _Member, call: _Call, i: int, error: Exception) -> None:
        """A run lost with its actor goes to the head of the queue; the actor is checked."""
        where = f"{type(error).__name__}, actor {member.key} on node {member.node}"
        with self._lock:
            self._done_with(member)
            if member.state == "live":
                member.state, member.probe = "checking", member.handle.info.remote()
            call.lost[where] = call.lost.get(where, 0) + 1
            call.retries[i] = call.retries.get(i, 0) + 1
            if call.retries[i] <= self.spec.max_restarts + self.spec.max_actors:
                self._queue.appendleft((call, i))
                return
        call.fail(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            calls = {id(c): c for c, _ in self._queue} | {id(c): c for _, c, _ in self._outstanding.values()}
            self._queue.clear()
        for call in calls.values():
            call.fail(error)

    # -- size
    def _maintain(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._queue:
                self._empty_since = now
        self._poll_members()
        self._replace_lost()
        self._scale_up(now)
        self._scale_down(now)

    def _start_member(self, extra: bool, why: str) -> None:
        options = {"num_cpus": 1 if extra else 0, "max_restarts": self.spec.max_restarts, "max_concurrency": 128,
                   "concurrency_groups": {"info": 2}, "scheduling_strategy": "SPREAD"}
        handle = ray.remote(**options)(SandboxActor).remote(self.cfg)
        self._keys += 1
        member = _Member(self._keys - 1, handle, extra, why)
        member.probe = handle.info.remote()
        with self._lock:
            self._members.append(member)

    def _poll_members(self, wait: bool = False) -> None:
        """Starting actors that have started join; checked ones that answer are live again; those
        that died for good (or could not start) leave."""
        with self._lock:
            probing = [m for m in self._members if m.state in ("starting", "checking")]
        for m in probing:
            if not wait and not ray.wait([m.probe], timeout=0)[0]:
                continue
            try:
                info = ray.get(m.probe)
            except ray.exceptions.RayActorError as e:
                self._drop(m, "lost" if m.state == "checking" else "failed", _reason(e))
                continue
            with self._lock:
                started = m.state == "starting"
                m.info, m.state, m.probe, m.since = info, "live", None, time.monotonic()
            if started:
                self._record("added" if m.extra else "started", m, m.why)

    def _drop(self, member: _Member, change: str, why: str) -> None:
        with self._lock:
            if member not in self._members:
                return
            self._members.remove(member)
            if change == "failed":  # do not try again at once: the next would likely fail the same way
                self._no_start_until = time.monotonic() + self.spec.idle_s
        ray.kill(member.handle)
        self._record(change, member, why)

    def _replace_lost(self) -> None:
        with self._lock:
            base = sum(not m.extra for m in self._members)
            empty = not self._members
        if base >= self.spec.min_actors:
            return
        if self._replaced < self.spec.max_restarts:
            self._replaced += 1
            self._start_member(extra=False, why="replacing one that died")
        elif empty:
            with self._lock:
                self._failed = (f"domain {self.spec.domain}: every sandbox actor died and the "
                                f"{self.spec.max_restarts} replacements (ray.max_restarts) are used up")
            self._fail_all(RuntimeError(self._failed))

    def _scale_up(self, now: float) -> None:
        with self._lock:
            queued, members = len(self._queue), list(self._members)
        starting = [m for m in members if m.state == "starting"]
        cap = max((m.cap for m in members if m.info), default=1)
        if (not queued or len(members) >= self.spec.max_actors or queued <= len(starting) * cap
                or now < self._no_start_until):
            return
        self._start_member(extra=True, why=f"{queued} runs queued")

    def _scale_down(self, now: float) -> None:
        """Extra actors idle for `idle_s` are stopped; extra ones not placed while nothing queued
        for `idle_s` are cancelled."""
        with self._lock:
            spare = sum(m.state in ("live", "checking") for m in self._members) - self.spec.min_actors
            idle = [m for m in self._members if m.extra and m.state == "live" and m.in_flight == 0
                    and now - m.since >= self.spec.idle_s][:max(0, spare)]  # never below min_actors
            unplaced = [m for m in self._members if m.extra and m.state == "starting"
                        and now - max(m.since, self._empty_since) >= self.spec.idle_s] if not self._queue else []
            for m in idle + unplaced:
                self._members.remove(m)  # under the lock: no run goes to it from now on
            live = sum(m.state in ("live", "checking") for m in self._members)
        for k, m in enumerate(idle):
            ray.kill(m.handle)
            self._record("removed", m, f"idle {now - m.since:.0f} s", actors=live + len(idle) - 1 - k)
        for m in unplaced:
            ray.kill(m.handle)
            self._record("cancelled", m, f"not started in {now - m.since:.0f} s (no free CPU?); no runs queued")

    def _record(self, change: str, member: _Member, why: str, actors: int | None = None) -> None:
        """Record a change; `actors` is the count right after it (by default, now)."""
        with self._lock:
            if actors is None:
                actors = sum(m.state in ("live", "checking") for m in self._members)
            record = {"t": time.time(), "actors": actors, "change": change, "key": member.key,
                      "node_ip": member.info.get("node_ip", ""), "node_id": member.info.get("node_id", ""), "why": why}
            self.changes.append(record)
        _log.info("sandbox of domain %s: %s", self.spec.domain, describe(record))


def describe(change: dict) -> str:
    """One line for a recorded size change: '2 actors (added one on node 10.0.0.2/ab12cd34: 5 runs queued)'."""
    n = change["actors"]
    where = f" on node {change['node_ip']}/{change['node_id'][:8]}" if change["node_id"] else ""
    return f"{n} actor{'s' if n != 1 else ''} ({change['change']} one{where}: {change['why']})"


def _reason(error: Exception) -> str:
    return ([line for line in str(error).splitlines() if line.strip()] or [type(error).__name__])[-1]


def start_sandbox_fleet(cfg: SandboxConfig, spec: FleetSpec):
    """The domain's fleet (restarted by Ray when it dies) and a first `info()` of it (its first
    actors have started)."""
    fleet = ray.remote(num_cpus=0, max_restarts=spec.max_restarts, max_concurrency=64,
                       concurrency_groups={"info": 2})(SandboxFleet).remote(cfg, spec)
    try:
        return fleet, ray.get(fleet.info.remote())
    except ray.exceptions.RayActorError as e:  # its pools could not start (no isolation, ...): say why
        raise UserError(f"domain {spec.domain}: the sandbox actor could not start: {_reason(e)}") from None


class RaySandbox:
    """A sandbox backend (`run_many`, like `SandboxPool` and `RemoteSandbox`) on a domain's fleet.
    Picklable: the reward worker gets its own copy, whose events it hands back with its scores."""

    def __init__(self, fleet, info: dict, max_restarts: int):
        self.fleet, self.max_restarts = fleet, max_restarts
        self.preloaded, self.n_workers = tuple(info["preloaded"]), info["n_workers"]
        self.events: list[str] = []

    def run_many(self, reqs: list[RunRequest]) -> list[RunResult]:
        if not reqs:
            return []
        attempt = 0
        while True:
            try:
                results, events = ray.get(self.fleet.run_many.remote(reqs))
                self.events += events
                return results
            except ray.exceptions.RayActorError as e:  # Ray restarts the fleet; the calls sent meanwhile wait
                if attempt == self.max_restarts:
                    raise
                attempt += 1
                self.events.append(f"sandbox fleet died ({type(e).__name__}) with {len(reqs)} runs of this caller "
                                   f"in flight (pid {os.getpid()}); runs queued again on the restarted fleet")
                time.sleep(0.1 * attempt)

    def drain_events(self) -> list[str]:
        out, self.events = self.events, []
        return out

    def __getstate__(self) -> dict:
        return {**self.__dict__, "events": []}
