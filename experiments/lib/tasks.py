"""The tasks the critical-batch studies train and judge (their `--task`): the data, its
splits and the towers, as config overrides on a `configs/` module.

* `cmudict`: `configs/cmudict_clip.py` (two 1-D CNN towers, words against their
  pronunciations) on cmudict's `fit` split, validated on `validation`;
* `shapes`: the generated image-text set (`data.builtin.shapes`) at `SHAPES_IMAGE_SIZE` px,
  written on first use (`generated_records`), with small CNN towers (`SHAPES_CNN_TOWERS`,
  zero_shot_shapes's, narrower), validated on 1,000 pictures;
* `shapes_vit`: the same set with a Transformer for the pictures (`vit_micro`: 2 blocks of
  width 64 on 8 px patches) and the byte-level 1-D CNN for the captions.

A study keeps its own presets per task (the N, the targets, the epochs, the number of
pictures: `args.pictures`, 0 for a built-in set) and builds its base config with
`base_config`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from experiments.lib import target_steps

SHAPES_IMAGE_SIZE = 32
# The CPU-sized towers of the generated set: the small CNN for the pictures, the byte-level
# 1-D CNN for the captions (zero_shot_shapes trains these; the `shapes` task narrows them).
SHAPES_CNN_TOWERS = {
    "model.encoder_a": "cnn",
    "model.encoder_b": "text_cnn",
    "model.cnn_features": (32, 64),
    "model.encoder_dim": 128,
    "model.embed_dim": 64,
    "eval.batch_size": 500,
}
# The `shapes` task's fields: its splits, the towers narrowed, the pictures' size, one
# validation batch (`shapes_vit` swaps the picture tower).
SHAPES_OVERRIDES = {
    "data.train_split": "train",
    "eval.split": "validation[:1000]",
    **SHAPES_CNN_TOWERS,
    "model.cnn_features": (16, 32),
    "data.image_size": SHAPES_IMAGE_SIZE,
    "eval.batch_size": 1000,
}
SHAPES_QUICK_OVERRIDES = {"data.train_split": "train[:1024]", "eval.split": "validation[:64]", "eval.batch_size": 64}


@dataclasses.dataclass(frozen=True)
class Task:
    """What a study trains and judges.

    Attributes:
      title: the task in a summary's heading.
      config: the `configs/` module trained.
      overrides: the fields set on it (the splits: never the test split; the towers).
      quick_overrides: the fields --quick sets on top (slices of the data).
      curve_floor: the lowest validation R@1 a curves' panel shows.
    """

    title: str
    config: str
    overrides: Mapping[str, Any]
    quick_overrides: Mapping[str, Any]
    curve_floor: float


TASKS = {
    "cmudict": Task(
        "cmudict (fit -> validation)", "cmudict_clip", target_steps.SPLITS, target_steps.QUICK_OVERRIDES, 0.7
    ),
    "shapes": Task(
        "the generated image-text set (train -> validation[:1000])",
        "clip_shapes",
        SHAPES_OVERRIDES,
        SHAPES_QUICK_OVERRIDES,
        0.0,
    ),
    "shapes_vit": Task(
        "the generated image-text set with a ViT (train -> validation[:1000])",
        "clip_shapes",
        {**SHAPES_OVERRIDES, "model.encoder_a": "vit_micro", "model.patch_size": 8},
        SHAPES_QUICK_OVERRIDES,
        0.0,
    ),
}


def generated_records(data_dir: str | None, pictures: int) -> dict[str, str]:
    """`{"data.records": the folder}` of the generated set of `pictures` pictures at
    `SHAPES_IMAGE_SIZE` px, written under `data_dir` (None: the built-in sets' folder) on
    first use; the folder names the generator's version, as the built-in sets' do. `{}`
    when `pictures` is 0 (a task on a built-in set)."""
    if not pictures:
        return {}
    from contrastive_jax import write_records
    from contrastive_jax.data import records, settings

    root = os.path.expanduser(data_dir or settings.DEFAULT_DATA_DIR)
    folder = os.path.join(root, f"shapes-v{settings.BUILTIN_VERSION}-{SHAPES_IMAGE_SIZE}px-{pictures}")
    if not os.path.exists(os.path.join(folder, records.METADATA_FILE)):
        write_records.write("builtin:shapes", folder, num_examples=pictures, image_size=SHAPES_IMAGE_SIZE)
    return {"data.records": folder}


def base_config(name: str, args):
    """The config every run of a study on task `name` overrides: the task's module with
    its overrides (`args.quick`: its slices on top), `args.data_dir`, and the generated set
    of `args.pictures` pictures (`generated_records`; a study without the option: none)."""
    from contrastive_jax.config_lib import load_config, override

    task = TASKS[name]
    records = generated_records(args.data_dir, getattr(args, "pictures", 0))
    fields = {**task.overrides, **(task.quick_overrides if args.quick else {}), "data.data_dir": args.data_dir}
    return override(load_config(task.config), {**fields, **records})
