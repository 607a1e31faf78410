"""The points ``bench_losses.py`` measures: its two sweeps, a sweep's grid, each point's
label and useful flops.

A point is a dict: ``worker`` (``"jax"`` or ``"torch"``), ``loss`` (one of ``LOSSES``),
``n`` and ``d`` (both sides are ``[N, D]``), for the JAX worker ``chunk`` (None: dense;
``"auto"`` or a tile size) and optionally ``matmul_dtype``, and for the MoCo queue
``queue`` (its K keys). The measurement adds its results to the same dict.
"""

from __future__ import annotations

LOSSES = ("clip", "siglip", "infonce", "sogclr", "moco_queue")
TORCH_LOSSES = ("clip", "siglip")  # the ones with an open_clip reference
QUEUE_D = 64  # the queue's points: D = 64, K = 16 N (the N = 4,096, K = 65,536)

# Which points each sweep runs. clip: every N up to max_n_by_d[D] with the methods
# below (the largest N streamed only); siglip and infonce at other_ns; torch wherever
# its dense N x N logits fit.
SWEEPS = {
    "quick": dict(
        ns=[1024, 2048],
        ds=[64],
        chunks=["auto", 256],
        big_n=2048,
        max_n_by_d={64: 2048},
        other_ns=[2048],
        bf16=True,
        ring_ns=[1024],
        queue_ns=[1024],
        peak_n=2048,
        budget_s=2.0,
    ),
    "full": dict(
        ns=[4096, 8192, 16384, 32768, 65536],
        ds=[64, 512],
        chunks=["auto", 256],
        big_n=32768,
        max_n_by_d={64: 65536, 512: 16384},
        other_ns=[8192, 16384],
        bf16=True,
        ring_ns=[8192, 32768, 65536],
        queue_ns=[4096],
        peak_n=4096,
        budget_s=20.0,
    ),
    # One accelerator (GPU/TPU) in a few minutes: the large N where the dense logits'
    # memory and the streamed kernels' speed part, at the towers' width D = 512.
    "accelerator": dict(
        ns=[16384, 65536],
        ds=[512],
        chunks=["auto", 4096, 8192],
        big_n=65536,
        max_n_by_d={512: 65536},
        other_ns=[16384],
        bf16=True,
        # The Pallas fused-tile kernel (loss.kernel="pallas", 128-edge blocks, bfloat16
        # matmuls) beside XLA's "auto bf16", for the pair losses at N < big_n.
        pallas=True,
        ring_ns=[8192],
        queue_ns=[4096],
        peak_n=8192,
        budget_s=10.0,
    ),
}


PALLAS_LOSSES = ("clip", "siglip", "infonce")  # the losses that take Streaming(kernel=...)


def useful_flops(point: dict) -> float:
    """The flops a point's forward+backward needs, whatever the method: ``6 N^2 D`` (one
    ``[N, D] x [D, N]`` product forward, its two transposes backward), or for the MoCo
    queue ``4 N K D`` (the ``[N, D] x [D, K]`` product forward and the queries' gradient;
    the queue has none)."""
    n, d = point["n"], point["d"]
    if point["loss"] == "moco_queue":
        return 4.0 * n * point["queue"] * d
    return 6.0 * n * n * d


def plan(sweep: dict, with_torch: bool) -> list[dict]:
    """The points of a sweep: clip over N and D; siglip, infonce and sogclr at
    ``other_ns``; the MoCo queue (K = 16 N, D = 64) at ``queue_ns``, dense and auto."""
    points = []
    for n in sweep["queue_ns"]:
        point = {"worker": "jax", "loss": "moco_queue", "n": n, "d": QUEUE_D, "queue": 16 * n}
        points += [point | {"chunk": None}, point | {"chunk": "auto"}]
    for d in sweep["ds"]:
        for loss in (loss for loss in LOSSES if loss != "moco_queue"):
            ns = sweep["ns"] if loss == "clip" else sweep["other_ns"]
            for n in (n for n in ns if n <= sweep["max_n_by_d"][d]):
                point = {"worker": "jax", "loss": loss, "n": n, "d": d}
                if n < sweep["big_n"]:
                    points.append(point | {"chunk": None})
                points += [
                    point | {"chunk": c} for c in sweep["chunks"] if c == "auto" or (c < n and n < sweep["big_n"])
                ]
                if sweep["bf16"]:
                    points.append(point | {"chunk": "auto", "matmul_dtype": "bfloat16"})
                if sweep.get("pallas") and loss in PALLAS_LOSSES and n < sweep["big_n"]:
                    points.append(point | {"chunk": "auto", "matmul_dtype": "bfloat16", "kernel": "pallas"})
                if with_torch and loss in TORCH_LOSSES:
                    points.append({"worker": "torch", "loss": loss, "n": n, "d": d})
    return points


def method(point: dict) -> str:
    """A point's label in the tables, plot and log: ``"dense"``, ``"chunk 256"``, ``"auto
    (1024)"`` (the tile ``"auto"`` chose), ``"torch dense"``; `` bf16`` and `` K=...`` appended."""
    if point["worker"] == "torch":
        return "torch dense"
    chunk = point["chunk"]
    name = "dense" if chunk is None else f"chunk {chunk}"
    if chunk == "auto":
        name = f"auto ({point.get('resolved_chunk') or 'dense'})"
    queue = f" K={point['queue']:,}" if "queue" in point else ""
    pallas = " pallas" if point.get("kernel") == "pallas" else ""
    return name + (" bf16" if point.get("matmul_dtype") else "") + pallas + queue
