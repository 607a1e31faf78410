"""The learning-rate grid of the constant-rate studies (`critical_batch_constant_lr`,
`sigmoid_vs_softmax`): rate step k is AdamW's peak rate `BASE_LEARNING_RATE * 2 ** (k / 2)`,
a sqrt(2) grid tuned outward from the square-root rule's step until the best is inside."""

from __future__ import annotations

import math
from collections.abc import Iterable

BASE_LEARNING_RATE = 1e-3  # rate step k: BASE_LEARNING_RATE * 2 ** (k / 2)


def learning_rate(rate_step: int) -> float:
    """AdamW's peak rate at rate step `rate_step` of the sqrt(2) grid."""
    return BASE_LEARNING_RATE * 2 ** (rate_step / 2)


def rate_step_of(lr_factor: float) -> int:
    """The rate step k of a record's `lr_factor` (2 ** (k / 2))."""
    return round(2 * math.log2(lr_factor))


def first_rate_step(n: int) -> int:
    """The grid's centre at N = `n`: the square-root rule from 2e-3 at N = 256 (the
    cosine study's best there), ``log2(n / 256) + 2``."""
    return round(math.log2(n / 256)) + 2


def step_beyond_edge(steps: Iterable[int], best: int) -> int | None:
    """How a tuning grid grows: the neighbour beyond `best` when it is the smallest or the
    largest of the grid steps run (`steps`), else None (the best is inside)."""
    steps = sorted(steps)
    if best == steps[0]:
        return best - 1
    return best + 1 if best == steps[-1] else None
