"""One point of ``bench_losses.py``, measured in the fresh process that runs it.

``bench_losses.spawn`` starts ``python -m experiments.bench.bench_losses --worker SPEC`` per point, so that the
process's peak RSS is the point's own; that process calls ``run_worker(spec)`` and prints
its result as one JSON line. The workers: ``peak`` (a float32 ``jnp.dot``), ``jax`` (a
loss's value and gradients: XLA's compiled memory, then the median time), ``torch`` (the
open_clip-style reference) and ``ring`` (clip_loss's per-device compiled memory on
``RING_DEVICES`` simulated devices, all-gather vs ring). Each imports JAX (or PyTorch)
itself, so importing this module does not.
"""

from __future__ import annotations

import resource
import statistics
import time

TEMPERATURE = 0.07
SIGLIP_BIAS = -10.0
RING_DEVICES = 8  # the ring worker's simulated CPU devices


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def time_calls(fn, *, max_repeats: int, budget_s: float) -> tuple[float, int, bool]:
    """Median seconds of ``fn()`` after one warm-up call (skipped when a call is slow).

    A call longer than ``budget_s`` is its own warm-up (compilation is already done) and
    is timed once, so the largest points cost one run.
    """
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    if first > budget_s:
        return first, 1, False
    repeats = max(1, min(max_repeats, int(budget_s / max(first, 1e-6))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), repeats, True


def _worker_peak(spec: dict) -> dict:
    """An n^3 matmul's rate in ``spec["dtype"]`` (float32 unless it names another)."""
    import jax
    import jax.numpy as jnp

    n = spec["n"]
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(spec.get("dtype", "float32")))
    matmul = jax.jit(lambda x: x @ x).lower(x).compile()
    seconds, repeats, _ = time_calls(lambda: matmul(x).block_until_ready(), max_repeats=5, budget_s=10.0)
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    return {
        "gflops": 2.0 * n**3 / seconds / 1e9,
        "seconds": seconds,
        "repeats": repeats,
        "platform": device.platform,
        "device_kind": device.device_kind,
        "device_memory_bytes": (stats or {}).get("bytes_limit"),
    }


def correlated_pairs(n: int, d: int):
    """The same L2-normalised ``[N, D]`` pair for every framework (numpy, float32)."""
    import numpy as np

    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((n, d), dtype=np.float32) for _ in range(2))
    b = a + 1.5 * b  # correlated pairs, as in training
    return tuple(x / np.linalg.norm(x, axis=1, keepdims=True) for x in (a, b))


def _jax_loss(spec: dict):
    """``loss(a, b) -> (value, state)``: the loss of a spec's point with its state's
    update (SogCLR's table of N examples, all visited; the queue of ``spec["queue"]``
    random keys, enqueued), so that the timing includes it."""
    import jax
    import jax.numpy as jnp

    from contrastive_jax import losses

    name, n, d = spec["loss"], spec["n"], spec["d"]
    options = dict(temperature=TEMPERATURE, chunk_size=spec["chunk"], matmul_dtype=spec.get("matmul_dtype"))
    if name == "sogclr":
        table = jnp.zeros((n, 2), jnp.float32)  # visited before: the moving average runs
        return lambda a, b: losses.sogclr_loss(a, b, jnp.arange(n), table, **options)
    if name == "moco_queue":
        queue = losses.l2_normalize(jax.random.normal(jax.random.key(2), (spec["queue"], d)))

        def moco(a, b):
            value = losses.moco_queue_loss(a, b, queue, **options)
            return value, losses.enqueue(queue, jnp.int32(0), b)

        return moco
    fn = {"clip": losses.clip_loss, "siglip": losses.siglip_loss, "infonce": losses.infonce_loss}[name]
    extra = {"bias": SIGLIP_BIAS} if name == "siglip" else {}
    streaming = losses.Streaming(spec["chunk"], matmul_dtype=spec.get("matmul_dtype"), kernel=spec.get("kernel", "xla"))
    return lambda a, b: (fn(a, b, temperature=TEMPERATURE, streaming=streaming, **extra), None)


def _worker_jax(spec: dict) -> dict:
    import jax

    from contrastive_jax.losses import logit_stats, streaming

    n, d, chunk = spec["n"], spec["d"], spec["chunk"]
    loss = _jax_loss(spec)
    shape = jax.ShapeDtypeStruct((n, d), jax.numpy.float32)
    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)).lower(shape, shape).compile()
    memory = compiled.memory_analysis()
    total = memory.temp_size_in_bytes + memory.argument_size_in_bytes + memory.output_size_in_bytes
    result = {"temp_bytes": memory.temp_size_in_bytes, "compiled_total_bytes": total}
    if chunk == "auto":
        pallas = streaming.resolve_kernel(spec.get("kernel", "xla")) != "xla"
        result["resolved_chunk"] = (
            streaming.PALLAS_BLOCK if pallas else logit_stats.auto_chunk_size(spec.get("queue", n), d)
        )
    if total > spec["max_memory_bytes"]:
        return result | {
            "skipped": f"needs {total / 2**30:.1f} GiB compiled > limit {spec['max_memory_bytes'] / 2**30:.1f} GiB"
        }
    a, b = (jax.device_put(x) for x in correlated_pairs(n, d))
    seconds, repeats, warmed = time_calls(
        lambda: jax.block_until_ready(compiled(a, b)),
        max_repeats=spec["max_repeats"],
        budget_s=spec["budget_s"],
    )
    return result | {"seconds": seconds, "repeats": repeats, "warm_up": warmed, "value": float(compiled(a, b)[0][0])}


def _worker_torch(spec: dict) -> dict:
    """open_clip's ``ClipLoss`` (local loss, one device) or ``SigLipLoss``, dense."""
    import torch
    import torch.nn.functional as F

    n, d = spec["n"], spec["d"]
    if 5 * n * n * 4 > spec["max_memory_bytes"]:
        return {"skipped": "estimated N x N logits and gradients exceed the memory limit"}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = (torch.from_numpy(x).to(device).requires_grad_(True) for x in correlated_pairs(n, d))
    labels = torch.arange(n, device=device)
    scale = 1.0 / TEMPERATURE

    def clip():  # open_clip ClipLoss.forward with world_size 1
        logits_per_image = scale * a @ b.T
        logits_per_text = scale * b @ a.T
        return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2

    def siglip():  # open_clip SigLipLoss._loss with world_size 1
        logits = scale * a @ b.T + SIGLIP_BIAS
        signs = 2 * torch.eye(n, device=device) - 1
        return -F.logsigmoid(signs * logits).sum() / n

    loss_fn = {"clip": clip, "siglip": siglip}[spec["loss"]]

    def step():
        a.grad = b.grad = None
        value = loss_fn()
        value.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return value

    seconds, repeats, warmed = time_calls(step, max_repeats=spec["max_repeats"], budget_s=spec["budget_s"])
    return {
        "seconds": seconds,
        "repeats": repeats,
        "warm_up": warmed,
        "value": float(loss_fn().detach()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def _worker_ring(spec: dict) -> dict:
    """Per-device compiled memory of clip_loss's gradient on 8 simulated devices."""
    import jax
    import numpy as np

    from contrastive_jax import losses, sharding

    n, d = spec["n"], spec["d"]
    mesh = sharding.make_mesh(RING_DEVICES)
    shape = jax.ShapeDtypeStruct((n, d), jax.numpy.float32, sharding=sharding.data_sharding(mesh))
    out = {}
    values = {}
    for name, kwargs in spec["variants"].items():
        fn = jax.jit(
            jax.value_and_grad(
                lambda a, b, kw=kwargs: sharding.shard_loss(losses.clip_loss, mesh)(
                    a, b, temperature=TEMPERATURE, **kw
                ),
                argnums=(0, 1),
            )
        )
        compiled = fn.lower(shape, shape).compile()
        memory = compiled.memory_analysis()
        out[name] = {"temp_bytes": memory.temp_size_in_bytes, "argument_bytes": memory.argument_size_in_bytes}
        if spec["execute"]:
            keys = jax.random.split(jax.random.key(1))
            a, b = (
                jax.device_put(losses._common.l2_normalize(jax.random.normal(k, (n, d))), sharding.data_sharding(mesh))
                for k in keys
            )
            values[name] = jax.tree.map(np.asarray, compiled(a, b))
    if values:
        reference = values["all_gather"]
        out["max_relative_difference"] = max(
            float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
            for v in values.values()
            for x, y in zip(jax.tree.leaves(v), jax.tree.leaves(reference))
        )
    return out


WORKERS = {"peak": _worker_peak, "jax": _worker_jax, "torch": _worker_torch, "ring": _worker_ring}


def run_worker(spec: dict) -> dict:
    """Measures the point ``spec`` in this process (``spec["worker"]``: ``"peak"``, ``"jax"``,
    ``"torch"`` or ``"ring"``); the result also holds the process's peak RSS in bytes."""
    result = WORKERS[spec["worker"]](spec)
    return result | {"peak_rss_bytes": _peak_rss_bytes()}
