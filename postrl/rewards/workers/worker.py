"""Entry point of one verifier worker process: `python -m postrl.rewards.workers.worker SPEC_JSON`.

Started and supervised by `postrl.rewards.workers.pool.WorkerPool`. SPEC (a `WorkerSpec`) names a
handler ("module:function", called with one JSON job, returning a JSON value), the soft deadline,
and options for the handler module's `warmup(**options)`, run once before the first job.

Protocol (`postrl.rewards.workers.messages`, one JSON object per line): `Ready` or `StartFailed`
first, then a `Job` arrives on stdin for each `Answer` (status ok | timeout | error) that leaves
on the process's original stdout, which is kept private (fd 1 is pointed at stderr so that a
stray print in a library cannot corrupt the stream). JSON both ways: the parent never unpickles
what a worker, which runs untrusted answers, sends it.

The soft deadline is an interval timer raising `_Deadline` (a BaseException, so libraries'
`except Exception` blocks cannot swallow it): it stops Python-level hangs without losing the
worker. A hang inside C code (a huge integer power) does not see the signal; the parent kills
the worker at its hard deadline instead.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import time
from dataclasses import replace

from postrl.rewards.workers.messages import Answer, Job, Ready, StartFailed, WorkerSpec, decode, encode


class _Deadline(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Deadline


def _describe(exc: BaseException) -> str:
    # Only string arguments are shown: str() of a sympy object in an exception can itself hang.
    text = "; ".join(a for a in exc.args if isinstance(a, str))
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


def _run(handler, job, soft_timeout_s: float) -> tuple[str, object, str]:
    signal.setitimer(signal.ITIMER_REAL, soft_timeout_s)
    try:
        return "ok", handler(job), ""
    except _Deadline:
        return "timeout", None, f"interrupted after {soft_timeout_s:.2f}s"
    except MemoryError:
        return "error", None, "MemoryError (worker memory cap)"
    except Exception as e:  # noqa: BLE001 - any failure of the scorer is reported, not raised
        return "error", None, _describe(e)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _write(out, msg: Ready | StartFailed | Answer) -> None:
    out.write((encode(msg) + "\n").encode())
    out.flush()


def _load(spec: WorkerSpec):
    from postrl.extensions import load_from_env

    load_from_env()  # the run's extensions (`imports:`), as the parent had them: they may register the handler
    module, _, func = spec.handler.partition(":")
    mod = importlib.import_module(module)
    warmup = getattr(mod, "warmup", None)
    if warmup is not None:  # lazy imports and caches are filled before confinement forbids writes
        warmup(**spec.options)
    return getattr(mod, func)


def main(argv: list[str]) -> int:
    spec = decode(argv[0], WorkerSpec)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.disable(logging.WARNING)  # math-verify warns on every timeout; verdicts go to the parent
    try:
        handler = _load(spec)
        level = "none"
        if spec.confine:
            from postrl.rewards.workers.confine import confine

            level = confine(int(spec.memory_mb))
    except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
        _write(out, StartFailed(_describe(e)))
        return 1
    signal.signal(signal.SIGALRM, _on_alarm)
    _write(out, Ready(level, os.getpid()))
    soft = float(spec.soft_timeout_s)
    for line in sys.stdin.buffer:
        job = decode(line, Job)
        t0 = time.perf_counter()
        try:
            status, value, detail = _run(handler, job.job, soft)
        except _Deadline:  # the timer fired between the handler's return and its cancellation
            status, value, detail = "timeout", None, "interrupted at the deadline"
        answer = Answer(job.id, status, value, detail, time.perf_counter() - t0)
        try:
            _write(out, answer)
        except (TypeError, ValueError):
            _write(out, replace(answer, status="error", value=None, detail="result is not JSON"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
