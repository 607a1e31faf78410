"""The on-disk training data: ArrayRecord shards of msgpack records, and their metadata.

A record set is a directory::

    DIR/metadata.json                       what is in it (`Metadata`)
    DIR/<split>-00000-of-00008.array_record one shard: records in order
    DIR/<split>.labels.npy                  int32 [n]: the split's labels (when it has any),
                                            for class-balanced batches without a scan

A record is one example as stored, a msgpack map of these fields (each optional, but a
split's records all have the same ones, listed in the metadata)::

    image      bytes      the encoded image file as it was (JPEG, PNG, ...)
    captions   [str]      every caption of the image (one is drawn per visit)
    label      int        a class id in [0, num_classes) (its name: `Metadata.class_names`)
    text       str        a text paired with `sequence` (cmudict: the spelling)
    sequence   [int]      class ids paired with `text` (cmudict: the phonemes)
    negatives  [str]      the pair's M hard-negative texts (the same M in every record)
    <id key>   int        the dataset's grouping ids (`Metadata.id_keys`)

The writer (`write_records`) writes shards under temporary names and renames each when
it is whole, then the metadata last, so a reader never sees a half-written set and a
restarted writer keeps the shards already done. The reader (`input_pipeline`) reads
records by position: `RecordSet.read(i)` is record `i` of the split in shard order.
"""

import dataclasses
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from contrastive_jax.errors import ConfigError

FORMAT = "contrastive_jax.records"  # the format's name in metadata.json (the module's path when it was defined)
VERSION = 1
METADATA_FILE = "metadata.json"
SHARD_SUFFIX = ".array_record"
FIELDS = ("image", "captions", "label", "text", "sequence", "negatives")


class DataError(ConfigError):
    """A record set or one of its records cannot be read; the message names the shard,
    the record and the fix (one line; `main` exits with status 2)."""


@dataclasses.dataclass(frozen=True)
class Split:
    """One split of a record set: its shards (file names in `Metadata.directory`) and
    the number of records in each, in reading order."""

    shards: tuple[str, ...]
    shard_sizes: tuple[int, ...]

    @property
    def num_records(self) -> int:
        return sum(self.shard_sizes)


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What a record set holds (`DIR/metadata.json`).

    Attributes:
      directory: the record set's directory (not stored: where the file was read).
      splits: split name -> `Split`.
      fields: the record fields present (`FIELDS` and the id keys), e.g.
        ("image", "captions").
      id_keys: integer fields that group examples (e.g. cmudict's word / pronunciation
        ids), carried into batches and evaluation.
      match_keys: paired retrieval's (a -> b, b -> a) id keys: gallery item j answers
        query i when their ids are equal; None: only item i answers query i.
      num_classes: labels are in [0, num_classes); 0 when there are no labels.
      class_names: the classes' names by id, when known (the labels were written from
        names, or the source names its classes); () otherwise.
      image_channels: 1 (grey) or 3 (RGB): what every image is converted to.
      sequence_vocab_size: `sequence` ids are in [0, sequence_vocab_size); 0 when none.
      max_text_length: the longest `text` in bytes / `sequence` in ids (0 for captions).
      num_negatives: M, each record's count of hard-negative texts (`negatives`); 0 when none.
      source: how the set was written (the writer's command and source), for the record.
    """

    directory: str
    splits: Mapping[str, Split]
    fields: tuple[str, ...]
    id_keys: tuple[str, ...] = ()
    match_keys: tuple[str, str] | None = None
    num_classes: int = 0
    class_names: tuple[str, ...] = ()
    image_channels: int = 3
    sequence_vocab_size: int = 0
    max_text_length: int = 0
    num_negatives: int = 0
    source: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["directory"]
        out["splits"] = {
            name: {"shards": list(s.shards), "shard_sizes": list(s.shard_sizes)} for name, s in self.splits.items()
        }
        return {"format": FORMAT, "version": VERSION, **out}

    @classmethod
    def from_json(cls, directory: str, values: Mapping[str, Any]) -> "Metadata":
        values = dict(values)
        if values.pop("format", None) != FORMAT or values.pop("version", None) != VERSION:
            raise DataError(
                f"{os.path.join(directory, METADATA_FILE)} is not a {FORMAT} v{VERSION} metadata file; "
                "write the record set with `python -m contrastive_jax.write_records`."
            )
        splits = {
            name: Split(tuple(s["shards"]), tuple(int(n) for n in s["shard_sizes"]))
            for name, s in values.pop("splits").items()
        }
        match_keys = values.pop("match_keys", None)
        return cls(
            directory=directory,
            splits=splits,
            fields=tuple(values.pop("fields")),
            id_keys=tuple(values.pop("id_keys", ())),
            match_keys=None if match_keys is None else tuple(match_keys),
            class_names=tuple(values.pop("class_names", ())),
            **values,
        )

    def split(self, name: str) -> Split:
        """The split `name`, or the splits of "a+b" one after the other; DataError naming
        the splits there are when one is missing."""
        parts = name.split("+")
        missing = [part for part in parts if part not in self.splits]
        if missing:
            raise DataError(
                f"the record set {self.directory} has no split {missing[0]!r}; it has {sorted(self.splits)} "
                "(set config.data.train_split / config.eval.split to one of them, or join them with '+')."
            )
        return Split(
            tuple(shard for part in parts for shard in self.splits[part].shards),
            tuple(size for part in parts for size in self.splits[part].shard_sizes),
        )

    def has(self, field: str) -> bool:
        return field in self.fields


def parse_split(spec: str) -> tuple[str, slice]:
    """`"train+test[:2048]"` -> `("train+test", slice(None, 2048))`: the splits (joined
    with `+`) and an optional Python slice of their records, as TFDS writes it."""
    match = re.fullmatch(r"([^\[\]]+)(?:\[(-?\d*):(-?\d*)\])?", spec)
    if match is None:
        raise DataError(f"split {spec!r} is not NAME, NAME+NAME or NAME[start:stop]; e.g. 'test[:2048]'.")
    name, start, stop = match.groups()
    return name, slice(int(start) if start else None, int(stop) if stop else None)


def shard_name(split: str, index: int, count: int) -> str:
    """`<split>-00003-of-00008.array_record`."""
    return f"{split}-{index:05d}-of-{count:05d}{SHARD_SUFFIX}"


def labels_file(directory: str, split: str) -> str:
    return os.path.join(directory, f"{split}.labels.npy")


def read_metadata(directory: str | os.PathLike) -> Metadata:
    """The metadata of the record set in `directory`.

    Raises:
      DataError: no record set there, or its metadata is not this format's.
    """
    directory = os.path.abspath(os.fspath(directory))
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path):
        raise DataError(
            f"no record set in {directory} (no {METADATA_FILE}); write one with "
            "`python -m contrastive_jax.write_records --out=DIR ...` and set config.data.records=DIR."
        )
    with open(path) as f:
        return Metadata.from_json(directory, json.load(f))


def write_metadata(metadata: Metadata) -> None:
    """Writes `metadata.json` atomically (a reader sees the old file or the new one)."""
    path = os.path.join(metadata.directory, METADATA_FILE)
    with open(f"{path}.tmp", "w") as f:
        json.dump(metadata.to_json(), f, indent=1)
    os.replace(f"{path}.tmp", path)


def encode(example: Mapping[str, Any]) -> bytes:
    """One example (a dict of the record fields) as record bytes."""
    return msgpack.packb(dict(example), use_bin_type=True)


def decode(record: bytes) -> dict[str, Any]:
    """Record bytes as the example dict `encode` was given (lists for `captions`, `sequence`)."""
    return msgpack.unpackb(record, raw=False)


def write_shard(path: str, examples: Sequence[Mapping[str, Any]] | Iterator[Mapping[str, Any]]) -> int:
    """Writes `examples` to the ArrayRecord file `path` (via `path.tmp`, renamed when whole).

    Returns:
      The number of records written.
    """
    from array_record.python.array_record_module import ArrayRecordWriter

    tmp = f"{path}.tmp"
    # group_size:1 makes every record its own chunk: random access reads one record.
    writer = ArrayRecordWriter(tmp, "group_size:1")
    count = 0
    try:
        for example in examples:
            writer.write(encode(example))
            count += 1
    finally:
        writer.close()
    os.replace(tmp, path)
    return count


class RecordSet:
    """Random access to one split's records: `len(rs)` records, `rs.read(i)` the i-th's
    bytes in shard order. Opens the shards lazily (so it pickles to grain's workers) and
    checks each against the metadata's count when it opens it."""

    def __init__(self, metadata: Metadata, split: str):
        self.metadata = metadata
        self.split_name = split
        self.split = metadata.split(split)
        self._offsets = np.cumsum((0, *self.split.shard_sizes))
        for shard in self.split.shards:
            path = os.path.join(metadata.directory, shard)
            if not os.path.exists(path):
                raise DataError(
                    f"shard {path} of split {split!r} is missing; rerun the `write_records` command that "
                    "wrote the set (it writes only the missing shards)."
                )
        self._readers: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_readers"} | {"_readers": {}}

    def where(self, index: int) -> tuple[str, int]:
        """(shard path, position in it) of record `index`."""
        shard = int(np.searchsorted(self._offsets, index, side="right")) - 1
        return os.path.join(self.metadata.directory, self.split.shards[shard]), index - int(self._offsets[shard])

    def _reader(self, shard: int):
        if shard not in self._readers:
            from array_record.python.array_record_module import ArrayRecordReader

            path = os.path.join(self.metadata.directory, self.split.shards[shard])
            try:
                reader = ArrayRecordReader(path, "readahead_buffer_size:0")
                count = reader.num_records()
            except Exception as e:  # array_record raises a bare RuntimeError / ValueError
                raise DataError(
                    f"shard {path} cannot be read ({str(e).splitlines()[0][:200]}): it is truncated or "
                    "corrupt; delete it and rerun the `write_records` command that wrote the set."
                ) from None
            if count != self.split.shard_sizes[shard]:
                raise DataError(
                    f"shard {path} holds {count} records but {METADATA_FILE} says {self.split.shard_sizes[shard]}: "
                    "it is truncated or was changed after it was written; delete it and rerun the `write_records` "
                    "command that wrote the set."
                )
            self._readers[shard] = reader
        return self._readers[shard]

    def read(self, index: int) -> bytes:
        """The bytes of record `index` (0 <= index < len(self))."""
        return self.read_many([index])[0]

    def read_many(self, indices) -> list[bytes]:
        """The bytes of records `indices` (int [k]), in that order: one read per shard."""
        indices = np.asarray(indices, np.int64)
        shards = np.searchsorted(self._offsets, indices, side="right") - 1
        out: list[bytes] = [b""] * len(indices)
        for shard in np.unique(shards):
            where = np.flatnonzero(shards == shard)
            values = self._reader(int(shard)).read((indices[where] - self._offsets[shard]).tolist())
            for k, value in zip(where, values):
                out[k] = value
        return out

    def labels(self) -> np.ndarray:
        """int32 [n]: every record's label, from the `<split>.labels.npy` files."""
        parts = []
        for part in self.split_name.split("+"):
            path = labels_file(self.metadata.directory, part)
            if not os.path.exists(path):
                raise DataError(f"{path} is missing; rewrite the record set with `write_records`.")
            parts.append(np.load(path))
        labels = np.concatenate(parts).astype(np.int32)
        if len(labels) != len(self):
            raise DataError(
                f"the labels of split {self.split_name!r} in {self.metadata.directory} are {len(labels)} for "
                f"{len(self)} records; rewrite the record set."
            )
        return labels
