"""The input pipeline: task outputs, determinism, seeking, epochs, sharding, bad records."""

import dataclasses
import io
import itertools
import os
import threading

import numpy as np
import pytest
from PIL import Image

from contrastive_jax.data import input_pipeline, records, settings
from contrastive_jax.training.run_plan import data_settings


@pytest.fixture
def config(load_config, digits_data_dir):
    config = load_config("default")
    config.data.data_dir = digits_data_dir
    config.data.augment.noise_std = 0.0
    return config


def take(stream, num):
    return list(itertools.islice(iter(stream), num))


def write_image_text_set(directory, num, *, corrupt=(), size=12):
    """A record set of `num` solid-colour PNGs, two captions each; the records numbered
    in `corrupt` hold bytes that are no image."""
    examples = []
    for i in range(num):
        buffer = io.BytesIO()
        Image.new("RGB", (size, size), (i * 7 % 256, i * 13 % 256, 50)).save(buffer, "PNG")
        image = b"not an image" if i in corrupt else buffer.getvalue()
        examples.append({"image": image, "captions": [f"colour {i}", f"the {i}th colour"], "label": i % 3})
    directory.mkdir(parents=True, exist_ok=True)
    halves = [examples[: num // 2], examples[num // 2 :]]
    shards = [records.shard_name("train", k, 2) for k in range(2)]
    for shard, part in zip(shards, halves):
        records.write_shard(str(directory / shard), part)
    np.save(records.labels_file(str(directory), "train"), np.array([e["label"] for e in examples], np.int32))
    records.write_metadata(
        records.Metadata(
            directory=str(directory),
            splits={"train": records.Split(tuple(shards), tuple(len(h) for h in halves))},
            fields=("image", "captions", "label"),
            num_classes=3,
        )
    )
    return str(directory)


@pytest.fixture
def image_text_config(load_config, tmp_path):
    config = load_config("default")
    config.data.records = write_image_text_set(tmp_path / "set", 40, corrupt=(5, 6))
    config.data.image_size = 8
    config.data.text_max_length = 16
    config.train.global_batch_size = 16
    return config


def test_pairs_are_top_and_bottom_halves_covering_each_epoch(config):
    # 1437 = 3 x 479: three batches are exactly one epoch, every image once.
    config.train.global_batch_size = 479
    data = data_settings(config)
    batches = take(input_pipeline.train_dataset(data), 6)
    assert batches[0]["a"].shape == (479, 4, 8, 1) and batches[0]["b"].shape == (479, 4, 8, 1)
    split = input_pipeline.eval_arrays(data, "train")
    expected = sorted(map(bytes, np.concatenate([split["a"], split["b"]], axis=1)))
    for epoch in (batches[:3], batches[3:]):
        images = np.concatenate([np.concatenate([b["a"], b["b"]], axis=1) for b in epoch])
        assert sorted(map(bytes, images)) == expected
        assert sorted(np.concatenate([b["index"] for b in epoch])) == list(range(1437))
    # Each epoch has its own order.
    assert not np.array_equal(batches[0]["a"], batches[3]["a"])


def test_same_seed_same_stream_other_seed_other_stream(config):
    first = take(input_pipeline.train_dataset(data_settings(config)), 2)
    again = take(input_pipeline.train_dataset(data_settings(config)), 2)
    config.data.seed = 1
    other = take(input_pipeline.train_dataset(data_settings(config)), 1)
    for x, y in zip(first, again):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert not np.array_equal(first[0]["a"], other[0]["a"])


@pytest.mark.parametrize("task", ["pairs", "views", "labeled"])
def test_starting_at_a_step_continues_the_stream(config, task):
    """A resumed run (a stream opened at step s) reads bitwise what an uninterrupted one does."""
    config.data.task = task
    config.data.augment.noise_std = 0.1
    config.data.augment.crop_min_area = 0.5
    config.train.global_batch_size = 1000  # > 1437 / 2, so step 2 straddles two epochs
    if task == "labeled":
        config.train.global_batch_size = 40
    stream = take(input_pipeline.train_dataset(data_settings(config)), 3)
    resumed = take(input_pipeline.train_dataset(data_settings(config), start_step=2), 1)[0]
    assert resumed.keys() == stream[2].keys()
    for key in resumed:
        np.testing.assert_array_equal(stream[2][key], resumed[key])


@pytest.mark.slow
def test_worker_processes_give_the_same_batches(config):
    config.data.augment.noise_std = 0.1
    in_process = take(input_pipeline.train_dataset(data_settings(config), start_step=5), 3)
    config.data.num_workers = 2
    workers = take(input_pipeline.train_dataset(data_settings(config), start_step=5), 3)
    for x, y in zip(in_process, workers):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_views_are_two_different_augmentations(config):
    config.data.task = "views"
    config.data.augment.crop_min_area = 0.5
    batch = take(input_pipeline.train_dataset(data_settings(config)), 1)[0]
    assert batch["a"].shape == batch["b"].shape == (256, 8, 8, 1)
    assert batch["a"].dtype == np.uint8  # crops alone leave pixels exact: the model scales them
    assert np.abs(batch["a"].astype(np.float32) - batch["b"]).mean() > 2
    config.data.augment.color_jitter = 0.4
    jittered = take(input_pipeline.train_dataset(data_settings(config)), 1)[0]
    assert jittered["a"].dtype == np.float32 and jittered["a"].min() >= 0 and jittered["a"].max() <= 1
    # The same crops; then each image's brightness and contrast: a few grey levels apart.
    difference = np.abs(jittered["a"] * 255 - batch["a"]).mean()
    assert 1 < difference < 60


def test_pixel_noise_is_the_stated_strength(config):
    config.data.augment.noise_std = 0.05
    noisy = take(input_pipeline.train_dataset(data_settings(config)), 1)[0]
    clean = input_pipeline.eval_arrays(data_settings(config), "train")["a"][noisy["index"]] / 255.0
    inside = (clean > 0.2) & (clean < 0.8)  # where the clip does not cut the noise
    assert abs(float(np.std(noisy["a"][inside] - clean[inside])) - 0.05) < 0.003


def test_labeled_batches_hold_m_distinct_examples_of_each_class(config):
    config.data.task = "labeled"
    config.data.examples_per_class = 4
    config.train.global_batch_size = 32
    for batch in take(input_pipeline.train_dataset(data_settings(config)), 5):
        classes, counts = np.unique(batch["label"], return_counts=True)
        assert len(classes) == 8 and set(counts) == {4}
        assert len(set(batch["index"])) == 32


@pytest.mark.parametrize("task", ["pairs", "labeled"])
def test_processes_take_their_rows_of_one_global_batch(config, task, monkeypatch):
    """Process p of P gets rows [p N/P, (p+1) N/P) of the batch one process sees, and
    reads only those records from disk."""
    config.data.task = task
    config.data.augment.noise_std = 0.1
    config.train.global_batch_size = 40  # 10 classes x 4 for "labeled"
    data = data_settings(config)
    whole = input_pipeline.train_dataset(data).reader(3)  # step 3's batch, read here (nothing prefetched)
    reads, here = [], threading.get_ident()  # reads in this thread (earlier streams prefetch in theirs)
    read = records.RecordSet.read_many

    def counted(self, indices):
        if threading.get_ident() == here:
            reads.extend(indices)
        return read(self, indices)

    monkeypatch.setattr(records.RecordSet, "read_many", counted)
    for count in (2, 4):
        parts = []
        for p in range(count):
            stream = input_pipeline.train_dataset(data, start_step=3, process_index=p, process_count=count)
            reads.clear()
            parts.append(stream.reader(3))
            assert sorted(reads) == sorted(parts[-1]["index"])  # only this process's rows
        assert parts[0]["a"].shape[0] == 40 // count
        for key in whole:
            np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), whole[key])
    # The stream yields the same batch.
    np.testing.assert_array_equal(take(stream, 1)[0]["a"], parts[-1]["a"])


def test_eval_arrays_are_the_whole_split_in_order(config):
    arrays = input_pipeline.eval_arrays(data_settings(config), "test")
    assert arrays["a"].shape == (360, 4, 8, 1) and arrays["label"].shape == (360,)
    again = input_pipeline.eval_arrays(data_settings(config), "test")
    np.testing.assert_array_equal(arrays["a"], again["a"])
    restricted = input_pipeline.eval_arrays(data_settings(config), "test", class_range=(6, 10))
    assert set(np.unique(restricted["label"])) == {6, 7, 8, 9}
    both = input_pipeline.eval_arrays(data_settings(config), "train+test")
    assert len(both["a"]) == 1437 + 360
    np.testing.assert_array_equal(both["a"][1437:], arrays["a"])
    sliced = input_pipeline.eval_arrays(data_settings(config), "train+test[1400:1500]")
    np.testing.assert_array_equal(sliced["a"], both["a"][1400:1500])


def test_captions_are_drawn_per_visit_as_a_function_of_the_position(image_text_config):
    image_text_config.data.on_bad_record = "skip"
    data = data_settings(image_text_config)
    batches = take(input_pipeline.train_dataset(data), 10)
    again = take(input_pipeline.train_dataset(data, start_step=4), 1)[0]
    np.testing.assert_array_equal(again["b"], batches[4]["b"])
    texts = {
        (int(i), bytes((t[t > 0] - 1).astype(np.uint8)).decode()) for b in batches for i, t in zip(b["index"], b["b"])
    }
    assert {f"colour {i}" for i, _ in texts} & {t for _, t in texts}  # the first caption ...
    assert {f"the {i}th colour" for i, _ in texts} & {t for _, t in texts}  # ... and the second
    assert all(t in (f"colour {i}", f"the {i}th colour") for i, t in texts)
    assert batches[0]["a"].shape == (16, 8, 8, 3) and batches[0]["a"].dtype == np.float32


def test_a_bad_record_stops_with_its_shard_and_number(image_text_config):
    data = data_settings(image_text_config)
    with pytest.raises(
        records.DataError,
        match=r"^\S+/train-00000-of-00002.array_record, record [56]: cannot decode the image .*'skip'\)$",
    ):
        take(input_pipeline.train_dataset(data), 3)  # 3 x 16 rows cover records 5 and 6


def test_skipped_records_are_the_same_in_every_run(image_text_config):
    image_text_config.data.on_bad_record = "skip"
    data = data_settings(image_text_config)
    first = take(input_pipeline.train_dataset(data), 5)
    second = take(input_pipeline.train_dataset(data, start_step=0), 5)
    # Two epochs (5 x 16 rows of 40): example 5 passes over records 5 and 6, example 6 over 6.
    assert sum(int(b["skipped_records"]) for b in first) == 2 * (2 + 1)
    for x, y in zip(first, second):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])
    assert not {5, 6} & {int(i) for b in first for i in b["index"]}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("data.task", "triples", "config.data.task"),
        ("data.name", "mnist_typo", "config.data.name"),
        ("data.on_bad_record", "ignore", "config.data.on_bad_record"),
        ("data.train_split", "validation", "has no split 'validation'"),
        ("train.global_batch_size", 2000, "larger than the 1437 examples"),
    ],
)
def test_bad_config_raises_a_clear_error(config, field, value, message):
    group, name = field.split(".")
    config[group][name] = value
    with pytest.raises(ValueError, match=message):
        checked_stream(config)


def test_a_missing_record_set_names_the_command_that_writes_one(config, tmp_path):
    config.data.records = str(tmp_path / "nowhere")
    with pytest.raises(records.DataError, match="no record set in .*nowhere .*write_records"):
        checked_stream(config)


def test_labeled_batch_must_be_a_multiple_of_m(config):
    config.data.task = "labeled"
    config.train.global_batch_size = 30
    with pytest.raises(
        ValueError,
        match=r"global_batch_size=30 must be a multiple of config.data.examples_per_class \(4\); use 28 or 32",
    ):
        checked_stream(config)


def checked_stream(config):
    """The stream of `config`'s data after the checks `run_plan.build` runs on them."""
    data = data_settings(config)
    settings.check_data_config(data)
    return input_pipeline.train_dataset(data)


@pytest.mark.parametrize(
    "damage, message",
    [
        (
            "delete",
            r"shard \S+train-00001-of-00002.array_record of split 'train' is missing; rerun the `write_records`",
        ),
        (
            "truncate",
            r"shard \S+train-00001-of-00002.array_record holds 0 records but metadata.json says 20: it is trunc",
        ),
        ("miscount", r"shard \S+train-00001-of-00002.array_record holds 20 records but metadata.json says 21: it is"),
    ],
)
def test_a_damaged_record_set_names_the_shard_and_the_fix(image_text_config, damage, message):
    directory = image_text_config.data.records
    shard = os.path.join(directory, "train-00001-of-00002.array_record")
    if damage == "delete":
        os.remove(shard)
    elif damage == "truncate":
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) // 2)
    else:
        metadata = records.read_metadata(directory)
        split = metadata.splits["train"]
        wrong = records.Split(split.shards, (split.shard_sizes[0], split.shard_sizes[1] + 1))
        records.write_metadata(dataclasses.replace(metadata, splits={"train": wrong}))
    image_text_config.data.on_bad_record = "skip"  # damage to a shard is never skipped
    with pytest.raises(records.DataError, match=message):
        data = data_settings(image_text_config)
        take(input_pipeline.train_dataset(data), 3)
