"""Counter-based random numbers and permutations in NumPy, vectorised over a batch.

Each draw is a pure function of `(seed, stream, counter)`: a hash (SplitMix64's
finaliser) of the three, so the input pipeline draws the randomness of a whole batch's
rows at once, and row `k` of step `s` gets the same numbers whichever process reads it.
"""

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_FEISTEL_ROUNDS = 4


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that scrambles every bit."""
    with np.errstate(over="ignore"):  # multiplication modulo 2^64 is the point
        x = (x ^ (x >> np.uint64(30))) * _MIX_1
        x = (x ^ (x >> np.uint64(27))) * _MIX_2
    return x ^ (x >> np.uint64(31))


def bits(seed: int, stream: int, counters) -> np.ndarray:
    """uint64 [counters.shape]: 64 random bits per counter."""
    with np.errstate(over="ignore"):
        key = _mix(np.asarray([seed], np.uint64) * _GOLDEN + np.uint64(stream))
        return _mix(np.asarray(counters, np.uint64) * _GOLDEN ^ key)


def uniform(seed: int, stream: int, counters) -> np.ndarray:
    """float64 [counters.shape] in [0, 1), 53 random bits each."""
    return (bits(seed, stream, counters) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def normal(seed: int, stream: int, counters) -> np.ndarray:
    """float32 [counters.shape]: standard normal draws (Box-Muller on two uniforms)."""
    counters = np.asarray(counters, np.uint64)
    u1 = uniform(seed, stream, counters * np.uint64(2))
    u2 = uniform(seed, stream, counters * np.uint64(2) + np.uint64(1))
    return (np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2 * np.pi * u2)).astype(np.float32)


def permute(indices, n: int, seed: int, stream: int) -> np.ndarray:
    """int64 [indices.shape]: the positions of `indices` (in [0, n)) in a permutation of
    [0, n) that depends on `(seed, stream)` alone (a Feistel network on the smallest
    even number of bits covering n, cycle-walked back into [0, n)). Holds nothing of size n."""
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = bits(seed, stream, np.arange(_FEISTEL_ROUNDS))

    def feistel(x):
        left, right = x >> np.uint64(half), x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << np.uint64(half)) | right

    out = feistel(np.asarray(indices, np.uint64))
    outside = out >= np.uint64(n)
    while outside.any():
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)
