"""scikit-learn's handwritten digits as a TFDS dataset, prepared locally with no download.

`sklearn.datasets.load_digits` ships 1,797 8x8 grey-level images of the digits 0-9 in the
scikit-learn wheel. This builder turns them into an ordinary TFDS dataset, so it is read
with the same code as catalogue datasets:

    import contrastive_jax.datasets  # registers "sklearn_digits"
    builder = tfds.builder("sklearn_digits")
    builder.download_and_prepare()          # local: nothing is downloaded
    ds = builder.as_dataset(split="test")

Splits (fixed; they do not depend on the machine or the library versions' RNGs beyond
scikit-learn's `train_test_split`):

* `train` / `test`: 80% / 20% of all images (1,437 / 360), stratified by class,
  `train_test_split(..., test_size=0.2, stratify=labels, random_state=0)`.
* `disjoint_train` / `disjoint_test`: class-disjoint split for metric learning: every
  image of the classes 0-5 (1,083) for training, every image of 6-9 (714) for retrieval.

Pixels are scikit-learn's 0..16 grey levels scaled to 0..255 (`round(v * 255 / 16)`);
`index` is the row in `load_digits()`, so every example can be traced back.
"""

import numpy as np
import tensorflow_datasets as tfds

NUM_CLASSES = 10
# Classes of the class-disjoint split: train on the first, retrieve among the second.
DISJOINT_TRAIN_CLASSES = tuple(range(0, 6))
DISJOINT_TEST_CLASSES = tuple(range(6, 10))
TEST_FRACTION = 0.2
SPLIT_SEED = 0


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


class SklearnDigits(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's 8x8 digits (1,797 images, 10 classes), prepared without a download."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 1)),
                    "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                    "index": np.int32,
                }
            ),
            supervised_keys=("image", "label"),
            homepage="https://scikit-learn.org/stable/datasets/toy_dataset.html#digits-dataset",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # The data ships with scikit-learn.
        return {name: self._generate_examples(rows) for name, rows in split_indices().items()}

    def _generate_examples(self, rows):
        from sklearn import datasets

        digits = datasets.load_digits()
        pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]
        for row in rows:
            yield (
                int(row),
                {
                    "image": pixels[row],
                    "label": int(digits.target[row]),
                    "index": np.int32(row),
                },
            )
