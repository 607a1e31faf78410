"""Records to model inputs: which examples a step's batch holds, and each one's inputs.

`Examples` reads one split's records (optionally only the labels in a class range) and
turns record `i` into the model's inputs; `BatchReader` maps a step number to this
process's rows of that step's global batch. Both are plain picklable objects (grain's
worker processes receive them) and import neither JAX nor TensorFlow.

Every random choice is seeded by `(config.data.seed, stream, position)`, where the
position `step * N + k` numbers the rows of the global batches, so a batch is a pure
function of `(seed, step)` whatever the number of processes or workers.
"""

import numpy as np
from grain import experimental as grain_experimental

from contrastive_jax import images, records, tokenizers
from contrastive_jax.data_sources import DataSettings, augments
from contrastive_jax.records import DataError

# Independent random streams of `config.data.seed`.
_ORDER, _CLASSES, _AUGMENT, _CAPTION = range(4)
_SHUFFLE_ROUNDS = 4
# A record that cannot be read is replaced by the next readable one (on_bad_record="skip").
_MAX_REPLACEMENTS = 100


def rng(*words: int) -> np.random.Generator:
    """A generator seeded by the integers `words` (e.g. seed, stream, position)."""
    return np.random.default_rng(np.random.SeedSequence([int(w) for w in words]))


class Examples:
    """One split's records as model inputs (`len(examples)` of them, in record order)."""

    def __init__(self, data: DataSettings, metadata: records.Metadata, split: str, class_range=None):
        self.data = data
        self.metadata = metadata
        self.records = records.RecordSet(metadata, split)
        self.tokenizer = tokenizers.load(data.tokenizer)
        self.kept = None  # record numbers in the class range; None: all
        if class_range is not None:
            if not metadata.has("label"):
                raise DataError(f"a class range was given but {data.display_name} has no labels.")
            labels = self.records.labels()
            self.kept = np.flatnonzero((labels >= class_range[0]) & (labels < class_range[1]))
        if len(self) == 0:
            raise DataError(f"split {split!r} of {data.display_name} (classes {class_range}) is empty.")

    def __len__(self) -> int:
        return len(self.records) if self.kept is None else len(self.kept)

    def labels(self) -> np.ndarray:
        """int32 [len(self)]: each example's label."""
        labels = self.records.labels()
        return labels if self.kept is None else labels[self.kept]

    def record(self, i: int) -> dict:
        """Example `i`'s record, decoded; DataError naming the shard and record."""
        number = int(i if self.kept is None else self.kept[i])
        try:
            return records.decode(self.records.read(number))
        except DataError:
            raise
        except Exception as e:
            shard, position = self.records.where(number)
            raise DataError(f"{shard}, record {position}: cannot be read ({e}); {_FIX}") from None

    def inputs(self, i: int, position: int | None = None) -> dict[str, np.ndarray]:
        """Example `i`'s model inputs: `a`, `b` (pairs, views), `label`, the id keys.

        `position` (the row's number in the stream) seeds the augmentation and the caption
        drawn; None: evaluation (no augmentation, the first caption).
        """
        example = self.record(i)
        try:
            return self._inputs(example, position)
        except ValueError as e:
            shard, record = self.records.where(int(i if self.kept is None else self.kept[i]))
            raise DataError(f"{shard}, record {record}: {e}; {_FIX}") from None

    def _inputs(self, example: dict, position: int | None) -> dict[str, np.ndarray]:
        data, meta = self.data, self.metadata
        out = {"label": np.int32(example["label"])} if meta.has("label") else {}
        out |= {key: np.int32(example[key]) for key in meta.id_keys}
        if meta.has("sequence"):  # sequence pairs: two token sequences, nothing to augment
            ids = np.asarray(example["sequence"][: data.text_max_length], np.int32) + 1
            sequence = np.pad(ids, (0, data.text_max_length - len(ids)))
            return out | {"a": self.tokenizer.encode(example["text"], data.text_max_length), "b": sequence}
        image = images.decode(example["image"], meta.image_channels, data.image_size)
        if position is None or not augments(data):
            first = images.to_array(images.resized(image, data.image_size)).astype(np.float32) / 255.0
        else:
            augment_rng = rng(data.seed, _AUGMENT, position)
            first = images.augmented(image, data.image_size, data.augment, augment_rng)
            if data.task == "views":
                return out | {"a": first, "b": images.augmented(image, data.image_size, data.augment, augment_rng)}
        if data.task == "views":  # evaluation: the image once
            return out | {"a": first}
        if data.task == "pairs" and meta.has("captions"):
            captions = example["captions"]
            if not captions or not all(c.strip() for c in captions):
                raise ValueError("an empty caption")
            chosen = 0 if position is None else int(rng(data.seed, _CAPTION, position).integers(len(captions)))
            return out | {"a": first, "b": self.tokenizer.encode(captions[chosen], data.text_max_length)}
        if data.task == "pairs":  # an image alone: its top and bottom halves
            half = first.shape[0] // 2
            return out | {"a": first[:half], "b": first[half:]}
        return out | {"a": first}

    def inputs_or_replacement(self, i: int, position: int | None) -> tuple[dict[str, np.ndarray], int]:
        """`(inputs, skipped)`: example `i`'s inputs, or with `on_bad_record="skip"` those
        of the next readable example (`skipped` records passed over); the choice depends
        on the records alone, so every run skips the same ones."""
        for skipped in range(_MAX_REPLACEMENTS):
            try:
                return self.inputs((i + skipped) % len(self), position), skipped
            except DataError as e:
                if self.data.on_bad_record == "stop":
                    raise DataError(f"{e} (or set config.data.on_bad_record='skip')") from None
        raise DataError(f"{_MAX_REPLACEMENTS} records in a row from example {i} cannot be read; rewrite the set.")


_FIX = "rewrite it with `write_records`, which reports and leaves out bad inputs"


def stack(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Rows of `Examples.inputs` as arrays [B, ...]; DataError when image sizes differ."""
    try:
        return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
    except ValueError:
        shapes = sorted({str(row["a"].shape) for row in rows})
        raise DataError(
            f"the images have different sizes ({', '.join(shapes[:3])}); set config.data.image_size."
        ) from None


class BatchReader:
    """`reader(step)`: this process's rows `rows` of global batch `step`, as NumPy arrays
    [B, ...] with `index` (each example's number in the split) and, under
    `on_bad_record="skip"`, `skipped_records` (the count passed over; the loop pops it)."""

    def __init__(self, examples: Examples, rows: slice):
        self.examples = examples
        self.rows = rows
        data = examples.data
        self.size, self.seed = data.global_batch_size, data.seed
        self.members = None
        if data.task == "labeled":
            self.members = self._class_members(examples.labels(), data.examples_per_class)

    def _class_members(self, labels: np.ndarray, m: int) -> list[np.ndarray]:
        classes = np.unique(labels)
        members = [np.flatnonzero(labels == c) for c in classes]
        needed = self.size // m
        if needed > len(classes):
            raise DataError(
                f"a batch of {self.size} with config.data.examples_per_class={m} needs {needed} classes but the "
                f"split has {len(classes)}; raise examples_per_class or lower the global batch size."
            )
        smallest = min(range(len(classes)), key=lambda c: len(members[c]))
        if len(members[smallest]) < m:
            raise DataError(
                f"class {classes[smallest]} has {len(members[smallest])} examples, fewer than "
                f"config.data.examples_per_class={m}; lower examples_per_class."
            )
        return members

    def indices(self, step: int) -> np.ndarray:
        """int64 [rows]: the examples of this process's rows of batch `step`."""
        positions = step * self.size + np.arange(self.size)[self.rows]
        if self.members is not None:  # N / m classes, m distinct examples of each
            m = self.examples.data.examples_per_class
            draw = rng(self.seed, _CLASSES, step)
            chosen = draw.permutation(len(self.members))[: self.size // m]
            picked = np.concatenate([draw.choice(self.members[c], m, replace=False) for c in chosen])
            return picked[self.rows]
        n = len(self.examples)
        # Element i is at position i mod n of epoch i // n's permutation.
        return np.array(
            [
                grain_experimental.index_shuffle(
                    index=int(p % n), max_index=n - 1, seed=_epoch_seed(self.seed, p // n), rounds=_SHUFFLE_ROUNDS
                )
                for p in positions
            ],
            np.int64,
        )

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        positions = step * self.size + np.arange(self.size)[self.rows]
        rows, skipped = [], 0
        for i, position in zip(self.indices(step), positions):
            inputs, passed = self.examples.inputs_or_replacement(int(i), int(position))
            rows.append(inputs | {"index": np.int32((i + passed) % len(self.examples))})
            skipped += passed
        batch = stack(rows)
        if self.examples.data.on_bad_record == "skip":
            batch["skipped_records"] = np.int32(skipped)
        return batch


def _epoch_seed(seed: int, epoch: int) -> int:
    return int(np.random.SeedSequence([seed, _ORDER, int(epoch)]).generate_state(1)[0] >> 1)
