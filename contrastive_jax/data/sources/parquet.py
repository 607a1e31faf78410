"""Parquet files of images and captions (`parquet:FILES`), as img2dataset and Hugging Face
datasets write them, read with pyarrow a batch of rows at a time."""

import collections
import glob
import json
import os
from collections.abc import Iterator

import numpy as np

from contrastive_jax.data.sources.file_source import BadInput, FileSource, caption_example, label_value, read_bytes
from contrastive_jax.errors import ConfigError

PARQUET_BATCH_ROWS = 256  # rows read from a Parquet file at a time


class ParquetSource(FileSource):
    """Parquet files of images and captions as img2dataset and Hugging Face datasets write
    them, read with pyarrow a batch of rows at a time: the image column holds the image
    file's bytes, a path (relative to the file's folder, or absolute), or Hugging Face's
    `{"bytes", "path"}` struct; the caption column a string or a list of them; the label
    column (optional) an int or a class name (ints with a Hugging Face `ClassLabel`'s names
    in the schema's metadata: those names are kept); a `negatives` column (optional) a list
    of the row's M hard-negative texts, M the first row's (`FileSource.with_negatives`).
    `columns`: (image, caption, label) names, None for each to take the first of
    `IMAGE_COLUMNS`, `CAPTION_COLUMNS`, "label"."""

    IMAGE_COLUMNS = ("image", "jpg", "png", "webp")
    CAPTION_COLUMNS = ("caption", "captions", "text")

    def __init__(self, files: str, split: str, columns: tuple[str | None, str | None, str | None]):
        pq = _pyarrow_parquet(files)
        if os.path.isdir(files):
            paths = sorted(glob.glob(os.path.join(files, "*.parquet")))
        else:
            paths = sorted(p for part in files.split(",") for p in glob.glob(part))
        if not paths:
            raise ConfigError(f"--source=parquet:{files}: no Parquet files there; give a file, a folder or a glob.")
        self.paths, self.split_name = [os.path.abspath(p) for p in paths], split
        schema = pq.read_schema(self.paths[0])
        image, caption, label = columns
        self.image_column = image or next((c for c in self.IMAGE_COLUMNS if c in schema.names), None)
        self.caption_column = caption or next((c for c in self.CAPTION_COLUMNS if c in schema.names), None)
        self.label_column = label or ("label" if "label" in schema.names else None)
        self.options = {"image_column": image, "caption_column": caption, "label_column": label}
        for flag, name, given in (
            ("--image-column", self.image_column, image),
            ("--caption-column", self.caption_column, caption),
            ("--label-column", self.label_column, label),
        ):
            if (given is not None or flag != "--label-column") and name not in schema.names:
                raise ConfigError(
                    f"--source=parquet:{files}: {self.paths[0]} has no {name or 'image/caption'} column (its columns: "
                    f"{', '.join(schema.names)}); name it with {flag}."
                )
        # Hugging Face datasets keep a ClassLabel's names in the schema's metadata.
        features = json.loads((schema.metadata or {}).get(b"huggingface", b"{}")).get("info", {}).get("features", {})
        label_feature = features.get(self.label_column) or {}
        self.class_names = tuple(label_feature.get("names", ())) if label_feature.get("_type") == "ClassLabel" else ()
        self.rows = [pq.ParquetFile(p).metadata.num_rows for p in self.paths]
        self.size, self.has_label = sum(self.rows), self.label_column is not None
        if "negatives" in schema.names and self.size:
            first = next(pq.ParquetFile(self.paths[0]).iter_batches(batch_size=1, columns=["negatives"]))
            self.num_negatives = len(first.column(0).to_pylist()[0] or ())
        self.labels = collections.Counter()
        if self.has_label:
            for path in self.paths:
                for batch in pq.ParquetFile(path).iter_batches(columns=[self.label_column]):
                    values = (label_value(v) for v in batch.column(0).to_pylist())
                    self.labels.update(v for v in values if v is not None)

    @property
    def info(self) -> dict:
        """The fields, and a Hugging Face ClassLabel's names (its ids' names) when there are."""
        return super().info | ({"class_names": self.class_names} if self.class_names else {})

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        pq = _pyarrow_parquet(self.paths[0])
        columns = [self.image_column, self.caption_column, *([self.label_column] if self.has_label else [])]
        columns += ["negatives"] if self.num_negatives else []
        first = 0
        for path, rows in zip(self.paths, self.rows):
            begin, end = max(start - first, 0), min(stop - first, rows)
            first += rows
            if begin >= end:
                continue
            parquet = pq.ParquetFile(path)
            group_rows = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
            group_starts = np.cumsum([0, *group_rows])
            groups = [g for g in range(parquet.num_row_groups) if group_starts[g] < end and group_starts[g + 1] > begin]
            number = int(group_starts[groups[0]])  # read only the row groups holding [begin, end)
            for batch in parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=columns, row_groups=groups):
                for row in batch.to_pylist():
                    if begin <= number < end:
                        yield self._example(row, path, number)
                    number += 1
                if number >= end:
                    break

    def _example(self, row: dict, path: str, number: int) -> dict | BadInput:
        image = row[self.image_column]
        if isinstance(image, dict):  # Hugging Face's Image feature
            image = image.get("bytes") or image.get("path")
        where = f"{path} row {number}"
        if isinstance(image, str):
            where += f" ({image})"
            image = read_bytes(os.path.join(os.path.dirname(path), image))
        label = label_value(row[self.label_column]) if self.has_label else None
        example = caption_example(image, row[self.caption_column], label, where, labels=self._labels)
        return self.with_negatives(example, row.get("negatives"), where)


def _pyarrow_parquet(files: str):
    try:
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(f"--source=parquet:{files} needs pyarrow: pip install 'contrastive-jax[parquet]'.") from None
    return pyarrow.parquet
