"""The sklearn_digits TFDS builder: prepared locally, read through the ordinary tfds path."""

import numpy as np
import pytest
import tensorflow_datasets as tfds
from sklearn import datasets

from contrastive_jax.datasets import sklearn_digits

SIZES = {"train": 1437, "test": 360, "disjoint_train": 1083, "disjoint_test": 714}


@pytest.fixture(scope="module")
def splits(digits_data_dir):
    return {
        name: tfds.as_numpy(tfds.load("sklearn_digits", split=name, data_dir=digits_data_dir, batch_size=-1))
        for name in SIZES
    }


def test_split_sizes_and_metadata(digits_data_dir):
    builder = tfds.builder("sklearn_digits", data_dir=digits_data_dir)
    assert {name: info.num_examples for name, info in builder.info.splits.items()} == SIZES
    assert builder.info.features["label"].num_classes == 10
    assert builder.info.supervised_keys == ("image", "label")


def test_pixels_and_labels_match_sklearn(splits):
    digits = datasets.load_digits()
    for name, split in splits.items():
        rows = split["index"]
        np.testing.assert_array_equal(split["label"], digits.target[rows])
        expected = np.round(digits.images[rows] * 255 / 16).astype(np.uint8)[..., None]
        np.testing.assert_array_equal(split["image"], expected, err_msg=name)


def test_train_test_is_a_stratified_partition(splits):
    train, test = splits["train"]["index"], splits["test"]["index"]
    assert set(train).isdisjoint(test) and len(set(train) | set(test)) == 1797
    # Stratified: every class has 20% (+- rounding) of its images in test.
    labels = datasets.load_digits().target
    for c in range(10):
        share = np.sum(labels[test] == c) / np.sum(labels == c)
        assert abs(share - 0.2) < 0.01


def test_splits_are_fixed():
    # Recorded golden: the first test rows, so a change of the split definition shows.
    indices = sklearn_digits.split_indices()
    np.testing.assert_array_equal(indices["test"][:5], [21, 24, 28, 34, 35])


def test_disjoint_split_classes(splits):
    assert set(np.unique(splits["disjoint_train"]["label"])) == set(range(6))
    assert set(np.unique(splits["disjoint_test"]["label"])) == set(range(6, 10))
    both = np.concatenate([splits["disjoint_train"]["index"], splits["disjoint_test"]["index"]])
    assert sorted(both) == list(range(1797))
