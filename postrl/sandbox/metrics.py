"""The sandbox server's operator metrics, in the Prometheus text exposition format (version 0.0.4).

    metrics = ServerMetrics(workers=lambda: pool.n_workers)
    metrics.started(); ...; metrics.finished("Success", run_s=0.02)
    body = metrics.render()        # GET /metrics

Written by hand (no client library): this package imports nothing outside the standard library
that the sandbox does not need. Families:

    postrl_sandbox_requests_total{status}     counter: /run_code answers by status: Success, Failed,
                                              SandboxError (the run's), BadRequest (4xx), Overloaded (503)
    postrl_sandbox_rejected_total             counter: requests refused under overload (503)
    postrl_sandbox_run_seconds                histogram: wall-clock seconds of each run in a worker
    postrl_sandbox_queue_depth                gauge: accepted requests waiting for a free worker
    postrl_sandbox_workers{state}             gauge: workers busy running a request, and idle
    postrl_sandbox_in_flight                  gauge: accepted requests, running or waiting
    postrl_sandbox_capacity                   gauge: requests the server accepts at once (workers + queue)

Busy and waiting are counted by the server, which is the pool's only client under `postrl
sandbox serve`: of `in_flight` accepted requests, min(in_flight, workers) run, the rest wait.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

RUN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the run-time histogram; +Inf is implied."""
STATUSES = ("Success", "Failed", "SandboxError", "BadRequest", "Overloaded")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    """Counters and gauges of one server; thread-safe."""

    def __init__(self, workers: Callable[[], int], capacity: int = 0):
        self._workers = workers
        self.capacity = capacity
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(STATUSES, 0)
        self.rejected = 0
        self.in_flight = 0
        self.buckets = [0] * len(RUN_BUCKETS)
        self.run_count, self.run_sum = 0, 0.0

    def started(self) -> None:
        """A request was accepted (holds a slot): it runs, or waits for a worker."""
        with self._lock:
            self.in_flight += 1

    def finished(self, status: str, run_s: float | None) -> None:
        """An accepted request was answered with `status`; `run_s` is its run's wall time."""
        with self._lock:
            self.in_flight -= 1
            self.requests[status] = self.requests.get(status, 0) + 1
            if run_s is not None:
                self._observe(run_s)

    def refused(self, status: str) -> None:
        """A request answered without running: BadRequest, or Overloaded (which counts as a rejection)."""
        with self._lock:
            self.requests[status] = self.requests.get(status, 0) + 1
            self.rejected += status == "Overloaded"

    def _observe(self, seconds: float) -> None:
        self.run_count += 1
        self.run_sum += seconds
        for i, bound in enumerate(RUN_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1  # its own bucket only: render() accumulates
                break

    def render(self) -> str:
        with self._lock:
            workers = self._workers()
            busy = min(self.in_flight, workers)
            lines = _family("postrl_sandbox_requests_total", "counter", "/run_code answers by status.",
                            [(f'{{status="{s}"}}', n) for s, n in sorted(self.requests.items())])
            lines += _family("postrl_sandbox_rejected_total", "counter", "Requests refused under overload (HTTP 503).",
                             [("", self.rejected)])
            lines += self._histogram()
            lines += _family("postrl_sandbox_queue_depth", "gauge", "Accepted requests waiting for a free worker.",
                             [("", self.in_flight - busy)])
            lines += _family("postrl_sandbox_workers", "gauge", "Sandbox workers by state.",
                             [('{state="busy"}', busy), ('{state="idle"}', max(0, workers - busy))])
            lines += _family("postrl_sandbox_in_flight", "gauge", "Accepted requests, running or waiting.",
                             [("", self.in_flight)])
            lines += _family("postrl_sandbox_capacity", "gauge", "Requests accepted at once (workers + queue).",
                             [("", self.capacity)])
        return "\n".join(lines) + "\n"

    def _histogram(self) -> list[str]:
        name = "postrl_sandbox_run_seconds"
        out = [f"# HELP {name} Wall-clock seconds of each run in a sandbox worker.", f"# TYPE {name} histogram"]
        total = 0
        for bound, n in zip(RUN_BUCKETS, self.buckets):
            total += n
            out.append(f'{name}_bucket{{le="{bound}"}} {total}')
        out += [f'{name}_bucket{{le="+Inf"}} {self.run_count}', f"{name}_sum {self.run_sum!r}",
                f"{name}_count {self.run_count}"]
        return out


def _family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"] + [f"{name}{labels} {value}" for labels, value in samples]
