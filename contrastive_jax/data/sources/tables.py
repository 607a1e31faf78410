"""CSV and JSONL tables of (image path, caption(s)[, label][, negatives]) rows (`csv:FILE`,
`jsonl:FILE`), read as streams: once to index them (a byte offset every `INDEX_EVERY`
rows), then each range from the nearest offset.

`negatives` (a JSON list in a CSV cell, a list in JSONL) holds a row's hard-negative
texts, or in a table without captions (images alone) the paths of its hard-negative
images, M of them in every row (M is the first row's; a row with another count, an
empty text or an image that does not decode is a bad input), written to the records'
`negatives` field (`losses.hard_negatives`)."""

import collections
import csv
import json
import os
from collections.abc import Iterator

from contrastive_jax.data.sources.file_source import BadInput, FileSource, caption_example, label_value, read_bytes
from contrastive_jax.errors import ConfigError

INDEX_EVERY = 1024  # a table's rows between two indexed byte offsets


class TableSource(FileSource):
    """A CSV or JSONL file of (image path, caption(s)[, label][, negatives]) rows, read as
    a stream; without a caption in any row, a set of images alone (`has_captions` False:
    tasks "views" and "labeled"), whose `negatives` are image paths."""

    def __init__(self, path: str, split: str, kind: str):
        if not os.path.isfile(path):
            raise ConfigError(f"--source={kind}:{path}: no such file; give the path of the {kind.upper()} file.")
        self.path, self.kind, self.split_name, self.options = os.path.abspath(path), kind, split, {}
        self.header: list[str] = []
        self.offsets: list[tuple[int, int]] = []  # (byte offset, row number) of rows 0, INDEX_EVERY, ...
        self.labels, self.size, has_image = collections.Counter(), 0, False
        self.num_negatives, self.has_captions = 0, False  # M: the first row's count (0: none)
        for offset, number, row in self._rows(None):
            if self.size % INDEX_EVERY == 0:
                self.offsets.append((offset, number))
            self.size += 1
            if isinstance(row, dict):
                has_image = has_image or "image" in row
                self.has_captions = self.has_captions or bool(row["captions"])
                self.num_negatives = self.num_negatives or _count(row.get("negatives"))
                if (label := label_value(row.get("label"))) is not None:
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
            data = read_bytes(os.path.join(folder, image)) if image else None
            captions = row["captions"] if self.has_captions else None
            example = caption_example(data, captions, label_value(row.get("label")), where, labels=self._labels)
            yield self.with_negatives(example, row.get("negatives"), where, folder)


def _csv_row(header: list[str], values: list[str]) -> dict | str:
    """A CSV row as {"image", "captions", ["label"]} (every `caption` column and the JSON
    list of a `captions` column), or why it is not one."""
    row = {"captions": []}
    for name, value in zip(header, values):
        if name == "caption":
            row["captions"].append(value)
        elif name == "negatives":
            try:
                row[name] = json.loads(value) if value.strip() else []
            except json.JSONDecodeError as e:
                return f"its negatives are not a JSON list ({e})"
        elif name == "captions":
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                return f"its captions are not a JSON list ({e})"
            row["captions"] += value if isinstance(value, list) else [value]
        else:
            row[name] = value
    return row


def _count(negatives) -> int:
    """The number of hard negatives a row holds (0 unless a list)."""
    return len(negatives) if isinstance(negatives, list) else 0


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
