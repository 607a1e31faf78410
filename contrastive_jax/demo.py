"""Computes a few of the library's losses over simulated devices and prints them beside
their single-device values.

    python -m contrastive_jax.demo [--devices 8] [--global-batch 64] [--dim 32]

Each loss is computed once on one device over the whole batch, and once inside
``jax.shard_map`` with the batch split over the devices (``axis_name`` set, through
:func:`contrastive_jax.sharding.shard_loss`), and the two values are printed side by
side: they agree to round-off. The devices are the CPU's, simulated, also on a machine
with accelerators (``JAX_PLATFORMS=cuda`` or ``tpu`` runs it on those, ``--devices`` of them).
"""

from __future__ import annotations

import os
import sys

from absl import flags

from contrastive_jax import console
from contrastive_jax.simulated_devices import with_device_count


def _flags() -> flags.FlagValues:
    """The command's flags (absl, on their own `FlagValues`)."""
    values = flags.FlagValues()
    flags.DEFINE_integer("devices", 8, "simulated devices the batch is split over", flag_values=values)
    flags.DEFINE_integer("global-batch", 64, "rows of the batch, over all devices", flag_values=values)
    flags.DEFINE_integer("dim", 32, "the embeddings' width", flag_values=values)
    return values


def main(argv=None) -> int:
    """The command line: the losses' values printed, one line each; exit status 2 for
    more devices than there are."""
    argv = sys.argv[1:] if argv is None else argv
    values = console.parse_flags(argv, _flags(), prog="python -m contrastive_jax.demo", doc=__doc__)
    devices, global_batch, dim = values.devices, values["global-batch"].value, values.dim
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), devices)
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from contrastive_jax import losses, sharding
    from contrastive_jax.errors import ConfigError

    try:
        mesh = sharding.make_mesh(devices)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    key_a, key_b, key_labels = jax.random.split(jax.random.key(0), 3)
    a = losses.l2_normalize(jax.random.normal(key_a, (global_batch, dim)))
    b = losses.l2_normalize(a + 0.5 * jax.random.normal(key_b, (global_batch, dim)))
    labels = jax.random.randint(key_labels, (global_batch,), 0, 5)
    cases = {
        "clip": (losses.clip_loss, (a, b), {"temperature": 0.07}),
        "siglip": (losses.siglip_loss, (a, b), {"temperature": 0.1, "bias": -10.0}),
        "ntxent": (losses.ntxent_loss, (a, b), {"temperature": 0.2}),
        "supcon": (losses.supcon_loss, (a, labels), {"temperature": 0.1}),
        "triplet_batch_hard": (losses.triplet_loss, (a, labels), {"margin": 0.2, "mining": "batch_hard"}),
        "dcl": (losses.dcl_loss, (a, b), {"temperature": 0.1}),
        "batch_prototype_cross_entropy": (
            losses.batch_prototype_cross_entropy_loss,
            (a, labels),
            {"num_classes": 5, "temperature": 0.5},
        ),
    }
    print(f"global batch {global_batch}, dim {dim}, {devices} devices")
    print(f"{'loss':<30}{'1 device':>14}{f'{devices} devices':>14}{'difference':>14}")
    for name, (loss_fn, arrays, hyperparameters) in cases.items():
        single = float(loss_fn(*arrays, **hyperparameters))
        sharded = float(sharding.shard_loss(loss_fn, mesh)(*arrays, **hyperparameters))
        print(f"{name:<30}{single:>14.6f}{sharded:>14.6f}{abs(single - sharded):>14.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
