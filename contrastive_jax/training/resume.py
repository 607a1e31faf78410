"""Resuming: which checkpoint a run continues from, and whether it may.

`restore_latest` takes the newest checkpoint that reads back intact (quarantining the
corrupt ones, `checkpoint.Checkpointer.quarantine`) and refuses it, naming the fields
that changed, when this run would not continue it: another seed, batch or data
(`RESUME_FIELDS`: the input stream would differ) or another model or optimizer (another
state structure). The config a checkpoint was written with is saved beside it, in its
input position (`data.batch_numbering.position`).
"""

from collections.abc import Mapping
from typing import Any

from flax import traverse_util

from contrastive_jax.data import batch_numbering
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.checkpoint import Checkpointer, CorruptCheckpointError, IncompatibleCheckpointError

# A resumed run continues the interrupted one only when these are unchanged: they fix
# the data order, the augmentations and the RNG (see input_pipeline).
RESUME_FIELDS = (
    "seed",
    "data.name",
    "data.records",
    "data.mixture_weights",
    "data.captions_per_image",
    "data.train_split",
    "data.train_class_range",
    "data.task",
    "data.seed",
    "data.examples_per_class",
    "train.global_batch_size",
    "train.batch_schedule",
)


def restore_latest(ckpt: Checkpointer, run_config: Mapping[str, Any], abstract_state: Any) -> tuple[int, Any | None]:
    """`(step, state)` of the newest intact checkpoint in `ckpt` that a run of
    `run_config` (the config as JSON, `RunPlan.run_config`) continues, or `(0, None)`
    when there is none.

    Corrupt checkpoints are reported and quarantined, and the previous one is tried.

    Raises:
      ConfigError: the checkpoint was written with other `RESUME_FIELDS`.
      IncompatibleCheckpointError: it holds another model or optimizer; the message
        names the config fields that changed.
    """
    while (step := ckpt.latest_step()) is not None:
        try:
            saved = ckpt.restore_position(step)
            _check_resume(saved, run_config, step)
            return batch_numbering.resumed_step(saved), _restore_onto(ckpt, step, abstract_state, saved, run_config)
        except CorruptCheckpointError as e:
            ckpt.quarantine(step, e)
    return 0, None


def _restore_onto(ckpt: Checkpointer, step, abstract_state, saved, run_config):
    """`Checkpointer.restore_state`, naming the changed config fields when the model changed."""
    try:
        return ckpt.restore_state(step, abstract_state)
    except IncompatibleCheckpointError as e:
        changed = {
            k: v
            for k, v in _changed_fields(saved, run_config).items()
            if k.split(".")[1] in ("model", "loss", "optim", "data")
        }
        fields = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise IncompatibleCheckpointError(
            f"Cannot resume onto another model. {e}. Config fields changed since then: "
            f"{fields or 'none in model/loss/optim/data'}. Set them back to resume, or "
            "use a new --workdir to train the new model from scratch."
        ) from None


def _changed_fields(saved: Mapping[str, Any], run_config: Mapping[str, Any]) -> dict:
    """`{"config.a.b": (value in the checkpoint, value now)}` for the fields that differ."""
    flat = lambda tree: traverse_util.flatten_dict({"config": tree}, sep=".")  # noqa: E731
    before, now = flat(saved.get("config", {})), flat(run_config)
    return {k: (before.get(k), now.get(k)) for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)}


def _check_resume(saved: Mapping[str, Any], run_config: Mapping[str, Any], step: int) -> None:
    """ConfigError when a run of `run_config` would not continue checkpoint `step`'s stream."""
    changed = _changed_fields(saved, run_config)
    for name in RESUME_FIELDS:
        if f"config.{name}" in changed:
            before, now = changed[f"config.{name}"]
            raise ConfigError(
                f"Cannot resume from checkpoint {step}: it was written with config.{name}="
                f"{before!r}, this run has {now!r}, so the data order and RNG would not "
                f"continue it. Set --config.{name}={before!r}, or use a new --workdir."
            )
