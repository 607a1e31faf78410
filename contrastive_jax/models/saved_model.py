"""The model's settings, saved beside each checkpoint (its `model` item, JSON): what
rebuilds the trained model from its checkpoint alone, without the data it trained on
(`trained.load`), as open_clip keeps a JSON config beside its weights.

    {"format": 1,
     "settings": {...},            # two_tower.ModelSettings (config.model and the logit scale)
     "text_vocab_size": V,         # the text towers' vocabulary (the tokenizer's, or the data's ids)
     "released": null | {"layout": "open_clip_layout", "settings": {...}},  # a released model's architecture
     "embed_dim": D,
     "tokenizer": {"spec": "bytes", "text_max_length": L, "files": {path: sha256}},
     "inputs": {"a": {"shape": [H, W, C], "dtype": "uint8"}, "b": {"shape": [L], "dtype": "int32"}}}

`describe` writes it from the values `run_plan.build` read; `rebuild` makes the model
again. Neither reads data nor compiles anything. A CoCa is rebuilt whole, its decoder
too (the settings' `decoder_depth` and `coca_queries`; a released CoCa's `Settings` hold
its `decoder`), so a loaded run captions (`trained.TrainedModel.caption`) and exports
its captioner (`export_captioner`) from its checkpoint alone.
"""

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from contrastive_jax.data import tokenizers
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import released, two_tower

FORMAT = 1


def file_hash(path: str) -> str:
    """The sha256 of the file at `path`, in hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def describe(
    settings: two_tower.ModelSettings,
    model: Any,
    *,
    text_vocab_size: int,
    tokenizer: str,
    text_max_length: int,
) -> dict[str, Any]:
    """The model's settings as JSON values, less the inputs (`with_inputs` adds them).

    Args:
      settings: the model's settings (`trainer.model_settings`).
      model: the model built from them (`two_tower.TwoTower`, or a released layout's).
      text_vocab_size: token ids the text towers embed.
      tokenizer: `config.data.tokenizer`; its file's sha256 is kept with its path.
      text_max_length: the token ids' length L.
    """
    tokenizer = tokenizers.absolute(tokenizer)
    path = tokenizers.model_file(tokenizer)
    return {
        "format": FORMAT,
        "settings": dataclasses.asdict(settings),
        "text_vocab_size": text_vocab_size,
        "released": released.describe(model),
        "embed_dim": settings.embed_dim,
        "tokenizer": {
            "spec": tokenizer,
            "text_max_length": text_max_length,
            "files": {} if path is None else {path: file_hash(path)},
        },
    }


def with_inputs(description: Mapping[str, Any], element_spec: Mapping[str, Any]) -> dict[str, Any]:
    """`description` with each side's input shape (without the batch) and dtype, from the
    input pipeline's `element_spec` (`a` [B, ...], optional `b` [B, ...])."""
    inputs = {
        side: {"shape": list(spec.shape[1:]), "dtype": np.dtype(spec.dtype).name}
        for side, spec in element_spec.items()
        if side in ("a", "b")
    }
    return {**description, "inputs": inputs}


def rebuild(description: Mapping[str, Any]) -> Any:
    """The model `description` (a `describe` + `with_inputs` value) describes, as
    `run_plan.build` made it: `two_tower.TwoTower`, or a released layout's model.

    Raises:
      ConfigError: a description of another format than this version writes.
    """
    if description.get("format") != FORMAT:
        raise ConfigError(
            f"the checkpoint's model settings are of format {description.get('format')!r}, "
            f"this version reads {FORMAT}; load it with the version of contrastive_jax that trained it."
        )
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in description["settings"].items()}
    try:
        settings = two_tower.ModelSettings(**values)
    except TypeError as e:  # a field added or removed since the run saved
        raise ConfigError(
            f"the checkpoint's model settings do not fit this version's ({e}); load it with the version "
            "of contrastive_jax that trained it."
        ) from None
    if description["released"] is None:
        return two_tower.create_model(settings, text_vocab_size=description["text_vocab_size"])
    return released.rebuild(description["released"]).clone(options=two_tower.tower_options(settings))


def inputs(description: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each side's input shape (without the batch) and dtype: `{"a": (shape, dtype), ...}`."""
    return {side: (tuple(v["shape"]), np.dtype(v["dtype"])) for side, v in description["inputs"].items()}


def restore(checkpointer, step: int, description: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`(model, variables)` of checkpoint `step` saved with the model settings
    `description`: the model rebuilt (`rebuild`), its `{"params", "batch_stats"}` read
    from `checkpointer` (a `training.checkpoint.Checkpointer`; verified, on the default
    device)."""
    model = rebuild(description)
    dummy = {side: np.zeros((1, *shape), dtype) for side, (shape, dtype) in inputs(description).items()}
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy["a"], dummy.get("b"), train=False))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shapes = {k: v for k, v in shapes.items() if k in ("params", "batch_stats") and v}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes)
    return model, checkpointer.restore_variables(step, abstract)
