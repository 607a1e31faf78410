"""tf.data input pipeline: deterministic, seekable batches for the three training tasks.

Every function here takes `data_sources.DataSettings` (plain values read from
`config.data` once, by `trainer.build` or `DataSettings.from_config`), never a config.

Tasks (`DataSettings.task`):

* `pairs`: two modalities per example for a two-tower model. Image-only datasets give the
  top half (`a`) and the bottom half (`b`) of each image; image-text datasets give the
  image (`a`) and its first caption as byte tokens (`b`); sequence-pair datasets
  (`cmudict`) give two token sequences: the spelling's characters as byte tokens (`a`)
  and the pronunciation's phoneme ids + 1 (`b`), both int32 [B, text_max_length],
  0-padded (the encoders take `tokens > 0` as the mask), plus the grouping ids
  (`word_id`, `pronunciation_id` [B]) that mark false negatives and score retrieval.
* `views`: two random augmentations (`a`, `b`) of one image (SimCLR).
* `labeled`: one (augmented) image `a` with its `label`; each batch holds
  `examples_per_class` (m) examples of each of B / m classes.

Design. The split is decoded once into host memory; every global batch is then a pure
function of `(seed, step)`, and process `p` of `P` takes rows
`[p * B, (p + 1) * B)` of it (B = N / P, the per-process batch). The global batch, and
so the training run, is the same whatever the number of processes: 2 processes x 4
devices see exactly what 1 process x 8 devices sees.

* `pairs`/`views`: element `i` of the stream (`i = step * N + k`) is the example at
  position `i mod n` of epoch `i // n`'s permutation (`tf.random.experimental
  .index_shuffle`, a stateless permutation computed per element).
* `labeled`: the classes and examples of step `s` are drawn with stateless RNG seeded by
  `s`.
* Augmentations use stateless ops seeded by the element number `i`.

So the input position is just the step count: `train_dataset(data, start_step=s)`
yields exactly the batches an uninterrupted run sees from step `s` on, with no replay,
and a checkpoint only needs the step (see `train.py`). The cost of the design is that the
split must fit in each host's memory (digits, CIFAR, CUB, Cars at the configured image
size): every process decodes the whole split, because the rows it takes at a step can be
any examples. Each process only gathers and augments its own B rows.

Batches are NumPy dicts of per-process arrays [B, ...]; the trainer assembles global
arrays with `jax.make_array_from_process_local_data`.
"""

from collections.abc import Mapping

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

import contrastive_jax.datasets  # noqa: F401  (registers the local datasets with tfds)
from contrastive_jax.config_lib import ConfigError
from contrastive_jax.data_sources import SOURCES, Augment, DataSettings, augments, per_process_batch_size


def load_split(
    data: DataSettings,
    split: str,
    *,
    class_range: tuple[int, int] | None = None,
) -> dict[str, np.ndarray]:
    """Reads a TFDS split into host memory.

    Args:
      data: the data settings (`name`, `data_dir`, `image_size`, `text_max_length` are read).
      split: a TFDS split string, e.g. "train", "train+test", "test[:50%]".
      class_range: keep only the examples whose label is in `[lo, hi)`.

    Returns:
      `image` uint8 [n, H, W, C] for image datasets; `label` int32 [n] when the dataset
      has labels; `text` int32 [n, text_max_length] byte tokens when it has captions or
      sequence pairs (the spelling); `sequence` int32 [n, text_max_length] class ids + 1
      for sequence pairs (the phonemes); the source's `id_keys` int32 [n]. Tokens are
      0-padded.
    """
    source = SOURCES[data.name]
    builder = tfds.builder(data.name, data_dir=data.data_dir)
    builder.download_and_prepare()
    ds = builder.as_dataset(split=split, shuffle_files=False)

    def decode(example):
        out = {}
        if source.image_key:
            image = example[source.image_key]
            if data.image_size:
                image = tf.image.resize(image, [data.image_size, data.image_size], antialias=True)
                image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
            out["image"] = image
        if source.label_key:
            out["label"] = tf.cast(example[source.label_key], tf.int32)
        if source.caption_key:
            captions = example
            for key in source.caption_key:
                captions = captions[key]
            first = tf.concat([captions, [""]], axis=0)[0]
            out["text"] = _byte_tokens(first, data.text_max_length)
        if source.sequence_keys:
            text_key, ids_key = source.sequence_keys
            out["text"] = _byte_tokens(example[text_key], data.text_max_length)
            ids = tf.cast(example[ids_key][: data.text_max_length], tf.int32) + 1
            padded = tf.pad(ids, [[0, data.text_max_length - tf.shape(ids)[0]]])
            out["sequence"] = tf.ensure_shape(padded, [data.text_max_length])
        for key in source.id_keys:
            out[key] = tf.cast(example[key], tf.int32)
        return out

    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if class_range is not None:
        if not source.label_key:
            raise ConfigError(f"a class range was given but config.data.name={data.name!r} has no labels.")
        lo, hi = class_range
        ds = ds.filter(lambda ex: (ex["label"] >= lo) & (ex["label"] < hi))
    chunks = list(tfds.as_numpy(ds.batch(4096)))
    if not chunks:
        raise ConfigError(f"split {split!r} of {data.name!r} (classes {class_range}) is empty.")
    return {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}


def _byte_tokens(text: tf.Tensor, length: int) -> tf.Tensor:
    """A string's UTF-8 bytes as tokens `1 + byte`, truncated / 0-padded to [length]."""
    tokens = tf.cast(tf.io.decode_raw(text, tf.uint8, fixed_length=length), tf.int32)
    return tf.where(tokens > 0, tokens + 1, 0)


def _augment(image: tf.Tensor, seed: tf.Tensor, aug: Augment) -> tf.Tensor:
    """Stateless random augmentation of one float image [H, W, C] in [0, 1]."""
    seeds = tf.random.experimental.stateless_split(seed, 5)
    shape = image.shape
    height, width = shape[0], shape[1]
    if aug.crop_min_area < 1.0:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.shape(image),
            bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
            seed=seeds[0],
            min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(aug.crop_min_area, 1.0),
            use_image_if_no_bounding_boxes=True,
        )
        image = tf.slice(image, begin, size)
        image = tf.image.resize(image, [height, width], antialias=True)
    if aug.flip:
        image = tf.image.stateless_random_flip_left_right(image, seeds[1])
    if aug.color_jitter > 0:
        s = aug.color_jitter
        image = tf.image.stateless_random_brightness(image, 0.8 * s, seeds[2])
        image = tf.image.stateless_random_contrast(image, 1 - 0.8 * s, 1 + 0.8 * s, seeds[3])
    if aug.noise_std > 0:
        image = image + aug.noise_std * tf.random.stateless_normal(tf.shape(image), seeds[4])
    return tf.ensure_shape(tf.clip_by_value(image, 0.0, 1.0), shape)


def _model_inputs(examples, data: DataSettings, seeds=None):
    """A batch's model inputs; augmented when `seeds` ([B, 2] int64, one per example) is given.

    Args:
      examples: `image` uint8 [B, H, W, C], optional `label` [B] and `text` [B, L]; or,
        for sequence pairs, `text` and `sequence` [B, L] and the source's id keys.
    """
    if "sequence" in examples:  # sequence pairs: no images, nothing to augment
        return {"a": examples["text"], "b": examples["sequence"]} | {
            key: value for key, value in examples.items() if key not in ("text", "sequence")
        }
    images = tf.cast(examples["image"], tf.float32) / 255.0

    def augment(images, seeds):
        return tf.map_fn(
            lambda args: _augment(args[0], args[1], data.augment),
            (images, seeds),
            fn_output_signature=tf.float32,
        )

    out = {}
    if data.task == "views":
        if seeds is None:
            out["a"] = images
        else:
            split = tf.map_fn(tf.random.experimental.stateless_split, seeds)  # [B, 2, 2]
            out["a"] = augment(images, split[:, 0])
            out["b"] = augment(images, split[:, 1])
    else:
        if seeds is not None:
            images = augment(images, seeds)
        if data.task == "pairs" and "text" in examples:
            out["a"], out["b"] = images, examples["text"]
        elif data.task == "pairs":
            half = images.shape[1] // 2
            out["a"], out["b"] = images[:, :half], images[:, half:]
        else:
            out["a"] = images
    if "label" in examples:
        out["label"] = examples["label"]
    return out


def _labeled_indices(labels: np.ndarray, batch_size: int, m: int, seed: tf.Tensor):
    """Returns step -> [N] example indices: N / m classes, m distinct examples of each."""
    classes, counts = np.unique(labels, return_counts=True)
    num_classes_per_batch = batch_size // m  # a whole number (data_sources.check_data_config)
    if num_classes_per_batch > len(classes):
        raise ConfigError(
            f"a batch of {batch_size} with config.data.examples_per_class={m} needs "
            f"{num_classes_per_batch} classes but the split has {len(classes)}; raise "
            "examples_per_class or lower the global batch size."
        )
    if counts.min() < m:
        raise ConfigError(
            f"class {classes[counts.argmin()]} has {counts.min()} examples, fewer than "
            f"config.data.examples_per_class={m}; lower examples_per_class."
        )
    members = np.full((len(classes), counts.max()), -1, np.int64)
    for row, c in enumerate(classes):
        where = np.flatnonzero(labels == c)
        members[row, : len(where)] = where
    members = tf.constant(members)
    valid = members >= 0

    def indices(step):
        step_seed = tf.random.experimental.stateless_fold_in(seed, step)
        class_seed, example_seed = tf.unstack(tf.random.experimental.stateless_split(step_seed))
        chosen = tf.argsort(tf.random.stateless_uniform([len(classes)], class_seed))
        chosen = chosen[:num_classes_per_batch]
        keys = tf.random.stateless_uniform([num_classes_per_batch, members.shape[1]], example_seed)
        keys = tf.where(tf.gather(valid, chosen), keys, 2.0)  # padding sorts last
        columns = tf.argsort(keys, axis=1)[:, :m]
        picked = tf.gather(tf.gather(members, chosen), columns, batch_dims=1)
        return tf.reshape(picked, [batch_size])

    return indices


def train_split_size(data: DataSettings) -> int:
    """The number of examples of `data.train_split` (TFDS metadata; the dataset
    is prepared if it is not yet, nothing is decoded). With a class range, an upper
    bound on the examples kept."""
    builder = tfds.builder(data.name, data_dir=data.data_dir)
    builder.download_and_prepare()
    return builder.info.splits[data.train_split].num_examples


def num_examples(arrays: Mapping[str, np.ndarray]) -> int:
    """The number of examples in `load_split`'s (or `eval_arrays`') arrays."""
    return len(next(iter(arrays.values())))


def train_dataset(
    data: DataSettings,
    *,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
) -> tf.data.Dataset:
    """The infinite training stream from `start_step` on: this process's rows of each step.

    Element `k` of the returned dataset is process `process_index`'s slice (rows
    `[p * B, (p + 1) * B)`) of the global batch of step `start_step + k`, identical to
    what a run started at step 0, with any number of processes, sees at that step.

    Returns:
      A dataset of dicts: `a` float32 [B, ...] (int32 [B, L] tokens for sequence pairs),
      `b` float32/int32 [B, ...] (pairs, views), `label` int32 [B] when the dataset has
      labels, the source's id keys int32 [B], and `index` int32 [B], each example's
      position in the loaded split (SogCLR's per-example state) (B = per-process batch).
    """
    global_batch_size = data.global_batch_size
    batch_size = per_process_batch_size(global_batch_size, process_count)
    arrays = load_split(data, data.train_split, class_range=data.train_class_range)
    n = num_examples(arrays)
    tensors = {key: tf.constant(value) for key, value in arrays.items()}
    order_seed, step_seed, augment_seed = tf.unstack(
        tf.random.experimental.stateless_split(tf.constant([data.seed, 0], tf.int64), 3)
    )

    if data.task == "labeled":
        if "label" not in arrays:
            raise ConfigError(
                f"config.data.task='labeled' needs labels but {data.name!r} has none; use task 'pairs' or 'views'."
            )
        global_indices = _labeled_indices(arrays["label"], global_batch_size, data.examples_per_class, step_seed)
    else:
        if global_batch_size > n:
            raise ConfigError(
                f"config.train.global_batch_size={global_batch_size} is larger than the {n} "
                f"examples of split {data.train_split!r}, so a batch would repeat examples "
                "(false negatives); lower config.train.global_batch_size."
            )

        def global_indices(step):
            # Element i is at position i mod n of epoch i // n's permutation; a batch of
            # N <= n elements spans at most two epochs.
            ids = step * global_batch_size + tf.range(global_batch_size, dtype=tf.int64)
            first_epoch = ids[0] // n
            perms = [
                tf.random.experimental.index_shuffle(
                    ids % n,
                    tf.random.experimental.stateless_fold_in(order_seed, epoch),
                    max_index=n - 1,
                )
                for epoch in (first_epoch, first_epoch + 1)
            ]
            return tf.where(ids // n == first_epoch, perms[0], perms[1])

    rows = slice(process_index * batch_size, (process_index + 1) * batch_size)

    def batch(step):
        index = global_indices(step)[rows]
        examples = {key: tf.gather(t, index) for key, t in tensors.items()}
        ids = step * global_batch_size + tf.range(global_batch_size, dtype=tf.int64)[rows]
        seeds = tf.map_fn(
            lambda i: tf.random.experimental.stateless_fold_in(augment_seed, i),
            ids,
            fn_output_signature=tf.int64,
        )
        inputs = _model_inputs(examples, data, seeds=seeds if augments(data) else None)
        return inputs | {"index": tf.cast(index, tf.int32)}

    ds = tf.data.Dataset.counter(start_step).map(batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options).prefetch(data.prefetch_batches)


def eval_arrays(data: DataSettings, split: str, *, class_range: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """A whole evaluation split's model inputs, in a fixed order, without augmentation.

    Returns:
      `a` float32 [n, ...] (int32 tokens for sequence pairs); `b` [n, ...] for `pairs`;
      `label` int32 [n] when available; the source's id keys int32 [n].
    """
    arrays = load_split(data, split, class_range=class_range)
    ds = tf.data.Dataset.from_tensor_slices(arrays)
    ds = ds.batch(4096).map(lambda ex: _model_inputs(ex, data))
    chunks = list(tfds.as_numpy(ds))
    return {key: np.concatenate([c[key] for c in chunks]) for key in chunks[0]}
