"""scikit-learn's handwritten digits, the built-in dataset `sklearn_digits`, with no download.

`sklearn.datasets.load_digits` ships 1,797 8x8 grey-level images of the digits 0-9 in the
scikit-learn wheel. This module gives them as records: `image`, an 8x8 grey PGM file
(raw pixels: the reader decodes it without PIL), and `label`;
`write_records --source=builtin:sklearn_digits` writes them, and the pipeline reads them
like any other record set (`config.data.name="sklearn_digits"` writes them on first use).

Splits (fixed; they do not depend on the machine or the library versions' RNGs beyond
scikit-learn's `train_test_split`):

* `train` / `test`: 80% / 20% of all images (1,437 / 360), stratified by class,
  `train_test_split(..., test_size=0.2, stratify=labels, random_state=0)`.
* `disjoint_train` / `disjoint_test`: class-disjoint split for metric learning: every
  image of the classes 0-5 (1,083) for training, every image of 6-9 (714) for retrieval.

Pixels are scikit-learn's 0..16 grey levels scaled to 0..255 (`round(v * 255 / 16)`);
records are in the order of their row in `load_digits()`.
"""

import functools
import io

import numpy as np
from PIL import Image

SPLITS = ("train", "test", "disjoint_train", "disjoint_test")
NUM_CLASSES = 10
# Classes of the class-disjoint split: train on the first, retrieve among the second.
DISJOINT_TRAIN_CLASSES = tuple(range(0, 6))
DISJOINT_TEST_CLASSES = tuple(range(6, 10))
TEST_FRACTION = 0.2
SPLIT_SEED = 0
# What `records.Metadata` says of the set.
INFO = {"fields": ("image", "label"), "num_classes": NUM_CLASSES, "image_channels": 1}


@functools.cache
def split_indices() -> dict[str, np.ndarray]:
    """Rows of `load_digits()` in each split, sorted; the single definition of the splits."""
    from sklearn import datasets, model_selection

    labels = datasets.load_digits().target
    rows = np.arange(len(labels))
    train, test = model_selection.train_test_split(
        rows, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED
    )
    return {
        "train": np.sort(train),
        "test": np.sort(test),
        "disjoint_train": rows[np.isin(labels, DISJOINT_TRAIN_CLASSES)],
        "disjoint_test": rows[np.isin(labels, DISJOINT_TEST_CLASSES)],
    }


def num_examples(split: str) -> int:
    return len(split_indices()[split])


@functools.cache
def _pixels_and_labels() -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    digits = datasets.load_digits()
    return np.round(digits.images * (255 / 16)).astype(np.uint8), digits.target


def examples(split: str, start: int, stop: int):
    """Records `start` to `stop` of `split`: `image` (8x8 grey PGM bytes) and `label`."""
    pixels, labels = _pixels_and_labels()
    for row in split_indices()[split][start:stop]:
        pgm = io.BytesIO()
        Image.fromarray(pixels[row], "L").save(pgm, "PPM")  # binary PGM (P5) for grey
        yield {"image": pgm.getvalue(), "label": int(labels[row])}
