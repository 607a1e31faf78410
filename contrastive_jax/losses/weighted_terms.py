"""Terms added to a trainable loss by weight: distillation from a frozen teacher and CoCa's
captioning loss.

A run's loss is ``contrastive_weight x`` its `config.loss.name` loss plus each term whose
weight is not 0 (`LossSettings.distill_weight`, `caption_weight`). `with_terms` makes the
sum one `Loss`, so every gradient path the trainer has (the whole batch, gradient
caching, the noise scale's per-device passes, a schedule's stages, sharded parameters)
takes it as it takes any loss; each term reads the model's outputs on one device, inside
the same `jax.shard_map` over the global batch:

- **distill**: the teacher's embeddings of the batch, `teacher_za`, `teacher_zb` [B, D_t],
  and its `teacher_temperature` (`training.forward` embeds them without gradient).
  `distill_form` "logits": `distillation.distill_clip_loss` of the student's `za`, `zb`,
  streamed as the loss is (`chunk_size`, `collective`, `matmul_dtype`); "mse" or
  "cosine": `distillation.embedding_distill_loss` of `za_to_teacher`, `zb_to_teacher`
  (the student's embeddings mapped to the teacher's width, `TwoTower.teacher_dim`; `za`,
  `zb` themselves where the widths are equal) against the teacher's, the mean of the two
  sides.
- **caption**: `caption_nll` [B] (a row's summed next-token cross-entropy) and
  `caption_tokens` [B] (its predicted tokens), a captioning model's outputs: their global
  sums' ratio, the mean over every token of the global batch (open_clip's `CoCaLoss`).

Each term logs its value as `<name>_loss`.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import _common
from contrastive_jax.losses.distillation import EMBEDDING_FORMS, distill_clip_loss, embedding_distill_loss
from contrastive_jax.losses.loss_types import Loss, LossSettings, Outputs
from contrastive_jax.losses.streaming import Streaming
from contrastive_jax.sharding import BATCH_AXES

#: `LossSettings.distill_form`'s values.
DISTILL_FORMS = ("logits", *EMBEDDING_FORMS)


@dataclasses.dataclass(frozen=True)
class Term:
    """A term added to the loss: `fn(one device's outputs, settings) -> global scalar`,
    the outputs it reads, and the `LossSettings` field holding its weight."""

    fn: Callable[[Outputs, LossSettings], jax.Array]
    inputs: frozenset[str]
    weight_field: str


def _distill(o: Outputs, c: LossSettings) -> jax.Array:
    """Distillation of the student's pairs from the teacher's (`distill_form`)."""
    if c.distill_form == "logits":
        streaming = Streaming(c.chunk_size, c.collective, c.matmul_dtype, c.kernel)
        return distill_clip_loss(
            o["za"],
            o["zb"],
            o["teacher_za"],
            o["teacher_zb"],
            temperature=o["temperature"],
            teacher_temperature=o["teacher_temperature"],
            streaming=streaming,
            axis_name=BATCH_AXES,
        )
    # The student's embeddings at the teacher's width: mapped where the widths differ, as they are where not.
    sides = [
        embedding_distill_loss(
            o.get(f"{side}_to_teacher", o[side]), o[f"teacher_{side}"], form=c.distill_form, axis_name=BATCH_AXES
        )
        for side in ("za", "zb")
    ]
    return (sides[0] + sides[1]) / 2


def _caption(o: Outputs, c: LossSettings) -> jax.Array:
    """The next-token cross-entropy's mean over the global batch's predicted tokens."""
    del c
    tokens = o["caption_tokens"].astype(jnp.float32)
    return _common.global_mean(o["caption_nll"] / jnp.maximum(tokens, 1.0), BATCH_AXES, weights=tokens)


#: The terms besides the contrastive loss, by name, each a `Term` (its function, the
#: model outputs it reads, the `LossSettings` field that weighs it).
TERMS = {
    "distill": Term(_distill, frozenset({"za", "zb", "teacher_za", "teacher_zb"}), "distill_weight"),
    "caption": Term(_caption, frozenset({"caption_nll", "caption_tokens"}), "caption_weight"),
}


def active_terms(settings: LossSettings) -> dict[str, Term]:
    """The `TERMS` whose weight in `settings` is not 0."""
    return {name: term for name, term in TERMS.items() if getattr(settings, term.weight_field)}


def with_terms(loss: Loss, settings: LossSettings) -> Loss:
    """`loss` with the active terms added by weight (`loss` itself when it has none and
    `contrastive_weight` is 1): its `fn` returns `contrastive_weight x loss + sum_k
    weight_k x term_k`, the loss's metrics and each term's `<name>_loss` (and, for a loss
    with state, its new state); its `inputs` add what the terms read."""
    terms = active_terms(settings)
    if not terms and settings.contrastive_weight == 1.0:
        return loss

    def fn(o: Outputs, c: LossSettings):
        value, metrics, *state = loss.fn(o, c)
        total = c.contrastive_weight * value
        metrics = dict(metrics)
        for name, term in terms.items():
            term_value = term.fn(o, c)
            metrics[f"{name}_loss"] = term_value
            total = total + getattr(c, term.weight_field) * term_value
        return (total, metrics, *state)

    inputs = frozenset().union(loss.inputs, *(term.inputs for term in terms.values()))
    return dataclasses.replace(loss, fn=fn, inputs=inputs)


def check_weights(settings: LossSettings, *, has_teacher: bool) -> None:
    """That the weights are >= 0, `distill_form` is a form, and distillation has a
    teacher (`config.loss.teacher`) exactly when its weight is not 0.

    Raises:
      ConfigError: one line naming the field and the fix.
    """
    for field in ("contrastive_weight", *(term.weight_field for term in TERMS.values())):
        if not getattr(settings, field) >= 0:
            raise ConfigError(f"config.loss.{field}={getattr(settings, field)} must be >= 0 (0: the term is off).")
    if settings.distill_form not in DISTILL_FORMS:
        raise ConfigError(f"config.loss.distill_form={settings.distill_form!r}; use one of {list(DISTILL_FORMS)}.")
    if bool(settings.distill_weight) != has_teacher:
        fix = "set config.loss.teacher to its path" if settings.distill_weight else "set config.loss.distill_weight > 0"
        raise ConfigError(
            f"config.loss.distill_weight={settings.distill_weight} and config.loss.teacher "
            f"{'set' if has_teacher else 'empty'}: distillation needs both; {fix}, or neither."
        )
