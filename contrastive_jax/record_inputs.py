"""The inputs `write_records` converts to records: tables (CSV / JSONL) of image files and
captions, WebDataset tars, TFDS datasets and the built-in datasets (`open_source`).

A source gives, for each of its `splits()`, `num_examples(split)` and the examples of a
range, `examples(split, start, stop)`: record dicts (`records.FIELDS` and id keys) or a
`BadInput` for each input left out, in the source's order, so ranges are written by
separate processes alike. `info` is what the metadata says of the records (their
`fields`, and `num_classes`, `image_channels`, ... when the source knows them), and
`options` the settings beyond the spec that decide the records (seed, encoding).
Sources pickle: the writer sends one to each of its processes.
"""

import csv
import dataclasses
import importlib
import io
import json
import os
import tarfile
from collections.abc import Iterator, Sequence

import numpy as np

from contrastive_jax import images
from contrastive_jax.config_lib import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
BUILTIN = ("sklearn_digits", "cmudict", "shapes")
SOURCES = "csv:FILE, jsonl:FILE, webdataset:FOLDER, tfds:NAME or builtin:sklearn_digits|cmudict|shapes"


@dataclasses.dataclass(frozen=True)
class BadInput:
    """An input left out, and why (`where`: the file / row / key)."""

    where: str
    reason: str


def _caption_example(image: bytes | None, captions, label, where: str, *, has_label: bool) -> dict | BadInput:
    """The record of an image file's bytes, its captions and (when `has_label`) label;
    or why it is left out. The image is decoded as the reader decodes it, so every image
    written can be read."""
    if image is None:
        return BadInput(where, "the image file is missing")
    captions = [captions] if isinstance(captions, str) else captions
    if not isinstance(captions, list) or not all(isinstance(c, str) for c in captions):
        return BadInput(where, f"a caption that is not text ({captions!r:.80})")
    if not captions or not all(c.strip() for c in captions):
        return BadInput(where, "an empty caption")
    if has_label:
        try:
            number = int(label)
        except (TypeError, ValueError):
            number = -1
        if number < 0:
            return BadInput(where, f"the label {label!r} is not an int >= 0")
    try:
        images.decode(image, 3).load()
    except (ValueError, OSError) as e:
        return BadInput(where, f"the image does not decode ({e})")
    example = {"image": image, "captions": captions}
    return example | {"label": number} if has_label else example


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class _CaptionFiles:
    """What the file sources (a table, WebDataset tars) share: one split of image files
    with captions and, when any input has one, labels; `self.inputs` lists the inputs."""

    split_name: str
    has_label: bool
    inputs: list

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        return {"fields": ("image", "captions", *(("label",) if self.has_label else ()))}

    def num_examples(self, split: str) -> int:
        return len(self.inputs)


class TableSource(_CaptionFiles):
    """A CSV or JSONL file of (image path, caption(s)[, label]) rows, read whole."""

    def __init__(self, path: str, split: str, kind: str):
        if not os.path.isfile(path):
            raise ConfigError(f"--source={kind}:{path}: no such file; give the path of the {kind.upper()} file.")
        self.path, self.split_name, self.options = os.path.abspath(path), split, {}
        with open(path, newline="", encoding="utf-8") as f:
            if kind == "csv":
                header, *lines = list(csv.reader(f)) or [[]]
                self.inputs = [(f"row {n}", _csv_row(header, line)) for n, line in enumerate(lines, 1)]
            else:
                self.inputs = [(f"line {n}", _jsonl_row(line)) for n, line in enumerate(f, 1) if line.strip()]
        named = [row for _, row in self.inputs if isinstance(row, dict)]
        if not any("image" in row for row in named):
            raise ConfigError(f"--source={kind}:{path} has no rows with an `image` column; see --help.")
        self.has_label = any("label" in row for row in named)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        folder = os.path.dirname(self.path)
        for place, row in self.inputs[start:stop]:
            if isinstance(row, str):
                yield BadInput(f"{self.path} {place}", row)
                continue
            image = row.get("image") or ""
            where = f"{self.path} {place} ({image})"
            data = _read(os.path.join(folder, image)) if image else None
            yield _caption_example(data, row["captions"], row.get("label"), where, has_label=self.has_label)


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


class WebDatasetSource(_CaptionFiles):
    """A folder of WebDataset tar shards (`key.jpg` + `key.txt` / `key.json` [+ `key.cls`]);
    a member's key is its path up to the first dot of its file name (WebDataset's rule)."""

    def __init__(self, folder: str, split: str):
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        tars = [os.path.join(folder, name) for name in names if name.endswith(".tar")]
        if not tars:
            raise ConfigError(f"--source=webdataset:{folder}: no .tar files there; give the folder of the shards.")
        self.split_name, self.options = split, {}
        self.inputs: list[tuple[str, str, dict[str, str]]] = []  # (tar, key, suffix -> member name)
        for tar in tars:
            by_key: dict[str, dict[str, str]] = {}
            with tarfile.open(tar) as archive:
                for member in archive.getmembers():
                    if member.isfile():
                        folder_part, name = os.path.split(member.name)
                        stem, _, suffix = name.partition(".")
                        by_key.setdefault(os.path.join(folder_part, stem), {})[f".{suffix.lower()}"] = member.name
            self.inputs += [(tar, key, files) for key, files in by_key.items()]
        self.has_label = any(".cls" in files for _, _, files in self.inputs)

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
        label = contents[".cls"].decode("utf-8", "replace").strip() if ".cls" in contents else None
        image = next((contents[s] for s in IMAGE_SUFFIXES if s in contents), None)
        return _caption_example(image, captions, label, where, has_label=self.has_label)


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

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        fields = ("image", *(("captions",) if self.caption_path else ()), *(("label",) if self.has_label else ()))
        known = {"num_classes": self.num_classes} if self.num_classes else {}
        return {"fields": fields, "image_channels": 1 if self.channels == 1 else 3, **known}

    def num_examples(self, split: str) -> int:
        return self.size

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
    """A built-in dataset module of `contrastive_jax.datasets` (all its splits); holds the
    module's name, so it pickles to the writer's processes."""

    def __init__(self, name: str):
        self.name, self.options = name, {}

    @property
    def module(self):
        return importlib.import_module(f"contrastive_jax.datasets.{self.name}")

    def splits(self) -> tuple[str, ...]:
        return self.module.SPLITS

    @property
    def info(self) -> dict:
        return self.module.INFO

    def num_examples(self, split: str) -> int:
        return self.module.num_examples(split)

    def examples(self, split: str, start: int, stop: int):
        return self.module.examples(split, start, stop)


def open_source(spec: str, *, split: str, encode: str, tfds_data_dir, num_examples: int, seed: int, image_size: int):
    """The source `spec` names (see the module docstring), with the command's options.

    Raises:
      ConfigError: `spec` names no source, or one that is not there.
    """
    kind, _, where = spec.partition(":")
    if kind in ("csv", "jsonl"):
        return TableSource(where, split, kind)
    if kind == "webdataset":
        return WebDatasetSource(where, split)
    if kind == "tfds":
        return TfdsSource(where, split, tfds_data_dir, encode)
    if kind == "builtin" and where == "shapes":
        from contrastive_jax.datasets import shapes

        if num_examples < 3 or image_size < 8:
            raise ConfigError("builtin:shapes needs --num-examples >= 3 and --image-size >= 8 (pixels a side).")
        return shapes.Shapes(num_examples, seed, image_size, encode)
    if kind == "builtin" and where in BUILTIN:
        return BuiltinSource(where)
    raise ConfigError(f"--source={spec!r} is not a source; use {SOURCES}.")
