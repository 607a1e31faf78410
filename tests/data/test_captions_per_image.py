"""`config.data.captions_per_image = k`: each image of a batch brings k rows, the image (and
its augmentation) repeated with k of its captions, its `index` the rows' positive id; the
rows stay a pure function of (seed, stream position)."""

import io
import itertools

import numpy as np
import pytest
from PIL import Image

from contrastive_jax.data import input_pipeline, records, settings
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.run_plan import data_settings

CAPTIONS = ("colour {}", "the {}th colour", "hue {}")


def write_captioned_set(directory, num):
    """`num` solid-colour 12 px PNGs; image i has 3 captions, but every fifth has one."""
    examples = []
    for i in range(num):
        buffer = io.BytesIO()
        Image.new("RGB", (12, 12), (i * 7 % 256, i * 13 % 256, 50)).save(buffer, "PNG")
        captions = [c.format(i) for c in CAPTIONS[: 1 if i % 5 == 0 else 3]]
        examples.append({"image": buffer.getvalue(), "captions": captions})
    directory.mkdir(parents=True)
    shard = records.shard_name("train", 0, 1)
    records.write_shard(str(directory / shard), examples)
    split = records.Split((shard,), (num,))
    records.write_metadata(records.Metadata(str(directory), {"train": split}, ("image", "captions")))
    return str(directory)


@pytest.fixture
def config(load_config, tmp_path):
    config = load_config("default")
    config.data.records = write_captioned_set(tmp_path / "captioned", 30)
    config.data.image_size = 8
    config.data.text_max_length = 24
    config.data.augment.crop_min_area = 0.5
    config.data.augment.noise_std = 0.1
    config.data.captions_per_image = 3
    config.train.global_batch_size = 12
    return config


def take(stream, num):
    return list(itertools.islice(iter(stream), num))


def texts(tokens):
    return [bytes((t[t > 0] - 1).astype(np.uint8)).decode() for t in tokens]


def test_each_image_brings_k_of_its_captions_as_k_rows(config):
    data = data_settings(config)
    settings.check_data_config(data)
    batches = take(input_pipeline.train_dataset(data), 5)  # 20 images
    for batch in batches:
        index = batch["index"].reshape(4, 3)
        assert (index == index[:, :1]).all() and len(set(index[:, 0])) == 4  # 4 images a batch, 3 rows each
        images = batch["a"].reshape(4, 3, *batch["a"].shape[1:])
        assert (images == images[:, :1]).all()  # the image and its augmentation repeated
        for i, row in zip(index[:, 0], np.reshape(texts(batch["b"]), (4, 3))):
            own = [c.format(i) for c in CAPTIONS[: 1 if i % 5 == 0 else 3]]
            assert sorted(row) == sorted(own * (3 // len(own)))  # k of its captions; one caption repeated
    # Over 10 batches, 40 images: the first 30 are an epoch, each image once.
    images = np.concatenate([b["index"][::3] for b in take(input_pipeline.train_dataset(data), 10)])
    assert sorted(images[:30]) == list(range(30))


def test_one_caption_per_image_is_todays_stream(config):
    """k = 1 reads the stream a config without the field (a run saved before it) reads:
    12 images a batch, one caption each."""
    config.data.captions_per_image = 1
    today = take(input_pipeline.train_dataset(data_settings(config)), 3)
    assert len(set(today[0]["index"])) == 12
    with config.unlocked():
        del config.data["captions_per_image"]
    for x, y in zip(today, take(input_pipeline.train_dataset(data_settings(config)), 3)):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_rows_are_a_function_of_the_stream_position(config):
    """A resumed stream, a batch schedule's stream from a position, and 2 processes read
    the rows the stream from 0 in one process reads."""
    data = data_settings(config)
    stream = take(input_pipeline.train_dataset(data), 6)
    resumed = take(input_pipeline.train_dataset(data, start_step=4), 2)
    staged = take(input_pipeline.train_dataset(data, start_step=2, global_batch_size=24, start_example=36), 1)[0]
    halves = [
        take(input_pipeline.train_dataset(data, start_step=4, process_index=p, process_count=2), 1)[0] for p in (0, 1)
    ]
    for key in stream[0]:
        np.testing.assert_array_equal(
            np.concatenate([r[key] for r in resumed]), np.concatenate([stream[4][key], stream[5][key]])
        )
        np.testing.assert_array_equal(staged[key], np.concatenate([stream[3][key], stream[4][key]]))
        np.testing.assert_array_equal(np.concatenate([h[key] for h in halves]), stream[4][key])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("data.captions_per_image", 0, r"captions_per_image=0 must be >= 1"),
        ("data.task", "views", r"needs task 'pairs' on captioned images .*task 'views'\); set it to 1"),
        ("train.global_batch_size", 10, r"global_batch_size=10 must be a multiple of config.data.captions_per_image"),
    ],
)
def test_bad_settings_are_refused_in_one_line(config, field, value, message):
    group, name = field.split(".")
    config[group][name] = value
    with pytest.raises(ConfigError, match=message) as error:
        settings.check_data_config(data_settings(config))
    assert "\n" not in str(error.value)


def test_images_without_captions_are_refused(config, digits_data_dir):
    config.data.records = None
    config.data.data_dir = digits_data_dir
    config.data.image_size = None
    with pytest.raises(ConfigError, match=r"needs task 'pairs' on captioned images \(sklearn_digits, task 'pairs'\)"):
        settings.check_data_config(data_settings(config))
