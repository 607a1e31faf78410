"""A jitted function over host arrays in chunks of one width, the last padded.

The evaluation and a trained model's `embed` run a jitted tower over n examples: in
chunks of a fixed width, the last one zero-padded to it, so the tower compiles once per
width rather than once per n, and the padded rows are cut from the result.
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np


def map_padded_chunks(fn: Callable[..., Any], arrays: Sequence[np.ndarray | None], width: int) -> Any:
    """`fn(*chunk)` over chunks of `width` rows of `arrays`, concatenated and cut to n.

    Args:
      fn: takes one `[width, ...]` chunk of each array (None where the array is None) and
        returns a pytree of `[width, ...]` arrays.
      arrays: `[n, ...]` arrays of equal n, or None (passed to `fn` as None).
      width: the rows per chunk; the last chunk is padded with zeros to it.

    Returns:
      `fn`'s pytree with each leaf `[n, ...]` (NumPy), or None when n is 0.
    """
    n = len(next(x for x in arrays if x is not None))
    outputs = []
    for start in range(0, n, width):
        chunk = [None if x is None else _padded(x[start : start + width], width) for x in arrays]
        outputs.append(jax.tree.map(np.asarray, fn(*chunk)))
    if not outputs:
        return None
    return jax.tree.map(lambda *parts: np.concatenate(parts)[:n], *outputs)


def _padded(rows: np.ndarray, width: int) -> np.ndarray:
    """`rows` `[m, ...]` with zero rows appended up to `[width, ...]`."""
    return np.concatenate([rows, np.zeros((width - len(rows), *rows.shape[1:]), rows.dtype)])
