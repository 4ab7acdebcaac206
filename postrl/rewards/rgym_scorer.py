"""Scoring reasoning-gym answers inside confined worker processes (see `postrl.tasks.rgym`).

Kept apart from `postrl.tasks` so that a worker imports reasoning-gym and nothing of the trainer.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict

from postrl.rewards.workers.pool import WorkerPool

_worker_datasets: OrderedDict = OrderedDict()


def score_job(job: dict) -> float:
    """Worker-side handler: rebuild the item from (dataset, config, index) and score the answer."""
    import reasoning_gym  # noqa: F401  (registers the datasets)
    from reasoning_gym.factory import DATASETS

    key = (job["dataset"], repr(sorted(job["config"].items())))
    ds = _worker_datasets.get(key)
    if ds is None:
        cls, config_cls = DATASETS[job["dataset"]]
        ds = cls(config=config_cls(**job["config"]))
        _worker_datasets[key] = ds
        if len(_worker_datasets) > 64:
            _worker_datasets.popitem(last=False)
    return float(ds.score_answer(job["answer"], ds[job["index"]]))


def warmup() -> None:
    """Import reasoning-gym and sympy's parser (lazily imported by the scorers) before confinement."""
    import reasoning_gym  # noqa: F401
    from sympy.parsing.sympy_parser import parse_expr

    parse_expr("x**2 + 1")


_pools: dict[float, WorkerPool] = {}
_pools_lock = threading.Lock()


def isolated_pool(timeout_s: float) -> WorkerPool:
    """The shared pool of confined reasoning-gym scorers for this deadline (closed at exit)."""
    with _pools_lock:
        if timeout_s not in _pools:
            if not _pools:
                atexit.register(close_isolated_pools)
            _pools[timeout_s] = WorkerPool("postrl.rewards.rgym_scorer:score_job", timeout_s=timeout_s)
        return _pools[timeout_s]


def close_isolated_pools() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()
