"""The input pipeline: task outputs, determinism, seeking, epochs, sharding, errors."""

import numpy as np
import pytest

from contrastive_jax import data_sources, input_pipeline
from contrastive_jax.data_sources import DataSettings


@pytest.fixture
def config(load_config, digits_data_dir):
    config = load_config("default")
    config.data.data_dir = digits_data_dir
    config.data.augment.noise_std = 0.0
    return config


def take(ds, num):
    it = ds.as_numpy_iterator()
    return [next(it) for _ in range(num)]


def train_images(config):
    return input_pipeline.load_split(DataSettings.from_config(config), config.data.train_split)["image"]


def test_pairs_are_top_and_bottom_halves_covering_each_epoch(config):
    # 1437 = 3 x 479: three batches are exactly one epoch, every image once.
    config.train.global_batch_size = 479
    batches = take(input_pipeline.train_dataset(DataSettings.from_config(config)), 6)
    assert batches[0]["a"].shape == (479, 4, 8, 1) and batches[0]["b"].shape == (479, 4, 8, 1)
    expected = sorted(map(bytes, train_images(config)))
    for epoch in (batches[:3], batches[3:]):
        images = np.concatenate([np.concatenate([b["a"], b["b"]], axis=1) for b in epoch])
        images = np.round(images * 255).astype(np.uint8)
        assert sorted(map(bytes, images)) == expected
    # Each epoch has its own order.
    assert not np.array_equal(batches[0]["a"], batches[3]["a"])


def test_same_seed_same_stream_other_seed_other_stream(config):
    first = take(input_pipeline.train_dataset(DataSettings.from_config(config)), 2)
    again = take(input_pipeline.train_dataset(DataSettings.from_config(config)), 2)
    config.data.seed = 1
    other = take(input_pipeline.train_dataset(DataSettings.from_config(config)), 1)
    for x, y in zip(first, again):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert not np.array_equal(first[0]["a"], other[0]["a"])


@pytest.mark.parametrize("task", ["pairs", "views", "labeled"])
def test_starting_at_a_step_continues_the_stream(config, task):
    config.data.task = task
    config.data.augment.noise_std = 0.1
    config.data.augment.crop_min_area = 0.5
    config.train.global_batch_size = 1000  # > 1437 / 2, so step 2 straddles two epochs
    if task == "labeled":
        config.train.global_batch_size = 40
    stream = take(input_pipeline.train_dataset(DataSettings.from_config(config)), 3)
    resumed = take(input_pipeline.train_dataset(DataSettings.from_config(config), start_step=2), 1)[0]
    for key in resumed:
        np.testing.assert_array_equal(stream[2][key], resumed[key])


def test_views_are_two_different_augmentations(config):
    config.data.task = "views"
    config.data.augment.crop_min_area = 0.5
    batch = take(input_pipeline.train_dataset(DataSettings.from_config(config)), 1)[0]
    assert batch["a"].shape == batch["b"].shape == (256, 8, 8, 1)
    assert np.abs(batch["a"] - batch["b"]).mean() > 0.01
    assert batch["a"].min() >= 0 and batch["a"].max() <= 1


def test_labeled_batches_hold_m_distinct_examples_of_each_class(config):
    config.data.task = "labeled"
    config.data.examples_per_class = 4
    config.train.global_batch_size = 32
    for batch in take(input_pipeline.train_dataset(DataSettings.from_config(config)), 5):
        classes, counts = np.unique(batch["label"], return_counts=True)
        assert len(classes) == 8 and set(counts) == {4}
        assert len({bytes(x) for x in batch["a"]}) == 32


@pytest.mark.parametrize("task", ["pairs", "labeled"])
def test_processes_take_their_rows_of_one_global_batch(config, task):
    """Process p of P gets rows [p N/P, (p+1) N/P) of the batch one process sees."""
    config.data.task = task
    config.data.augment.noise_std = 0.1
    config.train.global_batch_size = 40  # 10 classes x 4 for "labeled"
    data = DataSettings.from_config(config)
    whole = take(input_pipeline.train_dataset(data, start_step=3), 1)[0]
    for count in (2, 4):
        parts = [
            take(input_pipeline.train_dataset(data, start_step=3, process_index=p, process_count=count), 1)[0]
            for p in range(count)
        ]
        assert parts[0]["a"].shape[0] == 40 // count
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), whole[key])


def test_eval_arrays_are_the_whole_split_in_order(config):
    arrays = input_pipeline.eval_arrays(DataSettings.from_config(config), "test")
    assert arrays["a"].shape == (360, 4, 8, 1) and arrays["label"].shape == (360,)
    again = input_pipeline.eval_arrays(DataSettings.from_config(config), "test")
    np.testing.assert_array_equal(arrays["a"], again["a"])
    restricted = input_pipeline.eval_arrays(DataSettings.from_config(config), "test", class_range=(6, 10))
    assert set(np.unique(restricted["label"])) == {6, 7, 8, 9}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("data.task", "triples", "config.data.task"),
        ("data.name", "mnist_typo", "config.data.name"),
        ("train.global_batch_size", 2000, "larger than the 1437 examples"),
    ],
)
def test_bad_config_raises_a_clear_error(config, field, value, message):
    group, name = field.split(".")
    config[group][name] = value
    with pytest.raises(ValueError, match=message):
        checked_stream(config)


def test_labeled_batch_must_be_a_multiple_of_m(config):
    config.data.task = "labeled"
    config.train.global_batch_size = 30
    with pytest.raises(ValueError, match="examples_per_class=4"):
        checked_stream(config)


def checked_stream(config):
    """The stream of `config`'s data after the checks `trainer.build` runs on them."""
    data = DataSettings.from_config(config)
    data_sources.check_data_config(data)
    return input_pipeline.train_dataset(data)
