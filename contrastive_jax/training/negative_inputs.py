"""The trainer's side of `losses.hard_negatives`: a batch's `negatives` embedded by the b
tower, and the door's rules.

A batch may hold `negatives` [N, M, ...]: for each pair, M inputs of the b side (texts'
tokens [N, M, L], or images for image-image sets) that are not its b. `embed` runs the
b tower on the N M of them (`TwoTower.embed(..., "b")`, training, with the gradient:
they are negatives of the loss like any other b) and adds `hard_negatives` [N, M, D] to
the batched outputs, split over the devices with their rows; the losses that take the
option (`losses.Loss.options`: "clip", "infonce", "siglip") put every device's hard
negatives in each row's a -> b pool. Their BatchNorm statistics are not kept, and no
patches are dropped from them. Cost over the plain step: the b tower's forward and
backward over N M more inputs, the a -> b logits N x N (1 + M).
"""

from typing import Any

import jax

from contrastive_jax import losses
from contrastive_jax.errors import ConfigError

# The dropout stream of the negatives' pass: `fold_in(step key, DROPOUT_STREAM)`, after
# the batch's (0) and the extra negatives' (1, `training.negatives_apart`).
DROPOUT_STREAM = 2


def check(name: str, loss: losses.Loss, settings: losses.LossSettings, *, has_negatives: bool, plain_step: bool):
    """With a data set holding `negatives`: the loss `name` takes them, in a `plain_step`
    (the whole batch in one pass, the same N every step), without extra negatives or
    groups.

    Raises:
      ConfigError: naming the field and a fix.
    """
    if not has_negatives:
        return
    if "hard_negatives" not in loss.options:
        takes = losses.registry.taking("hard_negatives")
        raise ConfigError(
            f"the records hold hard negatives (`negatives`) but config.loss.name={name!r} cannot take them; "
            f"use one of {takes}, or records without negatives."
        )
    if settings.extra_negatives or settings.group_size or not plain_step:
        raise ConfigError(
            "hard negatives (the records' `negatives`) are embedded with the whole batch: set "
            "config.loss.extra_negatives=0, config.loss.group_size=0, config.train.micro_batch_size=0, "
            "config.train.log_noise_scale=False and config.train.batch_schedule='constant'."
        )


def embed(apply_fn, variables: dict[str, Any], batch: dict[str, jax.Array], batched: dict[str, jax.Array], rng):
    """`batched` with `hard_negatives` [N, M, D]: the b tower's embeddings of
    `batch["negatives"]` [N, M, ...] (training, dropout from `rng`); `batched` as it is
    when the batch has none (or M = 0).

    Args:
      apply_fn: the model's `apply` (`TrainState.apply_fn`).
      variables: `{"params": ..., "batch_stats": ...}`, the parameters the gradient is
        taken of.
      batch: the global batch.
      batched: the batch's outputs split over the devices (`za`, `zb`, ...).
      rng: the step's dropout key (`DROPOUT_STREAM` is folded in).
    """
    negatives = batch.get("negatives")
    if negatives is None or negatives.shape[1] == 0:
        return batched
    rows, count = negatives.shape[:2]
    z, _ = apply_fn(
        variables,
        negatives.reshape(rows * count, *negatives.shape[2:]),
        "b",
        train=True,
        rngs={"dropout": jax.random.fold_in(rng, DROPOUT_STREAM)},
        mutable=["batch_stats"],
        method="embed",
    )
    return dict(batched, hard_negatives=z.reshape(rows, count, -1))
