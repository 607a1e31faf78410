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
"""

import collections
import copy
import csv
import dataclasses
import functools
import glob
import importlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence

import numpy as np

from contrastive_jax.data import images
from contrastive_jax.errors import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
BUILTIN = ("sklearn_digits", "cmudict", "shapes")
SOURCES = (
    "csv:FILE, jsonl:FILE, parquet:FILES, webdataset:FOLDER, folder:DIR, tfds:NAME or "
    "builtin:sklearn_digits|cmudict|shapes"
)
INDEX_EVERY = 1024  # a table's rows between two indexed byte offsets
PARQUET_BATCH_ROWS = 256  # rows read from a Parquet file at a time
_ID = re.compile(r"\s*\d+\s*")


@dataclasses.dataclass(frozen=True)
class BadInput:
    """An input left out, and why (`where`: the file / row / key)."""

    where: str
    reason: str


def is_class_id(label) -> bool:
    """Whether a label is a class id: an int >= 0, or its digits as text."""
    if isinstance(label, bool):
        return False
    return isinstance(label, int) and label >= 0 or isinstance(label, str) and _ID.fullmatch(label) is not None


@dataclasses.dataclass(frozen=True)
class ClassLabels:
    """How a split's labels become class ids: with no `names`, a label is its id (an int
    >= 0, or its digits); with `names`, a label is a name and its id is its place there
    (names sorted, as torchvision's `ImageFolder` and Hugging Face's `ClassLabel` number
    them)."""

    names: tuple[str, ...] = ()

    @functools.cached_property
    def _ids(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.names)}

    def id(self, label) -> int | str:
        """The class id of `label`, or why it has none (a sentence for `BadInput`)."""
        if self.names:
            if label is None:
                return "the label is missing"
            found = self._ids.get(label if isinstance(label, str) else str(label))
            return found if found is not None else f"the label {label!r} is not one of the {len(self.names)} classes"
        return int(label) if is_class_id(label) else f"the label {label!r} is not an int >= 0"


def _caption_example(
    image: bytes | None, captions, label, where: str, *, labels: ClassLabels | None
) -> dict | BadInput:
    """The record of an image file's bytes, its captions (None: the source has none) and
    (unless `labels` is None) its label as the file has it, numbered by `labels`; or why
    it is left out. The image is decoded as the reader decodes it, so every image written
    can be read."""
    if image is None:
        return BadInput(where, "the image file is missing")
    if captions is not None:
        captions = [captions] if isinstance(captions, str) else captions
        if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
            return BadInput(where, f"a caption that is not text ({captions!r:.80})")
        if not captions or not all(c.strip() for c in captions):
            return BadInput(where, "an empty caption")
    if labels is not None:
        label = labels.id(label)
        if isinstance(label, str):
            return BadInput(where, label)
    try:
        images.decode(image, 3).load()
    except (ValueError, OSError) as e:
        return BadInput(where, f"the image does not decode ({e})")
    example = {"image": image} | ({"captions": captions} if captions is not None else {})
    return example if labels is None else example | {"label": label}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _label_value(label):
    """A label as the counts and the records take it: text stripped, None when empty."""
    if isinstance(label, str):
        label = label.strip()
    return None if label in ("", None) else label


class _FileSource:
    """What the file sources share: one split of images with captions (unless
    `has_captions` is False) and, when any input has one, labels (their values counted
    in `labels`, a Counter; numbered by `class_labels`, see `numbered`); `size` inputs."""

    split_name: str
    has_label: bool
    has_captions: bool = True
    labels_are_names: bool = False  # True: every label is a name, digits too (a folder's)
    labels: collections.Counter
    size: int
    class_labels: ClassLabels = ClassLabels()

    def numbered(self, class_labels: ClassLabels) -> "_FileSource":
        """This source, its labels numbered by `class_labels` (a copy)."""
        source = copy.copy(self)
        source.class_labels = class_labels
        return source

    @property
    def _labels(self) -> ClassLabels | None:
        return self.class_labels if self.has_label else None

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        captions = ("captions",) if self.has_captions else ()
        return {"fields": ("image", *captions, *(("label",) if self.has_label else ()))}

    def num_examples(self, split: str) -> int:
        return self.size

    def label_counts(self, split: str) -> collections.Counter | None:
        """How often each label value occurs (missing ones not counted)."""
        return self.labels


class TableSource(_FileSource):
    """A CSV or JSONL file of (image path, caption(s)[, label]) rows, read as a stream."""

    def __init__(self, path: str, split: str, kind: str):
        if not os.path.isfile(path):
            raise ConfigError(f"--source={kind}:{path}: no such file; give the path of the {kind.upper()} file.")
        self.path, self.kind, self.split_name, self.options = os.path.abspath(path), kind, split, {}
        self.header: list[str] = []
        self.offsets: list[tuple[int, int]] = []  # (byte offset, row number) of rows 0, INDEX_EVERY, ...
        self.labels, self.size, has_image = collections.Counter(), 0, False
        for offset, number, row in self._rows(None):
            if self.size % INDEX_EVERY == 0:
                self.offsets.append((offset, number))
            self.size += 1
            if isinstance(row, dict):
                has_image = has_image or "image" in row
                if (label := _label_value(row.get("label"))) is not None:
                    self.labels[label] += 1
        if not has_image:
            raise ConfigError(f"--source={kind}:{path} has no rows with an `image` column; see --help.")
        self.has_label = bool(self.labels)

    def _lines(self, f, offset: int) -> Iterator[tuple[int, str]]:
        """(byte offset after it, text) of each line of `f` from `offset`."""
        f.seek(offset)
        for line in f:
            offset += len(line)
            yield offset, line.decode("utf-8", "replace")

    def _rows(self, start: tuple[int, int] | None) -> Iterator[tuple[int, int, dict | str]]:
        """(byte offset, number, row or why it is none) of each row from `start` (a byte
        offset and its row's number; None: the first), blank lines passed over. A CSV's
        header is read first (into `self.header`)."""
        with open(self.path, "rb") as f:
            if self.kind == "jsonl":
                yield from self._jsonl_rows(f, start or (0, 1))
                return
            if start is None:
                self.header = next(csv.reader(text for _, text in self._lines(f, 0)), [])
                start = (f.tell(), 1)
            yield from self._csv_rows(f, start)

    def _csv_rows(self, f, start):
        offset, number = start
        consumed = [offset]

        def texts():
            for end, text in self._lines(f, offset):
                consumed[0] = end
                yield text

        for values in csv.reader(texts()):
            if values:
                yield offset, number, _csv_row(self.header, values)
            offset, number = consumed[0], number + 1

    def _jsonl_rows(self, f, start):
        offset, number = start
        for end, text in self._lines(f, offset):
            if text.strip():
                yield offset, number, _jsonl_row(text)
            offset, number = end, number + 1

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        folder, place = os.path.dirname(self.path), "row" if self.kind == "csv" else "line"
        rows = self._rows(self.offsets[start // INDEX_EVERY]) if start < self.size else iter(())
        for index, (_, number, row) in enumerate(rows, start - start % INDEX_EVERY):
            if index >= stop:
                break
            if index < start:
                continue
            if isinstance(row, str):
                yield BadInput(f"{self.path} {place} {number}", row)
                continue
            image = row.get("image") or ""
            where = f"{self.path} {place} {number} ({image})"
            data = _read(os.path.join(folder, image)) if image else None
            yield _caption_example(data, row["captions"], _label_value(row.get("label")), where, labels=self._labels)


def _csv_row(header: list[str], values: list[str]) -> dict | str:
    """A CSV row as {"image", "captions", ["label"]} (every `caption` column and the JSON
    list of a `captions` column), or why it is not one."""
    row = {"captions": []}
    for name, value in zip(header, values):
        if name == "caption":
            row["captions"].append(value)
        elif name == "captions":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                return f"its captions are not a JSON list ({e})"
            row["captions"] += value if isinstance(value, list) else [value]
        else:
            row[name] = value
    return row


def _jsonl_row(line: str) -> dict | str:
    """A JSONL line as {"image", "captions", ["label"]}, or why it is not one."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        return f"the line is not JSON ({e})"
    if not isinstance(row, dict):
        return "the line is not a JSON object"
    captions = [row.pop("caption")] if "caption" in row else row.get("captions", [])
    return row | {"captions": captions}


class WebDatasetSource(_FileSource):
    """A folder of WebDataset tar shards (`key.jpg` + `key.txt` / `key.json` [+ `key.cls`,
    or a `label` in the `.json`]); a member's key is its path up to the first dot of its
    file name (WebDataset's rule)."""

    def __init__(self, folder: str, split: str):
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        tars = [os.path.join(folder, name) for name in names if name.endswith(".tar")]
        if not tars:
            raise ConfigError(f"--source=webdataset:{folder}: no .tar files there; give the folder of the shards.")
        self.split_name, self.options = split, {}
        self.inputs: list[tuple[str, str, dict[str, str]]] = []  # (tar, key, suffix -> member name)
        self.labels = collections.Counter()
        for tar in tars:
            by_key: dict[str, dict[str, str]] = {}
            with tarfile.open(tar) as archive:
                for member in archive:
                    if member.isfile():
                        folder_part, name = os.path.split(member.name)
                        stem, _, suffix = name.partition(".")
                        key = os.path.join(folder_part, stem)
                        by_key.setdefault(key, {})[f".{suffix.lower()}"] = member.name
                        if suffix.lower() in ("cls", "json"):
                            label = _wds_label({f".{suffix.lower()}": archive.extractfile(member).read()})
                            if (label := _label_value(label)) is not None:
                                self.labels[label] += 1
            self.inputs += [(tar, key, files) for key, files in by_key.items()]
        self.size, self.has_label = len(self.inputs), bool(self.labels)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        archives: dict[str, tarfile.TarFile] = {}
        try:
            for tar, key, files in self.inputs[start:stop]:
                archive = archives.setdefault(tar, tarfile.open(tar))
                contents = {suffix: archive.extractfile(name).read() for suffix, name in files.items()}
                yield self._example(contents, f"{tar} key {key}")
        finally:
            for archive in archives.values():
                archive.close()

    def _example(self, contents: dict[str, bytes], where: str) -> dict | BadInput:
        """The record of one key's files (suffix -> bytes), or why it is left out."""
        captions = []
        try:
            if ".json" in contents:
                meta = json.loads(contents[".json"])
                captions = meta.get("captions") or meta.get("caption") or []
            if not captions and ".txt" in contents:
                captions = [contents[".txt"].decode("utf-8")]
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            return BadInput(where, f"its caption file does not parse ({type(e).__name__})")
        image = next((contents[s] for s in IMAGE_SUFFIXES if s in contents), None)
        return _caption_example(image, captions, _label_value(_wds_label(contents)), where, labels=self._labels)


def _wds_label(contents: dict[str, bytes]):
    """A WebDataset key's label: its `.cls` file's text, else its `.json`'s `label`."""
    if ".cls" in contents:
        return contents[".cls"].decode("utf-8", "replace")
    try:
        meta = json.loads(contents.get(".json", b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return meta.get("label") if isinstance(meta, dict) else None


class FolderSource(_FileSource):
    """An image folder as torchvision's `ImageFolder` reads it: `DIR/<class name>/<image>`
    (any depth under the class folder); an image's caption, when any image has one, is the
    text of the `.txt` file beside it with the same stem. The labels are the folder names,
    always names (a folder `3` is the name "3")."""

    labels_are_names = True

    def __init__(self, folder: str, split: str):
        if not os.path.isdir(folder):
            raise ConfigError(f"--source=folder:{folder}: no such folder; give the folder of the class folders.")
        self.folder, self.split_name, self.options = os.path.abspath(folder), split, {}
        self.inputs: list[tuple[str, str, str]] = []  # (image path, class name, caption path)
        for name in sorted(os.listdir(folder)):
            for directory, _, files in sorted(os.walk(os.path.join(self.folder, name))):
                for file in sorted(files):
                    stem, suffix = os.path.splitext(file)
                    if suffix.lower() in IMAGE_SUFFIXES:
                        path = os.path.join(directory, file)
                        self.inputs.append((path, name, os.path.join(directory, f"{stem}.txt")))
        if not self.inputs:
            raise ConfigError(
                f"--source=folder:{folder}: no images in class folders there ({', '.join(IMAGE_SUFFIXES)} "
                "files in DIR/<class name>/)."
            )
        self.labels = collections.Counter(name for _, name, _ in self.inputs)
        self.size, self.has_label = len(self.inputs), True
        self.has_captions = any(os.path.exists(caption) for _, _, caption in self.inputs)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        for path, name, caption_file in self.inputs[start:stop]:
            captions = None
            if self.has_captions:
                text = _read(caption_file)
                if text is None:
                    yield BadInput(path, f"no caption file {os.path.basename(caption_file)} beside it")
                    continue
                captions = [text.decode("utf-8", "replace").strip()]
            yield _caption_example(_read(path), captions, name, path, labels=self.class_labels)


class ParquetSource(_FileSource):
    """Parquet files of images and captions as img2dataset and Hugging Face datasets write
    them, read with pyarrow a batch of rows at a time: the image column holds the image
    file's bytes, a path (relative to the file's folder, or absolute), or Hugging Face's
    `{"bytes", "path"}` struct; the caption column a string or a list of them; the label
    column (optional) an int or a class name (ints with a Hugging Face `ClassLabel`'s names
    in the schema's metadata: those names are kept). `columns`: (image, caption, label) names,
    None for each to take the first of `IMAGE_COLUMNS`, `CAPTION_COLUMNS`, "label"."""

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
        self.labels = collections.Counter()
        if self.has_label:
            for path in self.paths:
                for batch in pq.ParquetFile(path).iter_batches(columns=[self.label_column]):
                    values = (_label_value(v) for v in batch.column(0).to_pylist())
                    self.labels.update(v for v in values if v is not None)

    @property
    def info(self) -> dict:
        """The fields, and a Hugging Face ClassLabel's names (its ids' names) when there are."""
        return super().info | ({"class_names": self.class_names} if self.class_names else {})

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        pq = _pyarrow_parquet(self.paths[0])
        columns = [self.image_column, self.caption_column, *([self.label_column] if self.has_label else [])]
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
            image = _read(os.path.join(os.path.dirname(path), image))
        label = _label_value(row[self.label_column]) if self.has_label else None
        return _caption_example(image, row[self.caption_column], label, where, labels=self._labels)


def _pyarrow_parquet(files: str):
    try:
        import pyarrow.parquet
    except ImportError:
        raise ConfigError(f"--source=parquet:{files} needs pyarrow: pip install 'contrastive-jax[parquet]'.") from None
    return pyarrow.parquet


class TfdsSource:
    """A TFDS dataset's split, its images encoded as `image_format` (TensorFlow, only here)."""

    def __init__(self, name: str, split: str, data_dir: str | None, image_format: str):
        try:
            import tensorflow_datasets as tfds
        except ImportError:
            raise ConfigError(
                f"--source=tfds:{name} needs TensorFlow Datasets: pip install 'contrastive-jax[tfds]'."
            ) from None
        try:
            builder = tfds.builder(name, data_dir=data_dir)
        except Exception as e:  # DatasetNotFoundError, or a bad name / config
            raise ConfigError(f"--source=tfds:{name}: {str(e).splitlines()[0]}") from None
        builder.download_and_prepare()
        if split not in builder.info.splits or "image" not in builder.info.features:
            raise ConfigError(
                f"--source=tfds:{name} needs an `image` feature and --split={split!r}; it has the features "
                f"{sorted(builder.info.features.keys())} and the splits {sorted(builder.info.splits)}."
            )
        self.name, self.split_name, self.data_dir, self.image_format = name, split, data_dir, image_format
        self.options = {"tfds_data_dir": data_dir, "encode": image_format}
        self.size = builder.info.splits[split].num_examples
        features = builder.info.features
        self.has_label = "label" in features
        self.caption_path = next(
            (path for path in (("captions", "text"), ("caption",), ("text",)) if _has_feature(features, path)), None
        )
        self.channels = features["image"].shape[-1]
        self.num_classes = getattr(features["label"], "num_classes", None) if self.has_label else None
        names = list(getattr(features["label"], "names", None) or []) if self.num_classes else []
        self.class_names = tuple(names) if names != [str(i) for i in range(len(names))] else ()  # not "0", "1", ...

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        fields = ("image", *(("captions",) if self.caption_path else ()), *(("label",) if self.has_label else ()))
        known = {"num_classes": self.num_classes, "class_names": self.class_names} if self.num_classes else {}
        return {"fields": fields, "image_channels": 1 if self.channels == 1 else 3, **known}

    def num_examples(self, split: str) -> int:
        return self.size

    def label_counts(self, split: str) -> None:
        """None: the labels are TFDS's class ids."""
        return None

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        import tensorflow_datasets as tfds

        dataset = tfds.load(self.name, split=f"{split}[{start}:{stop}]", data_dir=self.data_dir, shuffle_files=False)
        for number, example in enumerate(tfds.as_numpy(dataset), start):
            pixels = example["image"]
            out = {"image": _encode(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, self.image_format)}
            if self.caption_path:
                captions = example
                for key in self.caption_path:
                    captions = captions[key]
                captions = [captions] if isinstance(captions, bytes) else list(captions)
                out["captions"] = [c.decode("utf-8") for c in captions]
                if not out["captions"] or not all(c.strip() for c in out["captions"]):
                    yield BadInput(f"tfds:{self.name} {split} example {number}", "an empty caption")
                    continue
            if self.has_label:
                out["label"] = int(example["label"])
            yield out


def _encode(pixels: np.ndarray, image_format: str) -> bytes:
    """uint8 [H, W] or [H, W, 3] pixels as PNG (lossless) or JPEG (quality 95) bytes."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG" if image_format == "jpeg" else "PNG", quality=95)
    return out.getvalue()


def _has_feature(features, path: Sequence[str]) -> bool:
    for key in path:
        if not hasattr(features, "keys") or key not in features.keys():
            return False
        features = features[key]
        features = getattr(features, "feature", features)  # Sequence -> its element
    return True


class BuiltinSource:
    """A built-in dataset module of `contrastive_jax.data.builtin` (all its splits); holds the
    module's name, so it pickles to the writer's processes."""

    def __init__(self, name: str):
        self.name, self.options = name, {}

    @property
    def module(self):
        return importlib.import_module(f"contrastive_jax.data.builtin.{self.name}")

    def splits(self) -> tuple[str, ...]:
        return self.module.SPLITS

    @property
    def info(self) -> dict:
        return self.module.INFO

    def num_examples(self, split: str) -> int:
        return self.module.num_examples(split)

    def label_counts(self, split: str) -> None:
        """None: the labels are the dataset's class ids."""
        return None

    def examples(self, split: str, start: int, stop: int):
        return self.module.examples(split, start, stop)


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
