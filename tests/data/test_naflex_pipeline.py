"""NaFlex images in the input pipeline (`config.data.max_num_patches`): each image resized at
its aspect ratio within the budget by transformers' rule, cut into patches and packed, equal
to transformers' `Siglip2ImageProcessorPil`'s patches; settings it cannot serve named."""

import io

import numpy as np
import pytest
from PIL import Image

from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline, naflex_images, records, settings
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.run_plan import data_settings

PATCH, BUDGET = 8, 20
# (height, width): tall, wide, square, a strip, one smaller than a patch
SIZES = ((70, 30), (33, 90), (48, 48), (12, 200), (5, 7), (64, 40))


def write_set(directory, sizes=SIZES):
    """A record set of random-pixel PNGs of `sizes`, one caption each."""
    rng = np.random.default_rng(0)
    examples = []
    for i, size in enumerate(sizes):
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(buffer, "PNG")
        examples.append({"image": buffer.getvalue(), "captions": [f"picture {i}"]})
    directory.mkdir(parents=True)
    shard = records.shard_name("train", 0, 1)
    records.write_shard(str(directory / shard), examples)
    split = records.Split((shard,), (len(examples),))
    records.write_metadata(
        records.Metadata(directory=str(directory), splits={"train": split}, fields=("image", "captions"))
    )
    return str(directory)


@pytest.fixture
def naflex_config(load_config, tmp_path):
    fields = {
        "data.records": write_set(tmp_path / "set"),
        "data.max_num_patches": BUDGET,
        "model.patch_size": PATCH,
        "data.augment.noise_std": 0.0,
        "data.text_max_length": 16,
        "train.global_batch_size": 4,
    }
    return override(load_config("default"), fields)


@pytest.mark.parametrize("budget", [1, 20, 256, 576, 1024])
def test_the_grid_keeps_the_aspect_within_the_budget_as_transformers(budget):
    from transformers.models.siglip2.image_processing_pil_siglip2 import get_image_size_for_max_num_patches

    rng = np.random.default_rng(budget)
    for height, width in rng.integers(1, 4000, (40, 2)):
        size = naflex_images.size_for_budget(int(height), int(width), 16, budget)
        assert size == get_image_size_for_max_num_patches(int(height), int(width), 16, budget)
        rows, cols = size[0] // 16, size[1] // 16
        assert 1 <= rows * cols <= budget
        # one scale for both sides, each rounded up to whole patches (a side of one patch is the floor)
        lows = [(n - 1) * 16 / side if n > 1 else 0.0 for n, side in ((rows, height), (cols, width))]
        assert max(lows) < min(rows * 16 / height, cols * 16 / width)


def test_eval_images_are_transformers_processors_patches(naflex_config):
    transformers = pytest.importorskip("transformers")
    data = data_settings(naflex_config)
    settings.check_data_config(data)
    packed = input_pipeline.eval_arrays(data, "train")["a"]
    assert packed.shape == (len(SIZES), 1 + BUDGET, PATCH * PATCH * 3) and packed.dtype == np.uint8
    metadata = settings.open_metadata(data)
    pictures = [
        Image.open(io.BytesIO(records.decode(records.RecordSet(metadata, "train").read(i))["image"]))
        for i in range(len(SIZES))
    ]
    processor = transformers.Siglip2ImageProcessorPil(patch_size=PATCH, max_num_patches=BUDGET)
    expected = processor(images=[p.convert("RGB") for p in pictures], return_tensors="np")
    grids = naflex_images.grid_of(packed)
    np.testing.assert_array_equal(grids, expected["spatial_shapes"])
    valid = expected["pixel_attention_mask"].astype(bool)
    np.testing.assert_array_equal(np.arange(BUDGET)[None] < grids.prod(-1)[:, None], valid)
    np.testing.assert_allclose(packed[:, 1:][valid] / 255.0 * 2 - 1, expected["pixel_values"][valid], atol=1e-6)
    assert not packed[:, 1:][~valid].any()  # the padding is zeros


def test_training_batches_are_packed_and_flipped_images_keep_their_grid(naflex_config):
    plain = next(iter(input_pipeline.train_dataset(data_settings(naflex_config))))
    flipped = override(naflex_config, {"data.augment.flip": True, "data.augment.crop_min_area": 0.5})
    batch = next(iter(input_pipeline.train_dataset(data_settings(flipped))))
    assert batch["a"].shape == plain["a"].shape == (4, 1 + BUDGET, PATCH * PATCH * 3)
    assert batch["a"].dtype == np.uint8
    assert (naflex_images.grid_of(batch["a"]).prod(-1) <= BUDGET).all()
    np.testing.assert_array_equal(batch["index"], plain["index"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"data.image_size": 32}, r"set config\.data\.image_size=None"),
        ({"data.augment.noise_std": 0.05}, r"set config\.data\.augment\.color_jitter=0\.0 and noise_std=0\.0"),
        ({"data.task": "views"}, r"colour images paired with captions; .* set it to 0"),
    ],
)
def test_settings_naflex_cannot_serve_are_named(naflex_config, fields, message):
    with pytest.raises(ConfigError, match=message):
        settings.check_data_config(data_settings(override(naflex_config, fields)))
