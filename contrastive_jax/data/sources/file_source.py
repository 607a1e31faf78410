"""What the file sources share: the record of an image with its captions and label
(`caption_example`), an input left out (`BadInput`), how labels become class ids
(`ClassLabels`), and `FileSource`, the base of the table, WebDataset, folder and Parquet
sources (one split; `splits`, `info`, `num_examples`, `label_counts`)."""

import collections
import copy
import dataclasses
import functools
import os
import re

from contrastive_jax.data import images

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
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


def caption_example(image: bytes | None, captions, label, where: str, *, labels: ClassLabels | None) -> dict | BadInput:
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
    if (why := _undecodable(image)) is not None:
        return BadInput(where, f"the image does not decode ({why})")
    example = {"image": image} | ({"captions": captions} if captions is not None else {})
    return example if labels is None else example | {"label": label}


def _undecodable(image: bytes) -> str | None:
    """Why an image file's bytes do not decode as the reader decodes them; None if they do."""
    try:
        images.decode(image, 3).load()
    except (ValueError, OSError) as e:
        return str(e)
    return None


def read_bytes(path: str) -> bytes | None:
    """The file's bytes; None when it cannot be read (missing, a folder, no permission)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def label_value(label):
    """A label as the counts and the records take it: text stripped, None when empty."""
    if isinstance(label, str):
        label = label.strip()
    return None if label in ("", None) else label


class FileSource:
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
    num_negatives: int = 0  # M: each input's hard-negative texts (0: none; `with_negatives`)

    def numbered(self, class_labels: ClassLabels) -> "FileSource":
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
        fields = ("image", *captions, *(("label",) if self.has_label else ()))
        if self.num_negatives:
            return {"fields": (*fields, "negatives"), "num_negatives": self.num_negatives}
        return {"fields": fields}

    def with_negatives(self, example: dict | BadInput, negatives, where: str, folder: str = "") -> dict | BadInput:
        """`example` with its input's `negatives` when the source has them: `num_negatives`
        texts, or with no captions (an image-image set) the bytes of `num_negatives` image
        files, their paths relative to `folder`; or why not (another count, an empty
        text, not a list of texts, an image missing or not decoding)."""
        if not self.num_negatives or isinstance(example, BadInput):
            return example
        if not isinstance(negatives, list) or not all(isinstance(t, str) and t.strip() for t in negatives):
            return BadInput(where, f"its negatives are not a list of texts ({negatives!r:.80})")
        if len(negatives) != self.num_negatives:
            return BadInput(where, f"{len(negatives)} negatives; the source's inputs have {self.num_negatives}")
        if self.has_captions:
            return example | {"negatives": negatives}
        files = [read_bytes(os.path.join(folder, path)) for path in negatives]
        for path, image in zip(negatives, files):
            if image is None or (why := _undecodable(image)) is not None:
                problem = "is missing" if image is None else f"does not decode ({why})"
                return BadInput(where, f"its negative {path} {problem}")
        return example | {"negatives": files}

    def num_examples(self, split: str) -> int:
        return self.size

    def label_counts(self, split: str) -> collections.Counter | None:
        """How often each label value occurs (missing ones not counted)."""
        return self.labels
