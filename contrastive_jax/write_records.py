"""Writes training data as a record set: `python -m contrastive_jax.write_records`.

    python -m contrastive_jax.write_records --source=SOURCE --out=DIR [--split=NAME]
        [--shards=N] [--workers=K] [--encode=png|jpeg] [--tfds-data-dir=DIR]
        [--num-examples=N --seed=S --image-size=PX]   (builtin:shapes)

SOURCE is one of:

* `csv:FILE` or `jsonl:FILE`: one example a row: `image` (a path, relative to the
  file's folder or absolute), `caption` (one) or `captions` (a JSON list; in a CSV, also
  several `caption` columns), optionally `label` (an int).
* `webdataset:FOLDER`: every `*.tar` in it, as img2dataset writes them: per key an image
  (`.jpg`, `.jpeg`, `.png`, `.webp`), its caption(s) from `.json` (`captions` or
  `caption`) or `.txt`, optionally a `.cls` label.
* `tfds:NAME`: a TFDS dataset's split (`--tfds-data-dir`; needs
  `pip install 'contrastive-jax[tfds]'`): its `image`, `label` and captions (a `caption`
  / `text` string, or `captions/text` as in `coco_captions`), images encoded as `--encode`.
* `builtin:sklearn_digits`, `builtin:cmudict`, `builtin:shapes` (the generated image-text
  set: `--num-examples`, `--seed`, `--image-size`, `--encode`): all their splits at once.

Files and TFDS write one split per command (`--split`, default "train"); run it again
with another split and the same DIR to add one (the metadata lists both). Image files are
stored as they are; every image is decoded once, as the reader decodes it, to check it.
A bad input (an image that is missing or does not decode, an empty caption, a label that
is not an int, a row that does not parse) is reported on its own line as it is found,
left out, and counted in the metadata (`source.skipped`, the first reasons in
`source.skipped_first`). Shards (independent ranges of the source) are written in
parallel by `--workers` processes; each is renamed into place when whole, and a rerun of
the same command keeps the shards already written, so an interrupted command is resumed
by running it again. The metadata is written last.
"""

import csv
import dataclasses
import importlib
import json
import multiprocessing
import os
import shlex
import sys
import tarfile
from collections.abc import Iterator, Sequence
from typing import Any

from contrastive_jax import records
from contrastive_jax.config_lib import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
RECORDS_PER_SHARD = 10_000
MAX_REASONS_KEPT = 20
BUILTIN = ("sklearn_digits", "cmudict", "shapes")
_PROGRESS_DIR = ".progress"  # per finished shard: what the metadata needs of it, for a rerun
_SOURCES = "csv:FILE, jsonl:FILE, webdataset:FOLDER, tfds:NAME or builtin:sklearn_digits|cmudict|shapes"


@dataclasses.dataclass(frozen=True)
class BadInput:
    """An input left out, and why (`where`: the file / row / key)."""

    where: str
    reason: str


def _caption_example(image: bytes | None, captions, label, where: str, *, has_label: bool) -> dict | BadInput:
    """The record of an image file's bytes, its captions and (when `has_label`) label;
    or why it is left out."""
    from contrastive_jax import images  # the reader's decoder: what passes here, reads

    if image is None:
        return BadInput(where, "the image file is missing")
    captions = [captions] if isinstance(captions, str) else list(captions or ())
    if not captions or not all(isinstance(c, str) and c.strip() for c in captions):
        return BadInput(where, "an empty caption")
    try:
        label = int(label) if has_label else None
    except (TypeError, ValueError):
        return BadInput(where, f"the label {label!r} is not an int")
    try:
        images.decode(image, 3).load()
    except (ValueError, OSError) as e:
        return BadInput(where, f"the image does not decode ({e})")
    example = {"image": image, "captions": captions}
    return example if label is None else example | {"label": label}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


class TableSource:
    """A CSV or JSONL file of (image path, caption(s)[, label]) rows."""

    def __init__(self, path: str, split: str, kind: str):
        if not os.path.isfile(path):
            raise ConfigError(f"--source={kind}:{path}: no such file; give the path of the {kind.upper()} file.")
        self.path, self.split_name, self.kind = os.path.abspath(path), split, kind
        with open(path, newline="", encoding="utf-8") as f:
            lines = list(csv.reader(f)) if kind == "csv" else [line for line in f if line.strip()]
        header = lines.pop(0) if kind == "csv" and lines else []
        self.rows = [self._parse(header, line, number) for number, line in enumerate(lines, 1)]
        named = [row for row in self.rows if isinstance(row, dict)]
        if not any("image" in row for row in named):
            raise ConfigError(f"--source={kind}:{path} has no rows with an `image` column; see --help.")
        self.has_label = any("label" in row for row in named)
        self.options: dict[str, Any] = {}

    def _parse(self, header: list[str], line, number: int) -> dict | BadInput:
        """Row `number` (from 1) as {"image", "captions", ["label"]}, or why it is not one."""
        where = f"{self.path} row {number}"
        try:
            if self.kind == "jsonl":
                row = json.loads(line)
                if not isinstance(row, dict):
                    return BadInput(where, "the line is not a JSON object")
                row["captions"] = [row.pop("caption")] if "caption" in row else row.get("captions", [])
                return row
            row = {"captions": []}
            for name, value in zip(header, line):
                if name == "caption":
                    row["captions"].append(value)
                elif name == "captions":
                    row["captions"] += json.loads(value)
                else:
                    row[name] = value
            return row
        except json.JSONDecodeError as e:
            return BadInput(where, f"not valid JSON ({e})")

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        return {"fields": ("image", "captions", *(("label",) if self.has_label else ()))}

    def num_examples(self, split: str) -> int:
        return len(self.rows)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        folder = os.path.dirname(self.path)
        for number, row in enumerate(self.rows[start:stop], start + 1):
            if isinstance(row, BadInput):
                yield row
                continue
            image = row.get("image") or ""
            where = f"{self.path} row {number} ({image})"
            data = _read(os.path.join(folder, image)) if image else None
            yield _caption_example(data, row["captions"], row.get("label"), where, has_label=self.has_label)


class WebDatasetSource:
    """A folder of WebDataset tar shards (`key.jpg` + `key.txt` / `key.json` [+ `key.cls`]);
    a member's key is its path up to the first dot of its file name (WebDataset's rule)."""

    def __init__(self, folder: str, split: str):
        tars = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".tar")) if (
            os.path.isdir(folder)
        ) else []  # fmt: skip
        if not tars:
            raise ConfigError(f"--source=webdataset:{folder}: no .tar files there; give the folder of the shards.")
        self.split_name, self.options = split, {}
        self.items: list[tuple[str, str, dict[str, str]]] = []  # (tar, key, suffix -> member name)
        for tar in tars:
            by_key: dict[str, dict[str, str]] = {}
            with tarfile.open(tar) as archive:
                for member in archive.getmembers():
                    if member.isfile():
                        folder_part, name = os.path.split(member.name)
                        stem, _, suffix = name.partition(".")
                        by_key.setdefault(os.path.join(folder_part, stem), {})[f".{suffix.lower()}"] = member.name
            self.items += [(tar, key, files) for key, files in by_key.items()]
        self.has_label = any(".cls" in files for _, _, files in self.items)

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        return {"fields": ("image", "captions", *(("label",) if self.has_label else ()))}

    def num_examples(self, split: str) -> int:
        return len(self.items)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        archives: dict[str, tarfile.TarFile] = {}
        try:
            for tar, key, files in self.items[start:stop]:
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

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    @property
    def info(self) -> dict:
        fields = ("image", *(("captions",) if self.caption_path else ()), *(("label",) if self.has_label else ()))
        return {"fields": fields, "image_channels": 1 if self.channels == 1 else 3}

    def num_examples(self, split: str) -> int:
        return self.size

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        import tensorflow_datasets as tfds

        from contrastive_jax.datasets.shapes import encode

        dataset = tfds.load(self.name, split=f"{split}[{start}:{stop}]", data_dir=self.data_dir, shuffle_files=False)
        for number, example in enumerate(tfds.as_numpy(dataset), start):
            pixels = example["image"]
            out = {"image": encode(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, self.image_format)}
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
    raise ConfigError(f"--source={spec!r} is not a source; use {_SOURCES}.")


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """Records [start, stop) of a split, written to `path`; `key` says what they are (the
    source and its options), so a rerun keeps the shard only if it was written alike."""

    split: str
    start: int
    stop: int
    path: str
    key: str


def _progress_file(task: ShardTask) -> str:
    return os.path.join(os.path.dirname(task.path), _PROGRESS_DIR, os.path.basename(task.path) + ".json")


def _write_shard(source, task: ShardTask) -> dict:
    """Writes one shard, reporting its bad inputs as they are found; returns what the
    metadata needs of it (`num_records`, `labels`, `skipped` reasons, `longest` text),
    kept from an earlier run when the shard is there and was written by the same task."""
    progress = _progress_file(task)
    if os.path.exists(task.path) and os.path.exists(progress):
        with open(progress) as f:
            done = json.load(f)
        if done.pop("key", None) == task.key:
            return done | {"kept": True}
    labels, skipped, longest = [], [], 0

    def good_examples():
        nonlocal longest
        for example in source.examples(task.split, task.start, task.stop):
            if isinstance(example, BadInput):
                print(f"skipped {example.where}: {example.reason}", file=sys.stderr, flush=True)
                skipped.append(f"{example.where}: {example.reason}")
                continue
            if "label" in example:
                labels.append(example["label"])
            longest = max(longest, len(example.get("text", "").encode()), len(example.get("sequence", ())))
            yield example

    count = records.write_shard(task.path, good_examples())
    result = {"num_records": count, "labels": labels, "skipped": skipped, "longest": longest}
    os.makedirs(os.path.dirname(progress), exist_ok=True)
    with open(f"{progress}.tmp", "w") as f:
        json.dump(result | {"key": task.key}, f)
    os.replace(f"{progress}.tmp", progress)
    return result


_worker_source = None  # the source, in a writer process


def _set_worker_source(source) -> None:
    global _worker_source
    _worker_source = source


def _write_shard_in_worker(numbered_task: tuple[int, ShardTask]) -> tuple[int, dict]:
    number, task = numbered_task
    return number, _write_shard(_worker_source, task)


def _run(source, tasks: list[ShardTask], workers: int) -> list[dict]:
    """Each task's `_write_shard` result, in order, written by `workers` processes (the
    source is sent to each once); prints a line per shard as it is done."""
    results: list[dict] = [{}] * len(tasks)

    def report(number: int, result: dict) -> None:
        results[number] = result
        kept = ", kept from an earlier run" if result.get("kept") else ""
        done = sum(bool(r) for r in results)
        print(
            f"[{done}/{len(tasks)}] {os.path.basename(tasks[number].path)}: {result['num_records']:,} records, "
            f"{len(result['skipped'])} skipped{kept}",
            file=sys.stderr,
            flush=True,
        )

    if workers <= 1 or len(tasks) == 1:
        for number, task in enumerate(tasks):
            report(number, _write_shard(source, task))
        return results
    context = multiprocessing.get_context("spawn")
    with context.Pool(min(workers, len(tasks)), initializer=_set_worker_source, initargs=(source,)) as pool:
        for number, result in pool.imap_unordered(_write_shard_in_worker, enumerate(tasks)):
            report(number, result)
    return results


def _command(spec: str, out: str, split: str, shards: int, workers: int, options: dict) -> str:
    """The command line that writes (or resumes writing) these splits."""
    flags = {"source": spec, "out": out, "split": split, "shards": shards, "workers": workers, **options}
    words = [f"--{name.replace('_', '-')}={value}" for name, value in flags.items() if value is not None]
    return shlex.join(["python", "-m", "contrastive_jax.write_records", *words])


def _write_split(source, name: str, out: str, shards: int, workers: int, key: str) -> tuple[records.Split, dict]:
    """Writes split `name` of `source` into `out`: (its `Split`, a summary: `labels`,
    `skipped` reasons and the `longest` text of its records)."""
    size = source.num_examples(name)
    count = shards or max(1, -(-size // RECORDS_PER_SHARD))
    bounds = [size * k // count for k in range(count + 1)]
    tasks = [
        ShardTask(name, bounds[k], bounds[k + 1], os.path.join(out, records.shard_name(name, k, count)), key)
        for k in range(count)
    ]
    results = _run(source, tasks, workers)
    split = records.Split(tuple(os.path.basename(t.path) for t in tasks), tuple(r["num_records"] for r in results))
    summary = {
        "labels": [label for r in results for label in r["labels"]],
        "skipped": [reason for r in results for reason in r["skipped"]],
        "longest": max(r["longest"] for r in results),
    }
    return split, summary
