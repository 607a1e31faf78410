"""A mixture of record sets: which set, and which of its examples, each stream position reads.

`config.data.records=data/a,data/b --config.data.mixture_weights=0.7,0.3` trains on both
sets, each batch drawn by weight. The choice is grain's own (`grain.MapDataset.mix`): a
stateless interleave in which stream position `k` is example `j` of set `s`, `(s, j)` a
pure function of `k` and the weights (scaled to integer proportions, the smallest 100), so
a batch is a pure function of the seed and the examples consumed before it, whatever the
processes read, and every batch holds each set's share, to a row. What this module adds to
grain: set `s`'s `j`-th example is the one at `j mod n_s` of its epoch `j // n_s`'s
permutation (`reader.BatchReader`), so each set is read in whole epochs of its own, and
those epochs are logged (`epochs`: `train/epoch/<set>`, the set named by its directory's
base name).
"""

import functools
import os
from collections.abc import Sequence

import grain
import numpy as np

# The stream's last position: grain's datasets have a length; no run gets near it.
_LAST_POSITION = 2**62


def _tagged(source: int, index: int) -> tuple[int, int]:
    return source, index


def source_name(directory: str) -> str:
    """A record set's name in metrics: its directory's base name."""
    return os.path.basename(os.path.normpath(os.path.expanduser(directory)))


class Mixture:
    """Stream positions to `(set, the set's own position)` by weight (`grain.MapDataset.mix`).

    Args:
      weights: each set's weight (> 0; normalised).
      sizes: each set's examples (its training split), for its epochs.
      names: each set's name (`source_name`).
    """

    def __init__(self, weights: Sequence[float], sizes: Sequence[int], names: Sequence[str]):
        self.weights, self.sizes, self.names = tuple(weights), tuple(sizes), tuple(names)
        sets = [grain.MapDataset.range(_LAST_POSITION).map(functools.partial(_tagged, s)) for s in range(len(weights))]
        self._selection = grain.MapDataset.mix(sets, list(self.weights))

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`(sets, own)`: int64 [k] the set stream positions `positions` (int [k]) read,
        and int64 [k] each one's position in that set's own stream."""
        located = np.array([self._selection[int(k)] for k in positions], np.int64).reshape(-1, 2)
        return located[:, 0], located[:, 1]

    def consumed(self, position: int) -> np.ndarray:
        """int64 [S]: each set's examples at the stream positions before `position`: the
        own position of its first example at or after it."""
        out = np.full(len(self.weights), -1, np.int64)
        k = position
        while (out < 0).any():
            source, own = self._selection[k]
            if out[source] < 0:
                out[source] = own
            k += 1
        return out

    def epochs(self, position: int) -> dict[str, float]:
        """`{"train/epoch/<set>": epochs of each set read}` once the stream is at `position`."""
        return {f"train/epoch/{n}": float(c / s) for n, c, s in zip(self.names, self.consumed(position), self.sizes)}
