"""Writes training data as a record set: `python -m contrastive_jax.write_records`.

    python -m contrastive_jax.write_records --source=SOURCE --out=DIR [--split=NAME]
        [--shards=N] [--workers=K] [--encode=png|jpeg]

SOURCE is one of:

* `csv:FILE` or `jsonl:FILE`: one example a row: `image` (a path, relative to the
  file's folder or absolute), `caption` (one) or `captions` (a JSON list; in a CSV, also
  several `caption` columns), optionally `label` (an int).
* `webdataset:FOLDER`: every `*.tar` in it, as img2dataset writes them: per key an image
  (`.jpg`, `.jpeg`, `.png`, `.webp`), its caption(s) from `.txt` or `.json` (`caption` or
  `captions`), optionally a `.cls` label.
* `tfds:NAME`: a TFDS dataset's split (`--tfds-data-dir`; needs
  `pip install 'contrastive-jax[tfds]'`): its `image`, `label` and captions (a `caption`
  / `text` string, or `captions/text` as in `coco_captions`), images encoded as `--encode`.
* `builtin:sklearn_digits`, `builtin:cmudict`, `builtin:shapes` (the generated image-text
  set: `--num-examples`, `--seed`, `--image-size`, `--encode`): all their splits at once.

Files and TFDS write one split per command (`--split`, default "train"); run it again
with another split and the same DIR to add one. Image files are stored as they are;
every image is decoded once to check it. A bad input (an image that does not decode or
is missing, an empty caption) is reported on its own line as it is found, left out, and
counted in the metadata (`source.skipped`). Shards are written in parallel by `--workers`
processes; each shard is renamed into place when whole, and a rerun keeps the shards
already written, so an interrupted command is resumed by running it again.
"""

import argparse
import csv
import dataclasses
import io
import json
import multiprocessing
import os
import sys
import tarfile
from collections.abc import Iterator, Sequence

import numpy as np
from PIL import Image

from contrastive_jax import records
from contrastive_jax.config_lib import ConfigError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
RECORDS_PER_SHARD = 10_000
MAX_REASONS_KEPT = 20
_PROGRESS = ".progress"  # per-shard results of a finished shard, for a rerun


@dataclasses.dataclass(frozen=True)
class BadInput:
    """An input left out, and why (`where`: the file / row / key)."""

    where: str
    reason: str


def _checked_image(encoded: bytes, where: str) -> bytes | BadInput:
    """`encoded` if it decodes as an image, else why not."""
    try:
        with Image.open(io.BytesIO(encoded)) as image:
            image.load()
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ...
        return BadInput(where, f"the image does not decode ({type(e).__name__}: {e})")
    return encoded


def _caption_example(image: bytes | None, captions: Sequence[str], label, where: str) -> dict | BadInput:
    """A record of an image, its captions and optional label; or why it is left out."""
    if image is None:
        return BadInput(where, "the image file is missing")
    captions = [str(c) for c in captions]
    if not captions or not all(c.strip() for c in captions):
        return BadInput(where, "an empty caption")
    checked = _checked_image(image, where)
    if isinstance(checked, BadInput):
        return checked
    example = {"image": checked, "captions": captions}
    return example if label is None else example | {"label": int(label)}


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
        with open(path, newline="") as f:
            if kind == "csv":
                reader = csv.reader(f)
                header = next(reader)
                self.rows = [self._csv_row(header, values) for values in reader]
            else:
                self.rows = [json.loads(line) for line in f if line.strip()]
        if not self.rows or "image" not in self.rows[0]:
            raise ConfigError(f"--source={kind}:{path} has no rows with an `image` column; see --help.")
        self.has_label = "label" in self.rows[0]

    @staticmethod
    def _csv_row(header: list[str], values: list[str]) -> dict:
        row = {"captions": []}
        for name, value in zip(header, values):
            if name == "caption":
                row["captions"].append(value)
            elif name == "captions":
                row["captions"] += json.loads(value)
            else:
                row[name] = value
        return row

    @property
    def info(self) -> dict:
        return {"fields": ("image", "captions", *(("label",) if self.has_label else ()))}

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    def num_examples(self, split: str) -> int:
        return len(self.rows)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        folder = os.path.dirname(self.path)
        for number, row in enumerate(self.rows[start:stop], start):
            captions = row.get("captions", [])
            captions = [captions] if isinstance(captions, str) else list(captions)
            if "caption" in row:
                captions.insert(0, row["caption"])
            image = _read(os.path.join(folder, row["image"]))
            where = f"{self.path} row {number + 1} ({row['image']})"
            yield _caption_example(image, captions, row.get("label"), where)


class WebDatasetSource:
    """A folder of WebDataset tar shards (`key.jpg` + `key.txt` / `key.json` [+ `key.cls`])."""

    def __init__(self, folder: str, split: str):
        tars = (
            sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".tar"))
            if (os.path.isdir(folder))
            else []
        )
        if not tars:
            raise ConfigError(f"--source=webdataset:{folder}: no .tar files there; give the folder of the shards.")
        self.split_name = split
        self.items: list[tuple[str, str, dict[str, str]]] = []  # (tar, key, suffix -> member)
        for tar in tars:
            with tarfile.open(tar) as archive:
                by_key: dict[str, dict[str, str]] = {}
                for member in archive.getmembers():
                    if member.isfile():
                        key, suffix = os.path.splitext(member.name)
                        by_key.setdefault(key, {})[suffix.lower()] = member.name
            self.items += [(tar, key, files) for key, files in by_key.items()]
        self.has_label = any(".cls" in files for _, _, files in self.items)

    @property
    def info(self) -> dict:
        return {"fields": ("image", "captions", *(("label",) if self.has_label else ()))}

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    def num_examples(self, split: str) -> int:
        return len(self.items)

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        archives: dict[str, tarfile.TarFile] = {}
        try:
            for tar, key, files in self.items[start:stop]:
                archive = archives.setdefault(tar, tarfile.open(tar))
                contents = {suffix: archive.extractfile(name).read() for suffix, name in files.items()}
                captions = []
                if ".json" in contents:
                    meta = json.loads(contents[".json"])
                    captions = meta.get("captions") or [meta.get("caption", "")]
                elif ".txt" in contents:
                    captions = [contents[".txt"].decode("utf-8")]
                label = int(contents[".cls"].decode().strip()) if ".cls" in contents else None
                image = next((contents[s] for s in IMAGE_SUFFIXES if s in contents), None)
                yield _caption_example(image, captions, label, f"{tar} key {key}")
        finally:
            for archive in archives.values():
                archive.close()


class TfdsSource:
    """A TFDS dataset's split (TensorFlow, only here)."""

    def __init__(self, name: str, split: str, data_dir: str | None, image_format: str):
        try:
            import tensorflow_datasets as tfds
        except ImportError:
            raise ConfigError(
                f"--source=tfds:{name} needs TensorFlow Datasets: pip install 'contrastive-jax[tfds]'."
            ) from None
        builder = tfds.builder(name, data_dir=data_dir)
        builder.download_and_prepare()
        self.name, self.split_name, self.data_dir, self.image_format = name, split, data_dir, image_format
        self.size = builder.info.splits[split].num_examples
        features = builder.info.features
        self.has_label = "label" in features
        self.caption_path = next(
            (path for path in (("captions", "text"), ("caption",), ("text",)) if _has_feature(features, path)), None
        )
        self.channels = features["image"].shape[-1] if "image" in features else 3

    @property
    def info(self) -> dict:
        fields = ("image", *(("captions",) if self.caption_path else ()), *(("label",) if self.has_label else ()))
        return {"fields": fields, "image_channels": 1 if self.channels == 1 else 3}

    def splits(self) -> tuple[str, ...]:
        return (self.split_name,)

    def num_examples(self, split: str) -> int:
        return self.size

    def examples(self, split: str, start: int, stop: int) -> Iterator[dict | BadInput]:
        import tensorflow_datasets as tfds

        dataset = tfds.load(self.name, split=f"{split}[{start}:{stop}]", data_dir=self.data_dir, shuffle_files=False)
        for number, example in enumerate(tfds.as_numpy(dataset), start):
            out = {"image": _encode(example["image"], self.image_format)}
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


def _encode(pixels: np.ndarray, image_format: str) -> bytes:
    """uint8 [H, W, C] pixels as PNG (lossless) or JPEG (quality 95) bytes."""
    image = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    out = io.BytesIO()
    image.save(out, "JPEG" if image_format == "jpeg" else "PNG", quality=95)
    return out.getvalue()


class BuiltinSource:
    """A built-in dataset module of `contrastive_jax.datasets` (all its splits)."""

    def __init__(self, module, splits: Sequence[str]):
        self.module, self._splits = module, tuple(splits)
        self.info = module.INFO

    def splits(self) -> tuple[str, ...]:
        return self._splits

    def num_examples(self, split: str) -> int:
        return self.module.num_examples(split)

    def examples(self, split: str, start: int, stop: int):
        return self.module.examples(split, start, stop)


def open_source(spec: str, args: argparse.Namespace):
    """The source `spec` names (see the module docstring), with the command's options."""
    kind, _, where = spec.partition(":")
    if kind in ("csv", "jsonl"):
        return TableSource(where, args.split, kind)
    if kind == "webdataset":
        return WebDatasetSource(where, args.split)
    if kind == "tfds":
        return TfdsSource(where, args.split, args.tfds_data_dir, args.encode)
    if kind == "builtin":
        from contrastive_jax.datasets import cmudict, shapes, sklearn_digits

        if where == "sklearn_digits":
            return BuiltinSource(sklearn_digits, sklearn_digits.split_indices())
        if where == "cmudict":
            return BuiltinSource(cmudict, cmudict.SPLITS)
        if where == "shapes":
            return shapes.Shapes(args.num_examples, args.seed, args.image_size, args.encode)
    raise ConfigError(
        f"--source={spec!r} is not a source; use csv:FILE, jsonl:FILE, webdataset:FOLDER, tfds:NAME or "
        "builtin:sklearn_digits|cmudict|shapes."
    )


def _write_shard(task: tuple) -> dict:
    """Writes one shard (a range of a split) and returns what the metadata needs of it."""
    source, split, start, stop, path = task
    progress = os.path.join(os.path.dirname(path), _PROGRESS, os.path.basename(path) + ".json")
    if os.path.exists(path) and os.path.exists(progress):
        with open(progress) as f:
            return json.load(f) | {"kept": True}
    labels, skipped, longest = [], [], 0

    def good_examples():
        nonlocal longest
        for example in source.examples(split, start, stop):
            if isinstance(example, BadInput):
                print(f"skipped {example.where}: {example.reason}", file=sys.stderr, flush=True)
                skipped.append(f"{example.where}: {example.reason}")
                continue
            if "label" in example:
                labels.append(example["label"])
            longest = max(longest, len(example.get("text", "").encode()), len(example.get("sequence", ())))
            yield example

    count = records.write_shard(path, good_examples())
    result = {"num_records": count, "labels": labels, "skipped": skipped, "longest": longest}
    os.makedirs(os.path.dirname(progress), exist_ok=True)
    with open(progress, "w") as f:
        json.dump(result, f)
    return result


def write(source_spec, out: str, *, split: str = "train", shards: int = 0, workers: int = 1, **options):
    """Writes the source `source_spec` (a spec string, or an opened source) as a record
    set in `out`, adding its split(s) to a set already there; returns the metadata.

    Options are the command's: `encode`, `tfds_data_dir`, `num_examples`, `seed`,
    `image_size` (see `main`'s flags).
    """
    args = argparse.Namespace(split=split, **(_DEFAULTS | options))
    source = open_source(source_spec, args) if isinstance(source_spec, str) else source_spec
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    existing = records.read_metadata(out) if os.path.exists(os.path.join(out, records.METADATA_FILE)) else None
    splits = dict(existing.splits) if existing else {}
    skipped, longest, num_classes = [], 0, existing.num_classes if existing else 0
    for name in source.splits():
        size = source.num_examples(name)
        count = shards or max(1, -(-size // RECORDS_PER_SHARD))
        bounds = [size * k // count for k in range(count + 1)]
        tasks = [
            (source, name, bounds[k], bounds[k + 1], os.path.join(out, records.shard_name(name, k, count)))
            for k in range(count)
        ]
        results = _run(tasks, workers)
        splits[name] = records.Split(
            tuple(os.path.basename(t[4]) for t in tasks), tuple(r["num_records"] for r in results)
        )
        labels = [label for r in results for label in r["labels"]]
        if labels:
            np.save(records.labels_file(out, name), np.asarray(labels, np.int32))
            num_classes = max(num_classes, max(labels) + 1)
        skipped += [reason for r in results for reason in r["skipped"]]
        longest = max([longest, *(r["longest"] for r in results)])
    info = dict(source.info)
    metadata = records.Metadata(
        directory=out,
        splits=splits,
        fields=tuple(info.pop("fields")),
        num_classes=info.pop("num_classes", num_classes),
        max_text_length=info.pop("max_text_length", longest),
        source={
            "spec": source_spec if isinstance(source_spec, str) else type(source).__name__,
            "skipped": len(skipped),
            "skipped_first": skipped[:MAX_REASONS_KEPT],
        },
        **info,
    )
    if existing and existing.fields != metadata.fields:
        raise ConfigError(
            f"{out} holds records with fields {existing.fields}, these have {metadata.fields}; write to another --out."
        )
    records.write_metadata(metadata)
    return metadata


def _run(tasks: list[tuple], workers: int) -> list[dict]:
    """Each task's `_write_shard` result, in order, on `workers` processes."""

    def report(k, result):
        kept = " (kept from an earlier run)" if result.get("kept") else ""
        print(f"{os.path.basename(tasks[k][4])}: {result['num_records']} records{kept}", file=sys.stderr, flush=True)

    if workers <= 1 or len(tasks) == 1:
        results = []
        for k, task in enumerate(tasks):
            results.append(_write_shard(task))
            report(k, results[-1])
        return results
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = []
        for k, result in enumerate(pool.imap(_write_shard, tasks)):
            report(k, result)
            results.append(result)
        return results


_DEFAULTS = {"encode": "png", "tfds_data_dir": None, "num_examples": 10_000, "seed": 0, "image_size": 64}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m contrastive_jax.write_records",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument(
        "--source", required=True, help="csv:FILE, jsonl:FILE, webdataset:FOLDER, tfds:NAME, builtin:NAME"
    )
    parser.add_argument("--out", required=True, help="the record set's directory (created; splits are added)")
    parser.add_argument("--split", default="train", help="the split written (files, TFDS)")
    parser.add_argument("--shards", type=int, default=0, help=f"shards per split; 0: one per {RECORDS_PER_SHARD:,}")
    parser.add_argument("--workers", type=int, default=1, help="processes writing shards in parallel")
    parser.add_argument("--encode", choices=("png", "jpeg"), default="png", help="decoded images (TFDS, shapes)")
    parser.add_argument("--tfds-data-dir", default=None, help="TFDS data_dir (tfds: sources)")
    parser.add_argument("--num-examples", type=int, default=10_000, help="builtin:shapes: pictures in all")
    parser.add_argument("--seed", type=int, default=0, help="builtin:shapes: the seed")
    parser.add_argument("--image-size", type=int, default=64, help="builtin:shapes: pixels per side")
    args = parser.parse_args(argv)
    options = {k: getattr(args, k) for k in _DEFAULTS}
    try:
        metadata = write(args.source, args.out, split=args.split, shards=args.shards, workers=args.workers, **options)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{name} {split.num_records:,}" for name, split in metadata.splits.items())
    print(f"wrote {metadata.directory}: {counts} records; {metadata.source['skipped']} inputs skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
