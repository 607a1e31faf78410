"""WebDataset tar shards (`webdataset:FOLDER`): `key.jpg` with `key.txt` or `key.json`
captions, and a label in `key.cls` or the `.json`."""

import collections
import json
import os
import tarfile
from collections.abc import Iterator

from contrastive_jax.data.sources.file_source import (
    IMAGE_SUFFIXES,
    BadInput,
    FileSource,
    caption_example,
    label_value,
)
from contrastive_jax.errors import ConfigError


class WebDatasetSource(FileSource):
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
                            if (label := label_value(label)) is not None:
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
        return caption_example(image, captions, label_value(_wds_label(contents)), where, labels=self._labels)


def _wds_label(contents: dict[str, bytes]):
    """A WebDataset key's label: its `.cls` file's text, else its `.json`'s `label`."""
    if ".cls" in contents:
        return contents[".cls"].decode("utf-8", "replace")
    try:
        meta = json.loads(contents.get(".json", b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return meta.get("label") if isinstance(meta, dict) else None
