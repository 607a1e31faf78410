"""The built-in sklearn_digits records: written locally, read back as the pipeline reads them."""

import numpy as np
import pytest
from sklearn import datasets

from contrastive_jax.data import images, records, settings
from contrastive_jax.data.builtin import sklearn_digits

SIZES = {"train": 1437, "test": 360, "disjoint_train": 1083, "disjoint_test": 714}


@pytest.fixture(scope="module")
def metadata(digits_data_dir):
    return records.read_metadata(settings.builtin_records("sklearn_digits", digits_data_dir))


@pytest.fixture(scope="module")
def splits(metadata):
    """Each split's `image` uint8 [n, 8, 8, 1], `label` [n] and `index` (the row in
    `load_digits()`, from the split's definition: records are in that order)."""
    out = {}
    for name in SIZES:
        split = records.RecordSet(metadata, name)
        examples = [records.decode(r) for r in split.read_many(range(len(split)))]
        out[name] = {
            "image": np.stack([images.to_array(images.decode(e["image"], 1)) for e in examples]),
            "label": np.array([e["label"] for e in examples]),
            "index": sklearn_digits.split_indices()[name],
        }
        np.testing.assert_array_equal(split.labels(), out[name]["label"])
    return out


def test_split_sizes_and_metadata(metadata):
    assert {name: split.num_records for name, split in metadata.splits.items()} == SIZES
    assert (metadata.num_classes, metadata.image_channels, metadata.fields) == (10, 1, ("image", "label"))


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
