"""The datasets the pipeline reads, the settings it reads them with, and the rules those
settings must follow (no TensorFlow).

`SOURCES` says where each dataset's fields live; `DataSettings.from_config` reads
`config.data` (and the global batch size) once into plain values, the only thing
`input_pipeline` is given; `check_data_config` rejects settings the pipeline cannot
serve, with one line naming the fix. The trainer's checks read this module, so they run
before TensorFlow is imported; `input_pipeline` reads the data itself.
"""

import dataclasses
from collections.abc import Mapping

import ml_collections

from contrastive_jax.config_lib import ConfigError, group_values

TASKS = ("pairs", "views", "labeled")
# Byte-level text tokens: 1 + the UTF-8 byte value; 0 pads. No vocabulary file needed.
TEXT_VOCAB_SIZE = 257


@dataclasses.dataclass(frozen=True)
class Source:
    """Where the fields live in a TFDS dataset's examples."""

    image_key: str | None = "image"  # None: no images (a sequence-pair dataset).
    label_key: str | None = "label"  # None: the dataset has no class labels.
    caption_key: tuple[str, ...] | None = None  # Path to a [num_captions] string tensor.
    # Sequence pairs: a string feature (tower a reads its bytes) and a sequence of class
    # ids (tower b reads id + 1), e.g. a spelling and its phonemes.
    sequence_keys: tuple[str, str] | None = None
    # Integer features carried into batches and evaluation arrays as they are.
    id_keys: tuple[str, ...] = ()
    # Paired retrieval: the id feature that says which gallery items answer a query,
    # a -> b and b -> a (item j answers query i when their ids are equal); None: only
    # item i answers query i.
    match_keys: tuple[str, str] | None = None
    max_text_length: int = 0  # The longest text / sequence; text_max_length must hold it.


# The datasets the pipeline knows how to read; add a line to support another one.
SOURCES: Mapping[str, Source] = {
    "sklearn_digits": Source(),
    "cifar10": Source(),
    "cifar100": Source(),
    "caltech_birds2011": Source(),
    "cars196": Source(),
    "coco_captions": Source(label_key=None, caption_key=("captions", "text")),
    # Spelling -> pronunciation is right when the retrieved pronunciation is the query's
    # own string (homophones share a pronunciation_id); pronunciation -> spelling when
    # the retrieved spelling is (alternate pronunciations share a word_id).
    "cmudict": Source(
        image_key=None,
        label_key=None,
        sequence_keys=("word", "phonemes"),
        id_keys=("word_id", "pronunciation_id"),
        match_keys=("pronunciation_id", "word_id"),
        max_text_length=28,  # the longest spelling and pronunciation (tests/test_cmudict.py)
    ),
}


@dataclasses.dataclass(frozen=True)
class Augment:
    """Random augmentation of training images (`config.data.augment`, whose comments
    say what each field does and which value turns it off)."""

    crop_min_area: float
    flip: bool
    color_jitter: float
    noise_std: float


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """What the input pipeline reads and how, as plain values: `trainer.build` reads them
    from the config once (`from_config`). Each field is `config.data.<name>` (its comment
    in configs/default.py says what it does), but for `global_batch_size`
    (`config.train.global_batch_size`: the rows of a step's batch)."""

    name: str
    task: str
    global_batch_size: int
    data_dir: str | None
    train_split: str
    train_class_range: tuple[int, int] | None
    seed: int
    image_size: int | None
    text_max_length: int
    examples_per_class: int
    prefetch_batches: int
    augment: Augment

    @classmethod
    def from_config(cls, config: ml_collections.ConfigDict) -> "DataSettings":
        """The settings of `config` (the whole experiment config)."""
        data = config.data
        own = group_values(cls, data, besides={"global_batch_size", "augment", "train_class_range"})
        return cls(
            **own,
            global_batch_size=config.train.global_batch_size,
            train_class_range=None if data.train_class_range is None else tuple(data.train_class_range),
            augment=Augment(**data.augment.to_dict()),
        )


def per_process_batch_size(global_batch_size: int, process_count: int) -> int:
    """The number of examples each process reads per step."""
    if global_batch_size % process_count:
        raise ConfigError(
            f"config.train.global_batch_size={global_batch_size} does not divide over "
            f"{process_count} processes; use a multiple of {process_count}."
        )
    return global_batch_size // process_count


def augments(data: DataSettings) -> bool:
    """Whether training inputs are randomly augmented (always for "views")."""
    aug = data.augment
    active = aug.crop_min_area < 1.0 or aug.flip or aug.color_jitter > 0 or aug.noise_std > 0
    return active or data.task == "views"


def check_data_config(data: DataSettings) -> None:
    """Raises ConfigError for an unknown `config.data.task` or `config.data.name`, a
    "labeled" batch that is not whole classes of `examples_per_class`, and for
    settings a sequence-pair dataset cannot use (another task, image augmentations, a
    `text_max_length` that would truncate)."""
    if data.task not in TASKS:
        raise ConfigError(f"config.data.task={data.task!r} is not a task; use one of {TASKS}.")
    if data.name not in SOURCES:
        raise ConfigError(
            f"config.data.name={data.name!r} is not a known dataset; use one of "
            f"{sorted(SOURCES)} or add it to data_sources.SOURCES."
        )
    if data.task == "labeled" and data.global_batch_size % data.examples_per_class:
        raise ConfigError(
            f"config.train.global_batch_size={data.global_batch_size} is not a multiple of "
            f"config.data.examples_per_class={data.examples_per_class}; use a multiple of "
            f"{data.examples_per_class}."
        )
    source = SOURCES[data.name]
    if source.sequence_keys:
        if data.task != "pairs":
            raise ConfigError(
                f"config.data.name={data.name!r} holds sequence pairs; set "
                f"config.data.task='pairs' (not {data.task!r})."
            )
        if augments(data):
            raise ConfigError(
                f"config.data.augment applies to images and {data.name!r} has none; set "
                "config.data.augment.noise_std=0.0 (and crop_min_area=1.0, flip=False, "
                "color_jitter=0.0)."
            )
    if data.text_max_length < source.max_text_length:
        raise ConfigError(
            f"config.data.text_max_length={data.text_max_length} would truncate {data.name!r}, "
            f"whose longest text is {source.max_text_length} tokens; set it to at least "
            f"{source.max_text_length}."
        )
