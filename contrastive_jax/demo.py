"""Every loss of the library over simulated devices, beside its single-device value.

    python -m contrastive_jax.demo [--devices 8] [--global-batch 64] [--dim 32]

Each loss is computed once on one device over the whole batch, and once inside
``jax.shard_map`` with the batch split over the devices (``axis_name`` set), and the
two values and their largest gradient difference are printed side by side.
"""

from __future__ import annotations

import argparse
import os
import sys


def loss_examples(global_batch: int, dim: int, seed: int = 0):
    """``{name: (loss_fn, arrays, hyperparameters)}`` for every loss taking ``axis_name``.

    Embeddings ``[N, D]`` are random unit vectors; labels ``[N]`` are sorted, so they
    are unevenly spread over devices (some devices see one class only).
    """
    import jax
    import jax.numpy as jnp

    from contrastive_jax import losses

    key_a, key_b, key_labels = jax.random.split(jax.random.key(seed), 3)
    a = losses.l2_normalize(jax.random.normal(key_a, (global_batch, dim)))
    b = losses.l2_normalize(a + 0.5 * jax.random.normal(key_b, (global_batch, dim)))
    labels = jnp.sort(jax.random.randint(key_labels, (global_batch,), 0, 5))
    return {
        "infonce": (losses.infonce_loss, (a, b), {"temperature": 0.1}),
        "clip": (losses.clip_loss, (a, b), {"temperature": 0.07}),
        "siglip": (losses.siglip_loss, (a, b), {"temperature": 0.1, "bias": -10.0}),
        "ntxent": (losses.ntxent_loss, (a, b), {"temperature": 0.2}),
        "npairs": (losses.npairs_loss, (a, b), {"l2_reg": 0.002}),
        "supcon": (losses.supcon_loss, (a, labels), {"temperature": 0.1}),
        "contrastive": (losses.contrastive_loss, (a, labels), {"margin": 1.0}),
        "triplet_batch_all": (losses.triplet_loss, (a, labels), {"margin": 0.2}),
        "triplet_batch_hard": (
            losses.triplet_loss,
            (a, labels),
            {"margin": 0.2, "mining": "batch_hard"},
        ),
        "triplet_semi_hard": (
            losses.triplet_loss,
            (a, labels),
            {"margin": 0.2, "mining": "semi_hard"},
        ),
        "multi_similarity": (losses.multi_similarity_loss, (a, labels), {"mining_margin": 0.1}),
        "batch_prototype_cross_entropy": (
            losses.batch_prototype_cross_entropy_loss,
            (a, labels),
            {"num_classes": 5, "temperature": 0.5},
        ),
    }


def compare(loss_fn, arrays, hyperparameters, mesh):
    """Single-device and sharded value of a loss, and the max gradient difference.

    Returns:
      ``(single_value, sharded_value, max_abs_grad_difference)``, the gradient taken
      w.r.t. the first array.
    """
    import jax
    import jax.numpy as jnp

    from contrastive_jax.sharding import shard_loss

    sharded_fn = shard_loss(loss_fn, mesh)

    def single(x):
        return loss_fn(x, *arrays[1:], **hyperparameters)

    def sharded(x):
        return sharded_fn(x, *arrays[1:], **hyperparameters)

    single_value, single_grad = jax.jit(jax.value_and_grad(single))(arrays[0])
    sharded_value, sharded_grad = jax.jit(jax.value_and_grad(sharded))(arrays[0])
    return float(single_value), float(sharded_value), float(jnp.max(jnp.abs(single_grad - sharded_grad)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args(argv)
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + f" --xla_force_host_platform_device_count={args.devices}"
        )
    from contrastive_jax.sharding import make_mesh

    mesh = make_mesh(args.devices)
    print(f"global batch {args.global_batch}, dim {args.dim}, {args.devices} devices")
    print(f"{'loss':<30}{'1 device':>14}{f'{args.devices} devices':>14}{'max |dgrad|':>14}")
    for name, (loss_fn, arrays, hyperparameters) in loss_examples(
        args.global_batch, args.dim
    ).items():
        single, sharded, grad_difference = compare(loss_fn, arrays, hyperparameters, mesh)
        print(f"{name:<30}{single:>14.6f}{sharded:>14.6f}{grad_difference:>14.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
