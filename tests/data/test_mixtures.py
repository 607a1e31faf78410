"""Mixtures of record sets (`config.data.records=a,b`, `config.data.mixture_weights`): the
draws follow the weights, each set is read in whole epochs of its own, the stream is a pure
function of (seed, examples consumed) for any process split, and sets that cannot mix are
refused in one line."""

import dataclasses
import io
import itertools

import numpy as np
import pytest
from PIL import Image

from contrastive_jax.data import batch_numbering, input_pipeline, records, settings
from contrastive_jax.errors import ConfigError
from contrastive_jax.training.run_plan import data_settings


def write_set(directory, num, *, first=0, mode="RGB", fields=("image", "captions"), id_keys=(), negatives=0, size=10):
    """A record set of `num` solid-colour `size` px PNGs (colour from `first + i`), two captions
    each (and `negatives` hard-negative texts), in two shards of split "train" (and a
    "test" split of 4)."""

    def example(i):
        buffer = io.BytesIO()
        Image.new(mode, (size, size), (i * 7 % 256, i * 13 % 256, 50) if mode == "RGB" else i % 256).save(buffer, "PNG")
        values = {"image": buffer.getvalue(), "captions": [f"colour {i}", f"the {i}th colour"]}
        values["negatives"] = [f"not colour {i + k}" for k in range(1, negatives + 1)]
        return {k: v for k, v in values.items() if k in fields} | dict.fromkeys(id_keys, i)

    directory.mkdir(parents=True)
    splits = {}
    for split, count, start in (("train", num, first), ("test", 4, first + 10_000)):
        halves = [range(start, start + count // 2), range(start + count // 2, start + count)]
        shards = [records.shard_name(split, k, 2) for k in range(2)]
        for shard, part in zip(shards, halves):
            records.write_shard(str(directory / shard), [example(i) for i in part])
        splits[split] = records.Split(tuple(shards), tuple(len(h) for h in halves))
    channels = 1 if mode == "L" else 3
    fields = (*fields, *(("negatives",) if negatives else ()), *id_keys)
    records.write_metadata(
        records.Metadata(
            str(directory), splits, fields, tuple(id_keys), image_channels=channels, num_negatives=negatives
        )
    )
    return str(directory)


@pytest.fixture
def mixed(load_config, tmp_path):
    """A config mixing three image-text sets of 40, 24 and 30 examples, 0.5 / 0.3 / 0.2."""
    config = load_config("default")
    sets = [write_set(tmp_path / name, n, first=f) for name, n, f in (("a", 40, 0), ("b", 24, 100), ("c", 30, 200))]
    config.data.records = ",".join(sets)
    config.data.mixture_weights = (0.5, 0.3, 0.2)
    config.data.image_size = 8
    config.data.text_max_length = 16
    config.data.augment.noise_std = 0.1
    config.data.augment.crop_min_area = 0.5
    config.train.global_batch_size = 20
    return config


def take(stream, num):
    return list(itertools.islice(iter(stream), num))


def assert_equal_batches(first, second):
    assert len(first) == len(second)
    for x, y in zip(first, second):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_draws_match_the_weights(mixed):
    """Pooled over 300 batches of 20 (6,000 draws), the sets' counts against the weights:
    chi^2 on 2 degrees of freedom below 5.99 (its 95% quantile). And each batch holds each
    set's share to a row (grain's interleave), and a set's first n draws are its n
    examples once each (whole epochs of its own)."""
    data = data_settings(mixed)
    reader = input_pipeline.train_dataset(data).reader
    weights, sizes = np.array([0.5, 0.3, 0.2]), np.array([40, 24, 30])
    offsets = np.cumsum([0, *sizes])
    indices = np.stack([reader.indices(step) for step in range(300)])  # [300, 20]
    sets = np.searchsorted(offsets, indices, side="right") - 1
    counts = np.stack([(sets == s).sum(axis=1) for s in range(3)], axis=1)  # [300, 3]
    expected = weights * indices.size
    chi2 = float((((counts.sum(axis=0) - expected) ** 2) / expected).sum())
    assert chi2 < 5.99, chi2
    assert np.abs(counts - weights * 20).max() <= 1
    for s in range(3):
        drawn = indices.ravel()[sets.ravel() == s]
        for epoch in range(len(drawn) // sizes[s]):
            one = drawn[epoch * sizes[s] : (epoch + 1) * sizes[s]]
            assert sorted(one) == list(range(offsets[s], offsets[s + 1]))


def test_each_sets_epochs_are_the_rows_read_from_it(mixed):
    data = data_settings(mixed)
    reader = input_pipeline.train_dataset(data).reader
    numbering = batch_numbering.BatchNumbering(data, [])
    sets = np.searchsorted(reader.offsets, np.concatenate([reader.indices(s) for s in range(7)]), side="right") - 1
    epochs = numbering.epochs_through(7)  # steps 1-7 read batches 0-6
    rows = [int((sets == s).sum()) for s in range(3)]
    assert epochs == {"train/epoch/a": rows[0] / 40, "train/epoch/b": rows[1] / 24, "train/epoch/c": rows[2] / 30}
    assert batch_numbering.BatchNumbering(data, [3]).epochs_through(6) == epochs  # batch 3 skipped: read


def test_resuming_continues_every_set_bitwise(mixed):
    """The stream from a step (or from a stream position, as under a batch schedule) is the
    tail of the stream from 0, over several epochs of the smallest set."""
    data = data_settings(mixed)
    stream = take(input_pipeline.train_dataset(data), 8)
    assert_equal_batches(take(input_pipeline.train_dataset(data, start_step=5), 3), stream[5:])
    staged = input_pipeline.train_dataset(data, start_step=2, global_batch_size=40, start_example=60)
    joined = take(staged, 1)[0]  # positions [60, 100): steps 3 and 4 of the stream
    for key in joined:
        np.testing.assert_array_equal(joined[key], np.concatenate([stream[3][key], stream[4][key]]))


@pytest.mark.parametrize("count", [2, 4])
def test_processes_read_their_rows_of_one_mixed_batch(mixed, count):
    """P processes x 8 / P devices: process p's rows are rows [p N / P, (p + 1) N / P) of
    what one process reads."""
    mixed.train.global_batch_size = 40
    data = data_settings(mixed)
    whole = take(input_pipeline.train_dataset(data, start_step=3), 2)
    parts = [
        take(input_pipeline.train_dataset(data, start_step=3, process_index=p, process_count=count), 2)
        for p in range(count)
    ]
    for step in range(2):
        for key in whole[step]:
            np.testing.assert_array_equal(np.concatenate([part[step][key] for part in parts]), whole[step][key])


@pytest.mark.slow
def test_worker_processes_read_a_mixture_as_the_trainer_does(mixed):
    in_process = take(input_pipeline.train_dataset(data_settings(mixed), start_step=2), 2)
    mixed.data.num_workers = 2
    assert_equal_batches(take(input_pipeline.train_dataset(data_settings(mixed), start_step=2), 2), in_process)


def test_one_set_weighted_one_is_todays_stream(mixed):
    first = mixed.data.records.split(",")[0]
    mixed.data.records = first
    mixed.data.mixture_weights = ()
    today = take(input_pipeline.train_dataset(data_settings(mixed)), 5)  # 100 rows: 2.5 epochs
    mixed.data.mixture_weights = (1.0,)
    data = data_settings(mixed)
    assert data.mixture_records == (first,)
    assert_equal_batches(take(input_pipeline.train_dataset(data), 5), today)


def test_the_command_line_and_a_python_config_give_one_mixture(mixed):
    from_flags = data_settings(mixed)  # "a,b,c" as --config.data.records gives it
    mixed.data.records = from_flags.mixture_records  # a tuple in a Python config
    mixed.data.mixture_weights = [0.5, 0.3, 0.2]
    assert data_settings(mixed) == from_flags
    assert from_flags.records == from_flags.mixture_records[0]  # evaluation reads the first set


@pytest.mark.parametrize(
    "change, message",
    [
        ({"mixture_weights": (0.5, 0.5)}, r"mixture_weights=\(0.5, 0.5\) needs one weight per record set .*\(3: "),
        ({"mixture_weights": (0.5, 0.0, 0.5)}, r"each weight must be > 0"),
        ({"task": "labeled"}, r"task='labeled' draws whole classes from one record set"),
        (
            {"image_size": None, "set": {"size": 12}},
            r"images are stacked in one batch, and the record set \S+/c's are 12 x 12, \S+/a's 10 x 10: set config",
        ),
        ({"train_split": "valid"}, r"has no split 'valid'"),
        ({"set": {"mode": "L"}}, r"c cannot mix with \S+/a: its image_channels is 1, not 3"),
        ({"set": {"fields": ("image",)}}, r"c cannot mix with \S+/a: its fields is \('image',\), not \('image', 'c"),
        ({"set": {"id_keys": ("group",)}}, r"c cannot mix with \S+/a: its fields is \('image', 'captions', 'group'\)"),
        ({"set": {"negatives": 2}}, r"c holds 2 hard negatives per record and \S+/a 0: every row of a batch takes"),
        ({"same_name": True}, r"share a name \(their metrics' name\); give their folders distinct names"),
        ({"global_batch_size": 100}, r"global_batch_size=100 draws 50 examples a batch from \S+/a, more than the 40 "),
    ],
)
def test_sets_that_cannot_mix_are_refused_in_one_line(mixed, tmp_path, change, message):
    sets = mixed.data.records.split(",")
    if "set" in change:
        sets[2] = write_set(tmp_path / "other" / "c", 30, **change["set"])
    if change.get("same_name"):
        sets[2] = write_set(tmp_path / "elsewhere" / "a", 30)
    mixed.data.records = ",".join(sets)
    for field, value in change.items():
        if field == "global_batch_size":
            mixed.train.global_batch_size = value
        elif field not in ("set", "same_name"):
            mixed.data[field] = value
    with pytest.raises(ConfigError, match=message) as error:
        data = data_settings(mixed)
        settings.check_data_config(data)
        input_pipeline.train_dataset(data)
    assert "\n" not in str(error.value)


def test_sets_of_one_native_size_mix_as_they_are(mixed):
    """Without config.data.image_size, sets whose images share a size mix unresized."""
    mixed.data.image_size = None
    data = data_settings(mixed)
    settings.check_data_config(data)
    assert next(iter(input_pipeline.train_dataset(data)))["a"].shape[1:3] == (10, 10)


def test_weights_without_sets_to_mix_are_refused(mixed, digits_data_dir):
    mixed.data.records = None  # the built-in set
    mixed.data.data_dir = digits_data_dir
    with pytest.raises(ConfigError, match=r"mixture_weights=\(0.5, 0.3, 0.2\) needs one weight .*\(0: none\)"):
        settings.check_data_config(dataclasses.replace(data_settings(mixed), task="pairs"))
