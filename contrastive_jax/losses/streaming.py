"""How a softmax / sigmoid loss computes its logits: dense, in tiles, or around a ring.

The options every streamed loss takes (``chunk_size``, ``collective``, ``matmul_dtype``:
:class:`Streaming`), and how ``chunk_size`` resolves to a tile edge
(:func:`auto_chunk_size`; checked by `errors.check_divides`). The result never depends on them (to
round-off); :mod:`contrastive_jax.losses.logit_stats` carries them out.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

COLLECTIVES = ("all_gather", "ring")
KERNELS = ("xla", "pallas", "pallas_interpret")
MATMUL_DTYPES = (None, "bfloat16", "float32")
# Tile edge chunk_size="auto" aims for, by platform: on CPU a float32 [512, 512] tile
# (1 MiB) stays in a core's L2 cache with room for the operands (measured best at
# D=64 on a 2-core EPYC); accelerators want larger matmuls to fill their units: on an
# H100, N = 16,384, D = 512, tiles of 8,192 ran CLIP's forward+backward in 6.5 ms
# against 11.0 ms with 2,048 (SigLIP 5.7 vs 8.1, SogCLR 6.5 vs 11.3; dense 5.2 ms),
# at 624 MiB of compiled temp instead of dense's 2 GiB
# (experiments/results/bench_losses/accelerator). TPU: not measured here.
AUTO_TILE = {"cpu": 512, "gpu": 8192, "tpu": 2048}
# chunk_size="auto"'s block edge with a Pallas kernel: a float32 [128, 128] block of
# logits and bfloat16 [128, D] operands fit an H100 SM's shared memory up to D = 256.
PALLAS_BLOCK = 128


class Streaming(NamedTuple):
    """How a loss computes its logits; the result does not depend on it (to round-off).

    Attributes:
      chunk_size: None for the dense ``[B, N]`` logits; an int ``c`` streams tiles of
        up to ``c`` rows by ``c`` columns, O(N D + c^2) memory (one-pass InfoNCE and
        NT-Xent: stripes of ``c`` whole rows, O(N D + c N)), the same result (``c``
        must divide the candidate columns N, or each device's shard B with the ring);
        ``"auto"`` picks ``c`` from N, D and the device
        (:func:`~contrastive_jax.losses.streaming.auto_chunk_size`).
      collective: ``"all_gather"`` (default), or ``"ring"`` with an ``axis_name``: pass
        the candidates' shards around the devices instead of gathering them.
      matmul_dtype: None computes similarities in the embeddings' dtype;
        ``"bfloat16"`` casts the matmul operands to bfloat16 and accumulates in
        float32 (logits, logsumexps and gradient sums stay float32).
      kernel: how a streamed (``chunk_size`` not None) two-pass sweep runs: ``"xla"``
        (default), the double scan over tiles; ``"pallas"``, fused Pallas kernels
        (:mod:`~contrastive_jax.losses.pallas_tiles`) on GPU and TPU, XLA's path where
        Pallas cannot compile (CPU); ``"pallas_interpret"``, the Pallas kernels in
        interpret mode on any backend (tests). With a Pallas kernel ``chunk_size`` is
        its block edge and need not divide N (``"auto"``: 128), and the one-pass losses
        take the two-pass form.
    """

    chunk_size: int | str | None = None
    collective: str = "all_gather"
    matmul_dtype: str | None = None
    kernel: str = "xla"

    def check(self, axis_name) -> None:
        """Rejects unknown options, or ``"ring"`` without a device axis."""
        if self.collective not in COLLECTIVES:
            raise ValueError(f"collective must be one of {COLLECTIVES}, got {self.collective!r}.")
        if self.collective == "ring" and axis_name is None:
            raise ValueError(
                "collective='ring' passes shards between devices and needs axis_name (call "
                "the loss inside jax.shard_map, e.g. contrastive_jax.sharding.shard_loss); "
                "on a single device use collective='all_gather' (the default)."
            )
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype must be one of {MATMUL_DTYPES}, got {self.matmul_dtype!r}.")
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}.")
        chunk = self.chunk_size
        if (
            chunk is not None
            and chunk != "auto"
            and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1)
        ):
            raise ValueError(f"chunk_size must be a positive int, 'auto' or None, got {chunk!r}.")


def divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of ``n`` that is at most ``limit`` (>= 1)."""
    return max(d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0)


def auto_chunk_size(num_columns: int, dim: int, platform: str | None = None) -> int | None:
    """The tile edge ``chunk_size="auto"`` uses for ``num_columns`` candidates of width ``dim``.

    The largest divisor of ``num_columns`` at most ``AUTO_TILE[platform]`` (CPU 512,
    doubled for ``dim > 256`` where the tile's matmul dominates and larger matmuls run
    faster; GPU 8192; TPU 2048; ``platform`` defaults to ``jax.devices()[0].platform``).
    None (dense) when all columns fit in one tile: one tile is the dense computation.
    """
    platform = platform or jax.devices()[0].platform
    target = AUTO_TILE.get(platform, AUTO_TILE["gpu"])
    if platform == "cpu" and dim > 256:
        target *= 2
    if num_columns <= target:
        return None
    return divisor_at_most(num_columns, target)


def resolve_kernel(kernel: str, platform: str | None = None) -> str:
    """The kernel that runs for ``Streaming.kernel``: ``"pallas"`` compiles on GPU
    (Triton) and TPU (Mosaic) and is ``"xla"`` elsewhere (the CPU cannot lower it);
    ``"pallas_interpret"`` runs the kernels in Pallas's interpret mode on any backend."""
    platform = platform or jax.devices()[0].platform
    return "xla" if kernel == "pallas" and platform not in ("gpu", "tpu") else kernel
