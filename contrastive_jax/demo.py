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

from contrastive_jax.simulated_devices import with_device_count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args(argv)
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), args.devices)
    from contrastive_jax.losses.examples import loss_examples
    from contrastive_jax.sharding import compare_with_single_device, make_mesh

    mesh = make_mesh(args.devices)
    print(f"global batch {args.global_batch}, dim {args.dim}, {args.devices} devices")
    print(f"{'loss':<30}{'1 device':>14}{f'{args.devices} devices':>14}{'max |dgrad|':>14}")
    for name, (loss_fn, arrays, hyperparameters) in loss_examples(args.global_batch, args.dim).items():
        single, sharded, grad_difference = compare_with_single_device(loss_fn, arrays, hyperparameters, mesh)
        print(f"{name:<30}{single:>14.6f}{sharded:>14.6f}{grad_difference:>14.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
