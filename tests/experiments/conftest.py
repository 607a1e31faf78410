"""What the experiments' tests share: made-up run records."""

import pytest

from experiments.lib import target_steps


def _rising_record(n, factor, seed, reached_at, top=0.9):
    """A run whose validation R@1 (both directions) rises linearly to `top` at `reached_at`."""
    curve = [[step, top * step / reached_at] for step in (reached_at / 2, reached_at)]
    curves = {f"eval/{m}": curve for m in target_steps.METRICS}
    return {"batch_size": n, "lr_factor": factor, "seed": seed, "curves": curves}


@pytest.fixture
def rising_record():
    """`rising_record(n, lr_factor, seed, reached_at, top=0.9)`: a run record of N = `n`
    whose validation R@1, both directions, rises linearly to `top` at step `reached_at`."""
    return _rising_record
