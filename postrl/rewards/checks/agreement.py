"""Agreement between a reward and human labels: accuracy, Cohen's kappa, confusion, disagreements.

    >>> a = agreement([1, 1, 0, 0], [1, 0, 0, 0])
    >>> a.accuracy, round(a.kappa, 3), a.disagreements
    (0.75, 0.5, [1])

Kappa corrects accuracy for the agreement two raters would reach by chance given how often each
says each label: kappa = (p_o - p_e) / (1 - p_e), with p_o the observed agreement and p_e the sum
over labels of the product of the two raters' label frequencies. It is undefined (NaN) when both
raters use one and the same label throughout (p_e = 1); a NaN kappa fails any `--min-kappa` gate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Agreement:
    n: int
    accuracy: float
    kappa: float
    labels: list
    """Label values in a fixed order (sorted by their text)."""
    confusion: list[list[int]]
    """confusion[i][j] = examples labelled labels[i] by humans and labels[j] by the reward."""
    disagreements: list[int]
    """Indices of the examples where the two differ, for reading."""


def cohen_kappa(human: Sequence[Hashable], predicted: Sequence[Hashable]) -> float:
    n = len(human)
    if n == 0 or n != len(predicted):
        raise ValueError("kappa needs two equally long, non-empty label sequences")
    p_o = sum(h == p for h, p in zip(human, predicted)) / n
    freq_h, freq_p = Counter(human), Counter(predicted)
    p_e = sum(freq_h[k] * freq_p[k] for k in freq_h) / (n * n)
    if p_e == 1.0:
        return float("nan")
    return (p_o - p_e) / (1.0 - p_e)


def agreement(human: Sequence[Hashable], predicted: Sequence[Hashable]) -> Agreement:
    labels = sorted(set(human) | set(predicted), key=str)
    index = {label: i for i, label in enumerate(labels)}
    confusion = [[0] * len(labels) for _ in labels]
    for h, p in zip(human, predicted, strict=True):
        confusion[index[h]][index[p]] += 1
    disagreements = [i for i, (h, p) in enumerate(zip(human, predicted)) if h != p]
    n = len(human)
    return Agreement(
        n=n,
        accuracy=(n - len(disagreements)) / n,
        kappa=cohen_kappa(human, predicted),
        labels=labels,
        confusion=confusion,
        disagreements=disagreements,
    )
