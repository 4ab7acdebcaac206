"""The elastic sandbox pool grows while requests wait and shrinks back after a quiet spell."""

import time

import pytest

from postrl.sandbox.pool import SandboxPool
from postrl.sandbox.runs import RunRequest, SandboxConfig, SandboxUnavailable


def test_pool_scales_up_under_load_and_back_down_when_idle():
    try:
        pool = SandboxPool(SandboxConfig(workers=1, max_workers=3, idle_shrink_s=0.5))
    except SandboxUnavailable as e:
        pytest.skip(str(e))
    with pool:
        assert pool.n_workers == 1
        slow = [RunRequest("import time; time.sleep(0.3); print('done')") for _ in range(6)]
        results = pool.run_many(slow)  # six waiting runs: the pool grows to its maximum
        assert [r.stdout.strip() for r in results] == ["done"] * 6
        assert pool.n_workers == 3 and max(n for _, n in pool.sizes) == 3
        assert all(r.isolation == pool.isolation for r in results)

        assert pool.shrink_idle() == 0  # not idle long enough yet
        time.sleep(0.6)
        assert pool.run_many([RunRequest("print(1)")])[0].stdout.strip() == "1"  # a batch starts by shrinking
        assert pool.n_workers == 1
        assert [n for _, n in pool.sizes][0] == 1 and pool.sizes[-1][1] == 1
