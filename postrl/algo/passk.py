"""Unbiased pass@k (Chen et al., 2021): from n samples of which c are correct,

    pass@k = 1 - C(n - c, k) / C(n, k)

the probability that at least one of k samples drawn without replacement is correct.
"""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
