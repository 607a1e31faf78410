"""Writes training data as a record set: `python -m contrastive_jax.write_records`.

Usage::

    python -m contrastive_jax.write_records --source=SOURCE --out=DIR [--split=NAME]
        [--shards=N] [--workers=K] [--encode=png|jpeg] [--tfds-data-dir=DIR]
        [--num-examples=N --seed=S --image-size=PX]   (builtin:shapes)

SOURCE is one of:

* `csv:FILE` or `jsonl:FILE`: one example a row: `image` (a path, relative to the
  file's folder or absolute), `caption` (one) or `captions` (a JSON list; in a CSV, also
  several `caption` columns), optionally `label`. Read as a stream (one pass to index it).
* `parquet:FILES` (a file, a folder of `*.parquet` or a glob; needs pyarrow:
  `pip install 'contrastive-jax[parquet]'`): as img2dataset and Hugging Face datasets
  write them, read in batches: the image column (`--image-column`; default the first of
  `image`, `jpg`, `png`, `webp`) holds the image file's bytes, a path or a Hugging Face
  `{bytes, path}` struct; the caption column (`--caption-column`; default `caption`,
  `captions` or `text`) a string or a list; the label column (`--label-column`; default
  `label` when there is one).
* `webdataset:FOLDER`: every `*.tar` in it, as img2dataset writes them: per key an image
  (`.jpg`, `.jpeg`, `.png`, `.webp`), its caption(s) from `.json` (`captions` or
  `caption`) or `.txt`, optionally a label (`.cls`, or the `.json`'s `label`).
* `folder:DIR`: one subfolder per class, as torchvision's ImageFolder reads it
  (`DIR/<class name>/<image>`); an image's caption, optional, is the `.txt` file of the
  same stem beside it.
* `tfds:NAME`: a TFDS dataset's split (`--tfds-data-dir`; needs
  `pip install 'contrastive-jax[tfds]'`): its `image`, `label` and captions (a `caption`
  / `text` string, or `captions/text` as in `coco_captions`), images encoded as `--encode`.
* `builtin:sklearn_digits`, `builtin:cmudict`, `builtin:shapes` (the generated image-text
  set: `--num-examples`, `--seed`, `--image-size`, `--encode`): all their splits at once.

Labels are ints (class ids) or class names. Names are numbered in sorted order (as
torchvision's ImageFolder and Hugging Face's ClassLabel do; a folder's are always names),
and the names are kept in the metadata (`class_names`); a column of mostly ints is ids
(its names are bad inputs). A split added later is numbered as the set's first was: a
name the set does not have stops the command, naming it.

Files and TFDS write one split per command (`--split`, default "train"); run it again
with another split and the same DIR to add one (the metadata lists both). Image files are
stored as they are; every image is decoded once, as the reader decodes it, to check it.
A bad input (an image that is missing or does not decode, an empty caption, a label that
is not an id or a known name, a row that does not parse) is reported on its own line as it
is found (the first 20; the rest are counted), left out, and counted in the metadata
(`source.skipped`, the first reasons in `source.skipped_first`). More than `--max-bad` of
a split's inputs bad (a fraction, default 0.01) stops the command at once (exit status 2)
with the most common cause and the first five, and none of that split is kept. Shards
(independent ranges of the source) are written in parallel by `--workers` processes; each
is renamed into place when whole, and a rerun of the same command keeps the shards already
written, so an interrupted command is resumed by running it again. The metadata is written
last.
"""

import sys
from collections.abc import Sequence

from absl import flags

from contrastive_jax import console
from contrastive_jax.data.sources import SOURCES
from contrastive_jax.data.writer import MAX_BAD, RECORDS_PER_SHARD, write, write_builtin, write_builtin_of
from contrastive_jax.errors import ConfigError

__all__ = ["main", "write", "write_builtin", "write_builtin_of"]  # the public path of data.writer's writers


def _flags() -> flags.FlagValues:
    """The command's flags (absl, on their own `FlagValues`)."""
    values = flags.FlagValues()
    define = {str: flags.DEFINE_string, int: flags.DEFINE_integer, float: flags.DEFINE_float}
    for name, default, kind, help_ in (
        ("source", None, str, SOURCES),
        ("out", None, str, "the record set's directory (created; splits are added)"),
        ("split", "train", str, "the split written (files, TFDS)"),
        ("shards", 0, int, f"shards per split; 0: one per {RECORDS_PER_SHARD:,}"),
        ("workers", 1, int, "processes writing shards in parallel"),
        ("tfds-data-dir", None, str, "TFDS data_dir (tfds: sources)"),
        ("num-examples", 10_000, int, "builtin:shapes: pictures in all"),
        ("seed", 0, int, "builtin:shapes: the seed"),
        ("image-size", 64, int, "builtin:shapes: pixels a side"),
        ("max-bad", MAX_BAD, float, "the share of a split's inputs that may be bad (left out)"),
        ("image-column", None, str, "parquet: the image column (bytes, path or struct)"),
        ("caption-column", None, str, "parquet: the caption column"),
        ("label-column", None, str, "parquet: the label column (ids or names)"),
    ):
        define[kind](name, default, help_, flag_values=values)
    flags.DEFINE_enum("encode", "png", ("png", "jpeg"), "decoded images (TFDS, shapes)", flag_values=values)
    return values


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (the module docstring): one source written, or one line and exit
    status 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    values = console.parse_flags(
        argv, _flags(), prog="python -m contrastive_jax.write_records", doc=__doc__, required=("source", "out")
    )
    args = {name.replace("-", "_"): values[name].value for name in values}
    try:
        metadata = write(args.pop("source"), args.pop("out"), **args)
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{name} {split.num_records:,}" for name, split in metadata.splits.items())
    print(f"wrote {metadata.directory}: {counts} records; {metadata.source['skipped']} inputs skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
