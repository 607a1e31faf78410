"""The frozen teacher a run distils from (`config.loss.teacher`): a released checkpoint
(what `config.model.init_from` takes: open_clip `.safetensors`/`.bin`, big_vision `.npz`)
or a trained run's workdir (its newest checkpoint, restored as `trained.load` does).

`load` reads it once, before anything compiles, and checks that it takes the run's
inputs: the image size, the caption length and the tokenizer. The trainer keeps its
variables in `TrainState.teacher` (split over the mesh like the student's parameters,
saved with them, so a resumed run needs no teacher file), and `training.forward` embeds
each step's batch with it, without gradient: `teacher_za`, `teacher_zb` [N, D_t] and its
own learned `teacher_temperature`.
"""

import dataclasses
import os
from typing import Any

import jax

from contrastive_jax import run_dir
from contrastive_jax.data import settings, tokenizers
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import released, saved_model
from contrastive_jax.training import checkpoint

FIELD = "config.loss.teacher"


@dataclasses.dataclass(frozen=True, eq=False)
class Teacher:
    """A loaded teacher: its Flax `model` (`TwoTower` or a released model, whose `apply`
    returns `za`, `zb`, `temperature`), its `variables` (`{"params", "batch_stats"}`,
    NumPy) and its embeddings' width `embed_dim` (D_t)."""

    model: Any
    variables: dict[str, Any]
    embed_dim: int


def load(path: str, data: settings.DataSettings, *, text_vocab_size: int) -> Teacher:
    """The teacher in `path`, checked against the run's inputs (`data`, its tokenizer's
    `text_vocab_size`).

    Raises:
      ConfigError: one line naming `config.loss.teacher`: no such file or run, or a
        teacher that takes other images, caption lengths or token ids than the run's.
    """
    if not os.path.exists(path):
        raise ConfigError(
            f"{FIELD}={path!r} does not exist; give a released checkpoint's path or a trained run's workdir."
        )
    if os.path.isdir(path):
        return _trained(path, data)
    loaded = released.load(path)
    model_settings = loaded.settings
    wanted = {
        "config.data.image_size": (data.image_size, model_settings.image_size),
        "config.data.text_max_length": (data.text_max_length, model_settings.context_length),
        "the tokenizer's vocabulary (config.data.tokenizer)": (text_vocab_size, model_settings.vocab_size),
    }
    _check_fits(path, wanted)
    return Teacher(loaded.model, {"params": loaded.params, "batch_stats": {}}, model_settings.embed_dim)


def _trained(workdir: str, data: settings.DataSettings) -> Teacher:
    """The teacher of a trained run in `workdir` (its newest checkpoint, saved with the
    model's settings: `saved_model`), checked against `data`."""
    ckpt = checkpoint.Checkpointer(os.path.join(os.path.abspath(workdir), run_dir.CHECKPOINTS), max_to_keep=1_000_000)
    try:
        step = ckpt.latest_step()
        description = None if step is None else ckpt.restore_model(step)
        if description is None:
            raise ConfigError(
                f"{FIELD}={workdir!r} holds no checkpoint saved with its model's settings; "
                "give a run trained with this version, or a released checkpoint's path."
            )
        model, variables = saved_model.restore(ckpt, step, description)
    finally:
        ckpt.close()
    image_shape = saved_model.inputs(description)["a"][0]
    tokenizer = description["tokenizer"]
    wanted = {
        "config.data.tokenizer": (tokenizers.absolute(data.tokenizer), tokenizer["spec"]),
        "config.data.text_max_length": (data.text_max_length, tokenizer["text_max_length"]),
    }
    if data.image_size is not None and len(image_shape) == 3:
        wanted["config.data.image_size"] = (data.image_size, image_shape[0])
    _check_fits(workdir, wanted)
    host_variables = jax.device_get(variables)  # NumPy: the trainer places it on its own mesh
    return Teacher(
        model,
        {"params": host_variables["params"], "batch_stats": host_variables.get("batch_stats", {})},
        description["embed_dim"],
    )


def _check_fits(path: str, wanted: dict[str, tuple[Any, Any]]) -> None:
    """Raises a ConfigError for the first `{what: (the run's, the teacher's)}` that differ."""
    for what, (value, needed) in wanted.items():
        if value != needed:
            raise ConfigError(
                f"{FIELD}={path!r} takes {what} = {needed!r} and this run gives {value!r}: "
                "train with the teacher's inputs, or distil from a teacher built for these."
            )
