"""The data a run reads, the settings it reads them with, and the rules those settings
must follow (no TensorFlow, no JAX).

A run reads a record set (`records`: ArrayRecord shards and their metadata), either the
user's own (`config.data.records=DIR`, written by `python -m contrastive_jax.write_records`)
or a built-in dataset (`config.data.name`), whose records the same writer writes under
`config.data.data_dir` before the run's config is checked (`writer.write_builtin`:
the training job runs it; nothing here writes).
`run_plan.data_settings` reads `config.data` (and the global batch size) once into
plain values, the only thing `input_pipeline` is given; `check_data_config` rejects
settings the pipeline cannot serve, with one line naming the fix.
"""

import dataclasses
import io
import math
import os

from contrastive_jax.data import records
from contrastive_jax.data.mixture import source_name
from contrastive_jax.errors import ConfigError, check_multiple

TASKS = ("pairs", "views", "labeled")
# What the record sets of a mixture share (their metadata's fields of these names).
MIXED_ALIKE = ("fields", "id_keys", "match_keys", "image_channels", "num_classes", "class_names", "sequence_vocab_size")
BAD_RECORD_POLICIES = ("stop", "skip")
# The built-in datasets: `config.data.name` -> the writer's source. Their records are
# written once per version of the writer's generator (the directory names the version).
BUILTIN = {
    "sklearn_digits": "builtin:sklearn_digits",
    "cmudict": "builtin:cmudict",
    "shapes": "builtin:shapes",
}
BUILTIN_VERSION = 2  # 2: cmudict has the fit and validation splits
DEFAULT_DATA_DIR = os.path.join("~", ".cache", "contrastive_jax")


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
    """What the input pipeline reads and how, as plain values: `run_plan.build` reads them
    from the config once (`run_plan.data_settings`). Each field is `config.data.<name>` (its comment
    in configs/default.py says what it does), but for `global_batch_size`
    (`config.train.global_batch_size`: the rows of a step's batch), `records` (the first set
    of `config.data.records`: evaluation reads its splits) and `mixture_records` (all of
    them when they are mixed, `mixture.py`; (): `records` or the built-in set alone)."""

    name: str | None
    records: str | None
    task: str
    global_batch_size: int
    data_dir: str | None
    train_split: str
    train_class_range: tuple[int, int] | None
    seed: int
    image_size: int | None
    text_max_length: int
    tokenizer: str
    examples_per_class: int
    num_workers: int
    prefetch_batches: int
    on_bad_record: str
    augment: Augment
    mixture_records: tuple[str, ...] = ()
    mixture_weights: tuple[float, ...] = ()
    captions_per_image: int = 1
    max_num_patches: int = 0  # NaFlex's token budget (`naflex`); 0: square images of `image_size`
    patch_size: int = 16  # NaFlex's patch side in pixels (`config.model.patch_size`)

    @property
    def display_name(self) -> str:
        """Names the dataset in messages (its built-in name or its records directory)."""
        return self.name if self.records is None else self.records


def training_sets(data: DataSettings) -> tuple[DataSettings, ...]:
    """The settings of each record set the training stream reads: a mixture's sets, each
    as `records`, or `data` alone."""
    return tuple(dataclasses.replace(data, records=directory) for directory in data.mixture_records) or (data,)


def builtin_records(name: str, data_dir: str | None) -> str:
    """The directory of the built-in dataset `name`'s records under `data_dir`
    (`DEFAULT_DATA_DIR` when None), written there by `writer.write_builtin` (the
    training job runs it before `run_plan.build`, which writes nothing)."""
    root = os.path.expanduser(data_dir or DEFAULT_DATA_DIR)
    return os.path.abspath(os.path.join(root, f"{name}-v{BUILTIN_VERSION}"))


def open_metadata(data: DataSettings) -> records.Metadata:
    """The metadata of the run's record set: `config.data.records`, or the built-in
    dataset's (`builtin_records`).

    Raises:
      DataError: no record set there (for a built-in dataset, the message gives the
        command that writes it), or its metadata is not this format's.
    """
    if data.records is not None:
        return records.read_metadata(os.path.expanduser(data.records))
    directory = builtin_records(data.name, data.data_dir)
    if not os.path.exists(os.path.join(directory, records.METADATA_FILE)):
        raise records.DataError(
            f"config.data.name={data.name!r}: its records are not written yet (in {directory}); write them with "
            f"`python -m contrastive_jax.write_records --source={BUILTIN[data.name]} --out={directory}`, "
            "or train with `python -m contrastive_jax.main`, which writes them first."
        )
    return records.read_metadata(directory)


def text_vocab_size(data: DataSettings, metadata: records.Metadata) -> int:
    """The text towers' vocabulary: the tokenizer's, or the sequence ids + 1 if larger."""
    from contrastive_jax.data import tokenizers

    return max(tokenizers.load(data.tokenizer).vocab_size, metadata.sequence_vocab_size + 1)


def per_process_batch_size(global_batch_size: int, process_count: int) -> int:
    """The number of examples each process reads per step."""
    check_multiple(global_batch_size, process_count, "config.train.global_batch_size", "the processes")
    return global_batch_size // process_count


def augments(data: DataSettings) -> bool:
    """Whether training inputs are randomly augmented (always for "views")."""
    aug = data.augment
    active = aug.crop_min_area < 1.0 or aug.flip or aug.color_jitter > 0 or aug.noise_std > 0
    return active or data.task == "views"


def check_data_config(data: DataSettings) -> records.Metadata:
    """Raises ConfigError for settings the pipeline cannot serve: an unknown task, name
    or bad-record policy, no record set, a "labeled" batch that is not whole classes of
    `examples_per_class`, a split the set lacks, and settings a sequence-pair dataset
    cannot use (another task, image augmentations, a `text_max_length` that would
    truncate), and a mixture whose sets cannot mix (`_check_mixture`). Returns the (first)
    record set's metadata."""
    if data.task not in TASKS:
        raise ConfigError(f"config.data.task={data.task!r} is not a task; use one of {TASKS}.")
    if data.on_bad_record not in BAD_RECORD_POLICIES:
        raise ConfigError(
            f"config.data.on_bad_record={data.on_bad_record!r} is not a policy; use one of {BAD_RECORD_POLICIES}."
        )
    if data.records is None and data.name not in BUILTIN:
        raise ConfigError(
            f"config.data.name={data.name!r} is not a built-in dataset; use one of {sorted(BUILTIN)}, or "
            "write your data with `python -m contrastive_jax.write_records --out=DIR ...` and set "
            "config.data.records=DIR."
        )
    if data.task == "labeled":
        check_multiple(
            data.global_batch_size,
            data.examples_per_class,
            "config.train.global_batch_size",
            "config.data.examples_per_class",
        )
    metadata = open_metadata(data)
    metadata.split(records.parse_split(data.train_split)[0])
    if data.mixture_records or data.mixture_weights:
        _check_mixture(data, metadata)
    if data.captions_per_image != 1:
        _check_captions_per_image(data, metadata)
    if metadata.has("sequence"):
        _check_sequence_pairs(data, metadata)
    if metadata.has("negatives") and data.task != (task := "pairs" if metadata.has("captions") else "views"):
        kind = "texts: the captions'" if task == "pairs" else "images: the second view's"
        raise ConfigError(
            f"{data.display_name}'s hard negatives are {kind} negatives; they need config.data.task={task!r}, "
            f"not {data.task!r}."
        )
    if data.task in ("views", "labeled") or metadata.has("captions"):
        if not metadata.has("image"):
            raise ConfigError(
                f"config.data.task={data.task!r} needs images and {data.display_name} has none; use task 'pairs'."
            )
    if data.task == "labeled" and not metadata.has("label"):
        raise ConfigError(
            f"config.data.task='labeled' needs labels but {data.display_name} has none; use task 'pairs' or 'views'."
        )
    if data.max_num_patches:
        _check_naflex(data, metadata)
    return metadata


def _check_naflex(data: DataSettings, metadata: records.Metadata) -> None:
    """ConfigError unless NaFlex images (`config.data.max_num_patches` > 0) are colour
    images paired with captions, not resized to a square, without photometric
    augmentation (which `images.photometric` applies to square images)."""
    field = f"config.data.max_num_patches={data.max_num_patches}"
    if data.max_num_patches < 0:
        raise ConfigError(f"{field} must be >= 0 (0: square images of config.data.image_size).")
    if data.task != "pairs" or not metadata.has("captions") or metadata.image_channels != 3:
        raise ConfigError(
            f"{field} feeds SigLIP 2's NaFlex image tower colour images paired with captions; "
            f"{data.display_name} with task {data.task!r} has none: set it to 0."
        )
    if data.image_size is not None:
        raise ConfigError(
            f"{field} resizes each image at its aspect ratio and config.data.image_size={data.image_size} to a "
            "square: set config.data.image_size=None (or max_num_patches=0)."
        )
    if data.augment.color_jitter > 0 or data.augment.noise_std > 0:
        raise ConfigError(
            f"{field}: colour jitter and pixel noise apply to square images; set config.data.augment.color_jitter=0.0 "
            "and noise_std=0.0 (crops and flips apply)."
        )


def _check_mixture(data: DataSettings, first: records.Metadata) -> None:
    """ConfigError unless `config.data.mixture_weights` weighs each set of
    `config.data.records` (> 0), the sets have distinct names and the training split, and
    they hold the same kind of records (`MIXED_ALIKE`, and the same number of hard
    negatives, checked first for its own message), so that their rows stack."""
    sets, weights = data.mixture_records, data.mixture_weights
    if len(weights) != len(sets):
        raise ConfigError(
            f"config.data.mixture_weights={tuple(weights)} needs one weight per record set of config.data.records "
            f"({len(sets)}: {', '.join(sets) or 'none'}); e.g. --config.data.records=data/a,data/b "
            "--config.data.mixture_weights=0.7,0.3."
        )
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise ConfigError(f"config.data.mixture_weights={tuple(weights)}: each weight must be > 0.")
    if data.task == "labeled":
        raise ConfigError("config.data.task='labeled' draws whole classes from one record set; give one set.")
    names = [source_name(directory) for directory in sets]
    if len(set(names)) < len(names):
        raise ConfigError(
            f"the record sets {sets} share a name (their metrics' name); give their folders distinct names."
        )
    native = data.image_size is None and not data.max_num_patches and first.has("image")
    first_size = _first_image_size(first, data.train_split) if native else None
    for other in training_sets(data)[1:]:
        metadata = open_metadata(other)
        metadata.split(records.parse_split(data.train_split)[0])
        if metadata.num_negatives != first.num_negatives:
            raise ConfigError(
                f"the record set {other.records} holds {metadata.num_negatives} hard negatives per record and "
                f"{first.directory} {first.num_negatives}: every row of a batch takes the same M; mix sets "
                "written with the same number of negatives (or none), or train on one."
            )
        for field in MIXED_ALIKE:
            if getattr(metadata, field) != getattr(first, field):
                raise ConfigError(
                    f"the record set {other.records} cannot mix with {first.directory}: its {field} is "
                    f"{getattr(metadata, field)!r}, not {getattr(first, field)!r}; mix sets of one kind of record."
                )
        if metadata.has("sequence"):
            _check_sequence_pairs(other, metadata)
        if native and (size := _first_image_size(metadata, data.train_split)) != first_size:
            raise ConfigError(
                f"a mixture's images are stacked in one batch, and the record set {other.records}'s are "
                f"{size[0]} x {size[1]}, {first.directory}'s {first_size[0]} x {first_size[1]}: set "
                "config.data.image_size to resize both."
            )


def _first_image_size(metadata: records.Metadata, split: str) -> tuple[int, int]:
    """The native (width, height) of the first image of `split` of a record set (read from
    its header: nothing is decoded); a set's images share it or are refused when stacked."""
    from PIL import Image

    first = records.decode(records.RecordSet(metadata, records.parse_split(split)[0]).read(0))["image"]
    with Image.open(io.BytesIO(first)) as image:
        return image.size


def _check_captions_per_image(data: DataSettings, metadata: records.Metadata) -> None:
    """ConfigError unless k = `captions_per_image` is >= 1, for image-caption pairs, and
    divides the global batch (an image's k rows in one batch)."""
    k = data.captions_per_image
    if k < 1:
        raise ConfigError(f"config.data.captions_per_image={k} must be >= 1 (1: one caption drawn per visit).")
    if data.task != "pairs" or not metadata.has("captions"):
        raise ConfigError(
            f"config.data.captions_per_image={k} puts several captions of an image in a batch: it needs "
            f"task 'pairs' on captioned images ({data.display_name}, task {data.task!r}); set it to 1."
        )
    check_multiple(data.global_batch_size, k, "config.train.global_batch_size", "config.data.captions_per_image")


def _check_sequence_pairs(data: DataSettings, metadata: records.Metadata) -> None:
    name = data.display_name
    if data.task != "pairs":
        raise ConfigError(f"{name} holds sequence pairs; set config.data.task='pairs' (not {data.task!r}).")
    if augments(data):
        raise ConfigError(
            f"config.data.augment applies to images and {name} has none; set "
            "config.data.augment.noise_std=0.0 (and crop_min_area=1.0, flip=False, "
            "color_jitter=0.0)."
        )
    if data.text_max_length < metadata.max_text_length:
        raise ConfigError(
            f"config.data.text_max_length={data.text_max_length} would truncate {name}, "
            f"whose longest text is {metadata.max_text_length} tokens; set it to at least "
            f"{metadata.max_text_length}."
        )
