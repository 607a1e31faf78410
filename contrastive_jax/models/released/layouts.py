"""The two layouts (`open_clip_layout`, `big_vision_layout`) by a checkpoint's path, by
name and by model: a model's layout as JSON values and back (`describe`, `rebuild`, what
a run saves beside its checkpoints), and a model written back to its layout (`save`)."""

import dataclasses
from typing import Any

from contrastive_jax.errors import ConfigError


def layout_for_path(path: str):
    """The layout module of the checkpoint `path`; a ConfigError for a file of neither."""
    from contrastive_jax.models.released import big_vision_layout, open_clip_layout, siglip2_layout

    if path.endswith(".npz"):
        return big_vision_layout
    if siglip2_layout.is_checkpoint(path):
        return siglip2_layout
    if open_clip_layout.is_checkpoint(path):
        return open_clip_layout
    raise ConfigError(
        f"config.model.init_from={path!r}: not a released checkpoint; use big_vision's .npz (SigLIP), "
        "open_clip's .safetensors / .bin (CLIP), or transformers' SigLIP 2 NaFlex model.safetensors."
    )


def save(path: str, model, params) -> None:
    """Writes a model of a released layout (`load`'s `model`, or a run's fine-tuned from
    it: `trained.load(workdir)`'s `model` and `variables["params"]`) back to that layout:
    open_clip's `state_dict` as `.safetensors` (open_clip loads it), big_vision's `.npz`.

    Raises:
      ConfigError: `model` is not a released layout's, or `path`'s suffix is not its.
    """
    layout = layout_of(model)
    if layout is None:
        raise ConfigError(f"{type(model).__name__} is not a released layout's model; nothing to write to {path}.")
    try:
        layout.write(path, params, model.settings)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _layouts() -> dict[str, Any]:
    """The layout modules by their names."""
    from contrastive_jax.models.released import big_vision_layout, open_clip_layout, siglip2_layout

    return {
        "open_clip_layout": open_clip_layout,
        "big_vision_layout": big_vision_layout,
        "siglip2_layout": siglip2_layout,
    }


def layout_of(model):
    """The layout module whose `Model` (or open_clip's `CocaModel`) `model` is, or None."""
    from contrastive_jax.models.released import open_clip_layout

    if type(model) is open_clip_layout.CocaModel:
        return open_clip_layout
    return next((layout for layout in _layouts().values() if type(model) is layout.Model), None)


def describe(model) -> dict[str, Any] | None:
    """A released layout's model as JSON values, `{"layout": name, "settings": {...}}`
    (its architecture, `Settings`); None for a model of no released layout."""
    layout = layout_of(model)
    if layout is None:
        return None
    return {"layout": layout.__name__.rsplit(".", 1)[-1], "settings": dataclasses.asdict(model.settings)}


def rebuild(description: dict[str, Any]):
    """The released layout's `Model` that `describe` described (default tower options);
    settings with a `decoder` are an open_clip CoCa's (`open_clip_layout.CocaModel`)."""
    from contrastive_jax.models.coca import CocaSettings
    from contrastive_jax.models.transformer import TowerSettings

    layout = _layouts()[description["layout"]]
    values = dict(description["settings"])
    if "decoder" in values:
        return layout.model_for(CocaSettings.from_json(values))
    towers = {name: TowerSettings(**values[name]) for name in ("image", "text")}
    return layout.Model(layout.Settings(**{**values, **towers}))
