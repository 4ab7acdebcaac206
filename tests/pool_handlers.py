"""Handlers run inside `postrl.rewards.workers.pool` workers by tests/test_rewards_pool.py."""

import os
import signal


def echo(job):
    return job


def spin_deaf(job):
    """Busy-loop with SIGALRM blocked: what a hang inside C code looks like to the worker."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    while True:
        pass


def sleep_forever(job):
    """A Python-level hang (the worker's own soft deadline interrupts it)."""
    while True:
        signal.pause()


def crash(job):
    os._exit(3)


def write_file(job):
    """Try to create `job` (a path): the confined worker must refuse."""
    with open(job, "w") as f:
        f.write("x")
    return "written"


def echo_or_hang(job):
    """Echo, except the job "hang" busy-loops deaf to SIGALRM (only the parent's kill ends it)."""
    if job == "hang":
        spin_deaf(job)
    return job


def nap_pid(job):
    """Which worker ran the job, after 20 ms of work."""
    import time

    time.sleep(0.02)
    return os.getpid()


_options: dict = {}


def warmup(**options):
    """Called once in each worker before its first job, with the pool's `options`."""
    _options.update(options)


def options(job):
    return _options


def not_json(job):
    """A result JSON cannot carry: the worker answers `error` in its place."""
    return {1, 2}
