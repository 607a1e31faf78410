"""Records to model inputs: which examples a step's batch holds, and each one's inputs.

`Examples` reads one split's records (optionally only the labels in a class range) and
turns a record into the model's inputs; `BatchReader` maps a step number to this
process's rows of that step's global batch. Both are plain picklable objects (grain's
worker processes receive them) and import neither JAX nor TensorFlow.

Every random choice is a counter-based draw (`stateless_random`) keyed by
`config.data.seed` and the row's position in the stream (`step * N + k` for a constant
batch N; the examples before the step + k under a batch schedule), so a batch is a pure
function of the seed and the examples consumed before it, whatever the number of
processes or workers. A mixture of record sets (`mixture.Mixture`) gives each position
its set and the set's own position, from which the set's epochs are read.
"""

import dataclasses
from collections.abc import Sequence

import numpy as np
from PIL import Image

from contrastive_jax.data import images, naflex_images, records, stateless_random, tokenizers
from contrastive_jax.data.mixture import Mixture
from contrastive_jax.data.records import DataError
from contrastive_jax.data.settings import DataSettings, augments

# Independent random streams of `config.data.seed` (set s's epochs' orders use _ORDER (s + 1) + epoch).
_CLASSES, _AUGMENT, _CAPTION, _NOISE, _ORDER = 1, 2, 3, 4, 1 << 32
_VIEWS = 2
# A record that cannot be read is replaced by the next readable one (on_bad_record="skip").
_MAX_REPLACEMENTS = 100
_FIX = "rewrite it with `write_records`, which reports and leaves out bad inputs"


@dataclasses.dataclass(frozen=True)
class Visit:
    """The random draws of one row of the stream (None for evaluation: no augmentation,
    the first caption)."""

    draws: np.ndarray  # float64 [_VIEWS, images.NUM_DRAWS]: crops, flips, jitter
    caption: float  # uniform in [0, 1): which caption (the image's first, of `captions_per_image`)
    slot: int = 0  # which of the image's `captions_per_image` rows: the caption `slot` after that one


class Examples:
    """One split's records as model inputs (`len(examples)` of them, in record order)."""

    def __init__(self, data: DataSettings, metadata: records.Metadata, split: str, class_range=None):
        self.data = data
        self.metadata = metadata
        name, rows = records.parse_split(split)
        self.records = records.RecordSet(metadata, name)
        self.tokenizer = tokenizers.load(data.tokenizer)
        self.kept = None  # the record numbers in the slice and the class range; None: all
        if rows != slice(None):
            self.kept = np.arange(len(self.records))[rows]
        if class_range is not None:
            if not metadata.has("label"):
                raise DataError(f"a class range was given but {data.display_name} has no labels.")
            labels = self.records.labels()
            in_range = np.flatnonzero((labels >= class_range[0]) & (labels < class_range[1]))
            self.kept = in_range if self.kept is None else np.intersect1d(self.kept, in_range)
        if len(self) == 0:
            raise DataError(f"split {split!r} of {data.display_name} (classes {class_range}) is empty.")

    def __len__(self) -> int:
        return len(self.records) if self.kept is None else len(self.kept)

    def labels(self) -> np.ndarray:
        """int32 [len(self)]: each example's label."""
        labels = self.records.labels()
        return labels if self.kept is None else labels[self.kept]

    def _record_number(self, i: int) -> int:
        return int(i if self.kept is None else self.kept[i])

    def read(self, indices) -> list[bytes]:
        """The record bytes of examples `indices` (int [k])."""
        return self.records.read_many([self._record_number(i) for i in indices])

    def inputs(self, i: int, visit: Visit | None = None, record: bytes | None = None) -> dict[str, np.ndarray]:
        """Example `i`'s model inputs: `a`, `b` (pairs, views), `label`, the id keys.

        Args:
          visit: the row's random draws; None: evaluation.
          record: example `i`'s record bytes if already read.

        Raises:
          DataError: the record cannot be read; the message names its shard and number.
        """
        number = self._record_number(i)
        try:
            example = records.decode(self.records.read(number) if record is None else record)
            return self._inputs(example, visit)
        except DataError:
            raise
        except Exception as e:  # a corrupt record: msgpack, PIL or a missing field
            shard, position = self.records.where(number)
            raise DataError(f"{shard}, record {position}: {e}; {_FIX}") from None

    def captions(self, i: int) -> list[str]:
        """Example `i`'s captions, all of them, in the record's order."""
        if not self.metadata.has("captions"):
            raise DataError(f"{self.data.display_name} has no captions.")
        return list(records.decode(self.records.read(self._record_number(i)))["captions"])

    def _inputs(self, example: dict, visit: Visit | None) -> dict[str, np.ndarray]:
        data, meta = self.data, self.metadata
        out = {"label": np.int32(example["label"])} if meta.has("label") else {}
        out |= {key: np.int32(example[key]) for key in meta.id_keys}
        if meta.has("sequence"):  # sequence pairs: two token sequences, nothing to augment
            ids = np.asarray(example["sequence"][: data.text_max_length], np.int32) + 1
            sequence = np.pad(ids, (0, data.text_max_length - len(ids)))
            return out | {"a": self.tokenizer.encode(example["text"], data.text_max_length), "b": sequence}
        image = images.decode(example["image"], meta.image_channels, data.image_size)
        views = [self._view(image, visit, v) for v in range(_VIEWS if data.task == "views" and visit else 1)]
        if data.task == "views":
            if visit is not None and meta.has("negatives"):  # training: the hard negatives, cropped as b [M, H, W, C]
                decoded = (images.decode(n, meta.image_channels, data.image_size) for n in example["negatives"])
                out["negatives"] = np.stack([self._view(negative, visit, 1) for negative in decoded])
            return out | dict(zip(("a", "b"), views))
        if data.task == "pairs" and meta.has("captions"):
            captions = example["captions"]
            if not captions or not all(c.strip() for c in captions):
                raise ValueError("an empty caption")
            chosen = 0 if visit is None else (int(visit.caption * len(captions)) + visit.slot) % len(captions)
            if visit is not None and meta.has("negatives"):  # training: the hard negatives' tokens [M, L]
                out["negatives"] = self.tokenizer.encode_batch(example["negatives"], data.text_max_length)
            return out | {"a": views[0], "b": self.tokenizer.encode(captions[chosen], data.text_max_length)}
        if data.task == "pairs":  # an image alone: its top and bottom halves
            half = views[0].shape[0] // 2
            return out | {"a": views[0][:half], "b": views[0][half:]}
        return out | {"a": views[0]}

    def _view(self, image, visit: Visit | None, view: int) -> np.ndarray:
        """uint8 [H, W, C]: the image as it is (evaluation), or cropped and flipped
        (`BatchReader` adds the colour jitter and noise to the whole batch); with NaFlex
        (`max_num_patches`), that image at its aspect ratio within the budget, packed
        (`naflex_images.packed_image`: uint8 [1 + max_num_patches, P * P * C])."""
        data = self.data
        if visit is None or not augments(data):
            if data.max_num_patches:
                return naflex_images.packed_image(image, data.patch_size, data.max_num_patches)
            return images.to_array(images.resized(image, data.image_size))
        pixels = images.augmented(image, data.image_size, data.augment, visit.draws[view])
        if data.max_num_patches:  # the crop (at the image's own size) and flip, then NaFlex's resize
            return naflex_images.packed_image(Image.fromarray(pixels), data.patch_size, data.max_num_patches)
        return pixels

    def inputs_or_replacement(self, i: int, visit: Visit, record: bytes) -> tuple[dict[str, np.ndarray], int]:
        """`(inputs, skipped)`: example `i`'s inputs, or with `on_bad_record="skip"` those
        of the next readable example (`skipped` records passed over); the choice depends
        on the records alone, so every run skips the same ones."""
        for skipped in range(_MAX_REPLACEMENTS):
            try:
                return self.inputs((i + skipped) % len(self), visit, record if skipped == 0 else None), skipped
            except DataError as e:
                if self.data.on_bad_record == "stop":
                    raise DataError(f"{e} (or set config.data.on_bad_record='skip')") from None
        raise DataError(f"{_MAX_REPLACEMENTS} records in a row from example {i} cannot be read; rewrite the set.")


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
    [B, ...] with `index` (each example's number in the sets' training splits, one after
    the other) and, under `on_bad_record="skip"`, `skipped_records` (the count passed
    over; the loop pops it).

    Batches of `size` examples each; batch `first_batch` starts at stream position
    `first_example`, each after it `size` further on. `sources`: the record sets read,
    one, or a mixture's, each position's set and own position given by `mixture`."""

    def __init__(
        self,
        sources: Sequence[Examples],
        rows: slice,
        *,
        size: int,
        first_example: int,
        first_batch: int,
        mixture: Mixture | None = None,
    ):
        self.sources, self.examples, self.mixture = tuple(sources), sources[0], mixture
        self.offsets = np.cumsum([0, *map(len, sources)])  # int64 [S + 1]: each set's first `index`
        self.rows = rows
        data = self.examples.data
        self.size, self.seed = size, data.seed
        self.first_example, self.first_batch = first_example, first_batch
        self.members = None
        if data.task == "labeled":
            self.members = _class_members(self.examples.labels(), self.size, data.examples_per_class)

    def positions(self, step: int) -> np.ndarray:
        """int64 [rows]: the stream positions of this process's rows of batch `step`."""
        return self.first_example + (step - self.first_batch) * self.size + np.arange(self.size)[self.rows]

    def image_positions(self, step: int) -> np.ndarray:
        """int64 [rows]: the position of each row's example in the stream of examples: its
        stream position, or with k = `captions_per_image` > 1 that // k (an image's k rows,
        its k captions, share its example, its augmentation and its `index`)."""
        return self.positions(step) // self.examples.data.captions_per_image

    def indices(self, step: int) -> np.ndarray:
        """int64 [rows]: the examples of this process's rows of batch `step` (numbered
        through the sets one after the other: set s's from `offsets[s]`)."""
        if self.members is not None:  # N / m classes, m distinct examples of each
            m = self.examples.data.examples_per_class
            draw = np.random.default_rng(np.random.SeedSequence([self.seed, _CLASSES, step]))
            chosen = draw.permutation(len(self.members))[: self.size // m]
            picked = np.concatenate([draw.choice(self.members[c], m, replace=False) for c in chosen])
            return picked[self.rows]
        positions = self.image_positions(step)
        sets, own = (np.zeros_like(positions), positions) if self.mixture is None else self.mixture.locate(positions)
        # A set's own element j is at position j mod n of its epoch j // n's permutation.
        out = np.empty(len(positions), np.int64)
        for s in np.unique(sets):
            n, epochs = len(self.sources[s]), own // len(self.sources[s])
            for epoch in np.unique(epochs[sets == s]):
                where = (sets == s) & (epochs == epoch)
                stream = _ORDER * (int(s) + 1) + int(epoch)
                out[where] = self.offsets[s] + stateless_random.permute(own[where] % n, n, self.seed, stream)
        return out

    def visits(self, step: int) -> list[Visit]:
        """The random draws of this process's rows of batch `step`: each row's
        augmentation draws [_VIEWS, images.NUM_DRAWS], caption draw and caption slot."""
        positions, k = self.image_positions(step), self.examples.data.captions_per_image
        counters = positions[:, None] * (_VIEWS * images.NUM_DRAWS) + np.arange(_VIEWS * images.NUM_DRAWS)
        draws = stateless_random.uniform(self.seed, _AUGMENT, counters).reshape(len(positions), _VIEWS, -1)
        captions = stateless_random.uniform(self.seed, _CAPTION, positions)
        return [Visit(d, float(c), int(p % k)) for d, c, p in zip(draws, captions, self.positions(step))]

    def _read(self, indices: np.ndarray) -> list[tuple[Examples, int, bytes]]:
        """`(set, its example, the record's bytes)` of each example of `indices` (int64 [k]):
        one read per set."""
        sets = np.searchsorted(self.offsets, indices, side="right") - 1
        out: list = [None] * len(indices)
        for s in np.unique(sets):
            where = np.flatnonzero(sets == s)
            own = indices[where] - self.offsets[s]
            for k, i, record in zip(where, own, self.sources[s].read(own)):
                out[k] = (self.sources[s], int(i), record)
        return out

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        indices, visits = self.indices(step), self.visits(step)
        rows, skipped = [], 0
        for index, visit, (source, i, record) in zip(indices, visits, self._read(indices)):
            inputs, passed = source.inputs_or_replacement(i, visit, record)
            number = index - i + (i + passed) % len(source)  # its set's first index + the example read
            rows.append(inputs | {"index": np.int32(number)})
            skipped += passed
        batch = self._photometric(stack(rows), step, visits)
        if self.examples.data.on_bad_record == "skip":
            batch["skipped_records"] = np.int32(skipped)
        return batch

    @property
    def changes_colours(self) -> bool:
        """Whether training images become float32 (colour jitter or noise); else uint8."""
        data = self.examples.data
        return augments(data) and images.changes_colours(data.augment) and not self.examples.metadata.has("sequence")

    def _photometric(self, batch: dict[str, np.ndarray], step: int, visits: list[Visit]) -> dict[str, np.ndarray]:
        """The batch with its images' colour jitter and pixel noise (`images.photometric`,
        float32), when the augmentation has any; else the images stay uint8. Image `key`
        of the row at position p gets noise draws (p, pixel) of its own stream; its j-th of
        M hard-negative images (p M + j, pixel) of theirs, and the b view's jitter."""
        data = self.examples.data
        if not self.changes_colours:
            return batch
        positions, draws = self.image_positions(step).astype(np.uint64), np.stack([visit.draws for visit in visits])
        for stream, key in enumerate(k for k in ("a", "b", "negatives") if k in batch and batch[k].dtype == np.uint8):
            shape = batch[key].shape  # hard negatives: [N, M, H, W, C], M images a row
            pictures = batch[key].reshape(-1, *shape[-3:])
            copies = len(pictures) // len(positions)
            size = int(np.prod(pictures.shape[1:]))
            noise = None
            if data.augment.noise_std > 0:
                ids = (positions[:, None] * np.uint64(copies) + np.arange(copies, dtype=np.uint64)).ravel()
                counters = ids[:, None] * np.uint64(size) + np.arange(size, dtype=np.uint64)
                noise = stateless_random.normal(self.seed, _NOISE + stream, counters).reshape(pictures.shape)
            view = min(stream, 1) if data.task == "views" else 0  # halves of one image: its draws; negatives: b's
            view_draws = np.repeat(draws[:, view], copies, axis=0)
            batch[key] = images.photometric(pictures, data.augment, view_draws, noise).reshape(shape)
        return batch


def _class_members(labels: np.ndarray, batch_size: int, m: int) -> list[np.ndarray]:
    """The examples of each class; DataError when a batch cannot hold m of N / m classes."""
    classes = np.unique(labels)
    members = [np.flatnonzero(labels == c) for c in classes]
    needed = batch_size // m
    if needed > len(classes):
        raise DataError(
            f"a batch of {batch_size} with config.data.examples_per_class={m} needs {needed} classes but the "
            f"split has {len(classes)}; raise examples_per_class or lower the global batch size."
        )
    smallest = min(range(len(classes)), key=lambda c: len(members[c]))
    if len(members[smallest]) < m:
        raise DataError(
            f"class {classes[smallest]} has {len(members[smallest])} examples, fewer than "
            f"config.data.examples_per_class={m}; lower examples_per_class."
        )
    return members
