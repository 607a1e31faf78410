"""The input pipeline: deterministic, seekable batches streamed from record sets with grain.

Every function here takes `settings.DataSettings` (plain values read from
`config.data` once, by `run_plan.build`: `run_plan.data_settings`), never a config.

Tasks (`DataSettings.task`):

* `pairs`: two modalities per example for a two-tower model. Image-only datasets give the
  top half (`a`) and the bottom half (`b`) of each image; image-text datasets give the
  image (`a`) and one of its captions, drawn per visit, as tokens (`b`, the
  `config.data.tokenizer`'s); sequence-pair datasets (`cmudict`) give two token
  sequences: the text's tokens (`a`) and the sequence's ids + 1 (`b`), both int32
  [B, text_max_length], 0-padded (the encoders take `tokens > 0` as the mask), plus the
  grouping ids (`word_id`, `pronunciation_id` [B]) that mark false negatives and score
  retrieval.
* `views`: two random augmentations (`a`, `b`) of one image (SimCLR).
* `labeled`: one (augmented) image `a` with its `label`; each batch holds
  `examples_per_class` (m) examples of each of B / m classes.

Design. Every global batch is a pure function of `(seed, step)`: element `i = step * N + k`
of the stream is the example at position `i mod n` of epoch `i // n`'s permutation
(grain's `index_shuffle`, a stateless permutation computed per element, so nothing of
size n is held), augmented and given a caption with random draws seeded by `i`. Process
`p` of `P` reads only rows `[p * B, (p + 1) * B)` (B = N / P) of each batch from disk, so
2 processes x 4 devices see exactly what 1 process x 8 devices sees, and memory and
start-up time do not depend on the dataset's size. Records are read at random positions
of ArrayRecord shards; decoding and augmentation run in `config.data.num_workers` grain
worker processes (0: threads of this process), `prefetch_batches` ahead of the step.

So the input position is just the step count: `train_dataset(data, start_step=s)`
yields exactly the batches an uninterrupted run sees from step `s` on, with no replay,
and a checkpoint only needs the step (see `batch_numbering`, which numbers the batches).
A batch that changes size (`config.train.batch_schedule`) starts a stream at the
examples read before it (`start_example`), so the stream position counts examples.

Batches are NumPy dicts of per-process arrays [B, ...]; the trainer assembles global
arrays with `jax.make_array_from_process_local_data`.
"""

from collections.abc import Iterator

import grain
import jax
import numpy as np
from absl import flags

from contrastive_jax.data import mixture as mixing
from contrastive_jax.data import reader, records, settings
from contrastive_jax.data.settings import DataSettings, per_process_batch_size
from contrastive_jax.errors import ConfigError

# The stream's last step: grain's datasets have a length; no run gets near it.
_LAST_STEP = 2**62
# Examples decoded per chunk of an evaluation split.
_EVAL_CHUNK = 1024


class TrainStream:
    """This process's rows of the global batches from `start_step` on (iterate it).

    Attributes:
      element_spec: `jax.ShapeDtypeStruct` [B, ...] of each array of a batch (B = the
        per-process batch), `skipped_records` left out.
    """

    def __init__(
        self,
        data: DataSettings,
        *,
        start_step: int,
        process_index: int,
        process_count: int,
        global_batch_size: int | None = None,
        start_example: int | None = None,
    ):
        size = data.global_batch_size if global_batch_size is None else global_batch_size
        batch_size = per_process_batch_size(size, process_count)
        sources = training_sources(data)
        mixture = source_mixture(data, sources)
        if data.task != "labeled":
            _check_batch_within_sets(data, size, sources)
        rows = slice(process_index * batch_size, (process_index + 1) * batch_size)
        offset = start_step * size if start_example is None else start_example
        self.reader = reader.BatchReader(
            sources, rows, size=size, first_example=offset, first_batch=start_step, mixture=mixture
        )
        self.mixture = mixture  # None: one record set
        examples = sources[0]
        self.data, self.start_step = data, start_step
        visit = self.reader.visits(start_step)[0]
        first, _ = examples.inputs_or_replacement(0, visit, examples.read([0])[0])
        first = reader.stack([first]) | {"index": np.zeros(1, np.int32)}
        colour = self.reader.changes_colours  # then `reader` makes the uint8 images float32

        def dtype(value):
            return np.float32 if colour and value.dtype == np.uint8 else value.dtype

        self.element_spec = {
            key: jax.ShapeDtypeStruct((batch_size, *value.shape[1:]), dtype(value)) for key, value in first.items()
        }

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        steps = grain.MapDataset.range(self.start_step, _LAST_STEP).map(self.reader)
        workers, prefetch = self.data.num_workers, self.data.prefetch_batches
        batches = steps.to_iter_dataset(
            grain.ReadOptions(num_threads=1 if workers else 2, prefetch_buffer_size=prefetch)
        )
        if workers:
            if not flags.FLAGS.is_parsed():  # grain's workers read its absl flags (main parses them)
                flags.FLAGS.mark_as_parsed()
            batches = batches.mp_prefetch(
                grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=prefetch)
            )
        return _one_line_errors(iter(batches))


def _check_batch_within_sets(data: DataSettings, size: int, sources: list[reader.Examples]) -> None:
    """ConfigError when a batch of `size` rows (`size / captions_per_image` examples) would
    hold an example twice: more of a set's (its share of the mixture, rounded up) than its
    training split has."""
    weights = np.asarray(data.mixture_weights or (1.0,), np.float64)
    for source, weight in zip(sources, weights / weights.sum()):
        if (drawn := int(np.ceil(size // data.captions_per_image * weight))) > len(source):
            field = "global_batch_size" if size == data.global_batch_size else "batch_schedule's stage"
            share = (
                f"draws {drawn} examples a batch from {source.data.display_name}, more"
                if len(sources) > 1
                else "is larger"
            )
            raise ConfigError(
                f"config.train.{field}={size} {share} than the {len(source)} examples of split "
                f"{data.train_split!r}, so a batch would repeat examples (false negatives); lower it."
            )


def _one_line_errors(batches: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """`batches`, with a bad record's DataError cut to its own line (grain appends a note)."""
    try:
        yield from batches
    except records.DataError as e:
        raise records.DataError(str(e).splitlines()[0]) from None


def train_dataset(
    data: DataSettings,
    *,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
    global_batch_size: int | None = None,
    start_example: int | None = None,
) -> TrainStream:
    """The infinite training stream from `start_step` on: this process's rows of each step.

    Element `k` of the returned stream is process `process_index`'s slice (rows
    `[p * B, (p + 1) * B)`) of the global batch of step `start_step + k`, identical to
    what a run started at step 0, with any number of processes, sees at that step.

    The stream counts examples: its batches hold `global_batch_size` examples each (None:
    `data.global_batch_size`), the first at stream position `start_example` (None:
    `start_step * global_batch_size`, a constant batch from step 0), so a batch is a pure
    function of the seed and the examples before it (`batch_numbering.Stages`).

    Returns:
      A `TrainStream` of dicts: `a` float32 [B, ...] (int32 [B, L] tokens for sequence
      pairs), `b` float32/int32 [B, ...] (pairs, views), `label` int32 [B] when the
      dataset has labels, the id keys int32 [B], and `index` int32 [B], each example's
      position in the split (SogCLR's per-example state) (B = per-process batch).
    """
    return TrainStream(
        data,
        start_step=start_step,
        process_index=process_index,
        process_count=process_count,
        global_batch_size=global_batch_size,
        start_example=start_example,
    )


def training_sources(data: DataSettings) -> list[reader.Examples]:
    """The training split (in `data.train_class_range`) of each record set the stream
    reads (`settings.training_sets`: a mixture's, or the one)."""
    return [
        reader.Examples(one, settings.open_metadata(one), data.train_split, data.train_class_range)
        for one in settings.training_sets(data)
    ]


def source_mixture(data: DataSettings, sources: list[reader.Examples]) -> mixing.Mixture | None:
    """The mixture of `data.mixture_records` (`sources`: their `training_sources`); None
    for one record set."""
    if not data.mixture_records:
        return None
    names = [mixing.source_name(directory) for directory in data.mixture_records]
    return mixing.Mixture(data.mixture_weights, [len(source) for source in sources], names)


def train_split_size(data: DataSettings) -> int:
    """The number of examples of `data.train_split` (in `data.train_class_range`), in
    every set of a mixture together (the `index` the batches number them by)."""
    return sum(map(len, training_sources(data)))


def num_examples(arrays: dict[str, np.ndarray]) -> int:
    """The number of examples in `eval_arrays`' arrays."""
    return len(next(iter(arrays.values())))


def eval_arrays(data: DataSettings, split: str, *, class_range: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """A whole evaluation split's model inputs, in record order, without augmentation
    (and the first caption of each image).

    Returns:
      `a` float32 [n, ...] (int32 tokens for sequence pairs); `b` [n, ...] for `pairs`;
      `label` int32 [n] when available; the id keys int32 [n].
    """
    examples = reader.Examples(data, settings.open_metadata(data), split, class_range)
    rows = grain.MapDataset.range(len(examples)).map(lambda i: examples.inputs(i))
    chunks = rows.batch(_EVAL_CHUNK, batch_fn=reader.stack).to_iter_dataset(grain.ReadOptions(num_threads=2))
    chunks = list(chunks)
    return {key: np.concatenate([chunk[key] for chunk in chunks]) for key in chunks[0]}


def eval_captions(data: DataSettings, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Every caption of an image-text split, tokenized as in training, and its image.

    Returns:
      `(tokens, image)`: `tokens` int32 [m, text_max_length], one row per caption (all
      of each image's, in record order); `image` int32 [m], the index in
      `eval_arrays(data, split)` of the image it describes.
    """
    examples = reader.Examples(data, settings.open_metadata(data), split)
    captions = [examples.captions(i) for i in range(len(examples))]
    image = np.repeat(np.arange(len(captions), dtype=np.int32), [len(c) for c in captions])
    tokens = examples.tokenizer.encode_batch([c for cs in captions for c in cs], data.text_max_length)
    return tokens.astype(np.int32), image
