"""Text tokenizers for captions and texts: bytes (the default), SentencePiece, a
Hugging Face `tokenizers` JSON file, or the tokenizers of released CLIP and SigLIP
models (`config.data.tokenizer`).

Every tokenizer maps a string to int32 [length] ids. The project's own tokenizers
truncate and 0-pad, with 0 meaning padding alone (the text encoders take `tokens > 0`
as the mask): bytes are 1 + the UTF-8 byte (vocabulary 257); a SentencePiece or
`tokenizers` model's ids are shifted by one (vocabulary: the model's size + 1).

The released models' tokenizers give those models' own ids, unshifted, padded as the
models were trained, so 0 is NOT padding alone there (it is CLIP's "!" and SigLIP's
`<pad>`); released towers find their text's end by their own rule, not `tokens > 0`:

- a `.txt.gz` spec: CLIP's byte-level BPE from OpenAI's / open_clip's merges file
  `bpe_simple_vocab_16e6.txt.gz` (vocabulary 49408): `[<start_of_text>, ids...,
  <end_of_text>]`, cut keeping `<end_of_text>` last, 0-padded, as open_clip's
  `tokenize` gives them;
- a `siglip:PATH` spec: SigLIP's SentencePiece model (c4_en or mc4) as big_vision's
  SigLIP configs tokenize (`tokenize(eos="sticky", pad_value=1)`): ASCII letters
  lower-cased, EOS appended and kept last when cut, padded with EOS (id 1 in both);
- a `siglip2:PATH` spec: SigLIP 2's Gemma SentencePiece model as its big_vision demo
  tokenizes (`lower|tok(bos="no", eos="sticky")`): the same but padded with the
  model's `<pad>` (Gemma's 0).

A model file's tokenizer reads the file when loaded (for `vocab_size`) and pickles as
its path and options alone (grain's worker processes receive it), reading the file
again on its first use there. The `sentencepiece` and `tokenizers` packages (the
`text` extra) and `regex` and `ftfy` (the `released` extra, for CLIP's BPE) are
imported only for their files.
"""

import gzip
import html
import math
import os
import string
from collections.abc import Sequence

import numpy as np

from contrastive_jax.errors import ConfigError

BYTES = "bytes"


class Tokenizer:
    """A string -> ids map; subclasses give `vocab_size` and `_ids`."""

    vocab_size: int

    def _ids(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str, length: int) -> np.ndarray:
        """int32 [length]: the text's ids (all > 0), truncated, then 0-padded."""
        ids = np.asarray(self._ids(text)[:length], np.int32)
        return np.pad(ids, (0, length - len(ids)))

    def encode_batch(self, texts: Sequence[str], length: int) -> np.ndarray:
        """int32 [n, length]: `encode` of each of the n texts."""
        ids = [self.encode(text, length) for text in texts]
        return np.stack(ids) if ids else np.zeros((0, length), np.int32)

    def text_ends(self) -> tuple[tuple[int, ...], int | None]:
        """`(start, end)`: the ids every text starts with and the id that ends it, as a
        captioning model generates them (`()` and None where the tokenizer adds none)."""
        return (), None

    def decode(self, ids: Sequence[int]) -> str | None:
        """The text of ids `[length]` (a generated caption), or None where this tokenizer
        has no way back."""
        return None


def _sticky_end(ids: list[int], length: int, pad: int) -> np.ndarray:
    """int32 [length]: `ids` (ending in an end token) cut to `length` with that end
    token kept last (open_clip's `tokenize`, big_vision's `eos="sticky"`), or padded
    with `pad`."""
    if len(ids) > length:
        ids = ids[: length - 1] + ids[-1:]
    return np.pad(np.asarray(ids, np.int32), (0, length - len(ids)), constant_values=pad)


class ByteTokenizer(Tokenizer):
    """1 + each UTF-8 byte: no vocabulary file, any language."""

    vocab_size = 257

    def _ids(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        """The UTF-8 text of byte ids `[length]`, padding (0) left out, bad bytes replaced."""
        return bytes(int(i) - 1 for i in ids if 0 < i <= 256).decode("utf-8", errors="replace")


class _ModelFile(Tokenizer):
    """A tokenizer model read from `path` on first use (and after unpickling); its
    ids + `shift` (1: the project's, 0 kept for padding; 0: a released model's)."""

    packages: tuple[str, ...] = ()
    extra = "text"
    what = ""  # "is not a {what}"
    shift = 1

    def __init__(self, path: str):
        self.path = path
        self._model = None
        self.vocab_size = self._loaded_size() + self.shift

    def __getstate__(self):
        return {key: value for key, value in self.__dict__.items() if key != "_model"}

    def __setstate__(self, state):
        self.__dict__.update(state, _model=None)

    def model(self):
        if self._model is None:
            self._model = self._load()
        return self._model

    def _load(self):
        raise NotImplementedError

    def _loaded_size(self) -> int:
        raise NotImplementedError


class SentencePieceTokenizer(_ModelFile):
    """A SentencePiece `.model` file; ids + 1."""

    packages = ("sentencepiece",)
    what = "sentencepiece model file"

    def _load(self):
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=self.path)

    def _loaded_size(self) -> int:
        return self.model().get_piece_size()

    def _ids(self, text: str) -> list[int]:
        return [i + self.shift for i in self.model().encode(text)]


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


class SigLipTokenizer(SentencePieceTokenizer):
    """A SentencePiece `.model` file as big_vision tokenized SigLIP's captions: the
    model's own ids (unshifted; vocabulary: the model's size) of the text with its
    ASCII letters lower-cased (`tf.strings.lower` without an encoding: "É" stays),
    then EOS; cut to the length with EOS kept last (`eos="sticky"`), padded with
    `pad`: "eos" for SigLIP (its configs' `pad_value=1`, `</s>` in c4_en and mc4, as
    Hugging Face's `SiglipTokenizer` pads too), "pad" (the model's `<pad>`) for
    SigLIP 2's Gemma model. Padding is not 0 here, and a SigLIP tower reads its last
    token, so the project's `tokens > 0` mask does not apply.

    Hugging Face's `SiglipTokenizer` lower-cases all letters and drops ASCII
    punctuation first (big_vision's zero-shot prompt canonicalization, which its
    training captions did not get); ids differ from these on such texts.
    """

    shift = 0

    def __init__(self, path: str, pad: str = "eos"):
        if pad not in ("eos", "pad"):
            raise ValueError(f"pad={pad!r}: use 'eos' (SigLIP) or 'pad' (SigLIP 2)")
        self.pad = pad
        super().__init__(path)
        if min(self.model().eos_id(), self._pad_id()) < 0:
            raise ValueError(f"the model has no {'EOS' if self.model().eos_id() < 0 else '<pad>'} piece")

    def _pad_id(self) -> int:
        model = self.model()
        return model.eos_id() if self.pad == "eos" else model.pad_id()

    def _ids(self, text: str) -> list[int]:
        model = self.model()
        return model.encode(text.translate(_ASCII_LOWER)) + [model.eos_id()]

    def encode(self, text: str, length: int) -> np.ndarray:
        """int32 [length]: the text's ids then EOS, EOS kept last if cut, padded."""
        return _sticky_end(self._ids(text), length, self._pad_id())


class HuggingFaceTokenizer(_ModelFile):
    """A Hugging Face `tokenizers` JSON file (`tokenizer.json`); ids + 1, no special
    tokens added."""

    packages = ("tokenizers",)
    what = "tokenizers model file"

    def _load(self):
        import tokenizers

        return tokenizers.Tokenizer.from_file(self.path)

    def _loaded_size(self) -> int:
        return self.model().get_vocab_size(with_added_tokens=True)

    def _ids(self, text: str) -> list[int]:
        return [i + self.shift for i in self.model().encode(text, add_special_tokens=False).ids]


_CLIP_MERGES = 49152 - 256 - 2  # the merges file's lines 1..48894 (line 0 is a header)
_CLIP_SPECIALS = ("<start_of_text>", "<end_of_text>")  # ids 49406, 49407
_CLIP_PATTERN = r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def _bytes_to_unicode() -> dict[int, str]:
    """{byte: character} for the 256 bytes, printable ones as themselves, the others
    as chr(256 + n): GPT-2's and CLIP's reversible byte alphabet, in CLIP's order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    return dict(zip(kept + moved, [chr(b) for b in kept] + [chr(256 + n) for n in range(len(moved))]))


def _merge(word: list[str], pair: tuple[str, str]) -> list[str]:
    """`word` with each occurrence of `pair`, left to right, joined into one symbol."""
    merged, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return merged


class _ClipBpe:
    """CLIP's BPE (OpenAI's `simple_tokenizer.py`, open_clip's `SimpleTokenizer` with
    its default "lower" cleaning) from the merges file at `path`."""

    def __init__(self, path: str):
        import ftfy
        import regex

        with gzip.open(path) as file:
            lines = file.read().decode("utf-8").split("\n")
        merges = [tuple(line.split()) for line in lines[1 : _CLIP_MERGES + 1]]
        if len(merges) != _CLIP_MERGES or any(len(merge) != 2 for merge in merges):
            raise ValueError(f"expected {_CLIP_MERGES} merges, a pair a line, after its first line")
        self.byte_char = _bytes_to_unicode()
        chars = list(self.byte_char.values())
        pieces = chars + [c + "</w>" for c in chars] + ["".join(merge) for merge in merges] + list(_CLIP_SPECIALS)
        self.encoder = {piece: i for i, piece in enumerate(pieces)}
        self.ranks = {merge: i for i, merge in enumerate(merges)}
        self.cache = {special: [special] for special in _CLIP_SPECIALS}
        self.pattern = regex.compile("|".join(_CLIP_SPECIALS) + _CLIP_PATTERN, regex.IGNORECASE)
        self.fix_text = ftfy.fix_text

    def bpe(self, token: str) -> list[str]:
        """The pieces of one pre-token (its bytes as `byte_char`s); `</w>` ends the last."""
        if token in self.cache:
            return self.cache[token]
        word = [*token[:-1], token[-1] + "</w>"]
        while len(word) > 1:
            pair = min(zip(word, word[1:]), key=lambda pair: self.ranks.get(pair, math.inf))
            if pair not in self.ranks:
                break
            word = _merge(word, pair)
        if len(self.cache) > 100_000:  # a bound for long-running workers
            self.cache = {special: [special] for special in _CLIP_SPECIALS}
        self.cache[token] = word
        return word

    def encode(self, text: str) -> list[int]:
        """The ids of `text` (no start or end), cleaned as open_clip does: ftfy, HTML
        entities unescaped twice, whitespace runs made one space, lower-cased."""
        text = html.unescape(html.unescape(self.fix_text(text)))
        text = " ".join(text.split()).lower()
        ids = []
        for token in self.pattern.findall(text):
            chars = "".join(self.byte_char[b] for b in token.encode("utf-8"))
            ids.extend(self.encoder[piece] for piece in self.bpe(chars))
        return ids


class ClipBpeTokenizer(_ModelFile):
    """CLIP's byte-level BPE from OpenAI's / open_clip's merges file
    (`bpe_simple_vocab_16e6.txt.gz`): CLIP's ids, unshifted (vocabulary 49408),
    `[<start_of_text> 49406, ids..., <end_of_text> 49407]` cut to the length with
    `<end_of_text>` kept last, then 0-padded: open_clip's `tokenize`. Its 0 is also
    "!", so the project's `tokens > 0` mask does not apply (CLIP reads the position
    of its largest id, the end). A text's literal `<start_of_text>` or
    `<end_of_text>` becomes that token, as in open_clip.
    """

    packages = ("regex", "ftfy")
    extra = "released"
    what = "gzip'd CLIP BPE merges file"
    shift = 0

    def _load(self):
        return _ClipBpe(self.path)

    def _loaded_size(self) -> int:
        return len(self.model().encoder)

    def _ids(self, text: str) -> list[int]:
        start, end = (self.model().encoder[special] for special in _CLIP_SPECIALS)
        return [start, *self.model().encode(text), end]

    def encode(self, text: str, length: int) -> np.ndarray:
        """int32 [length]: start, the text's ids, end (kept last if cut), 0-padded."""
        return _sticky_end(self._ids(text), length, 0)

    def text_ends(self) -> tuple[tuple[int, ...], int | None]:
        """`((<start_of_text>,), <end_of_text>)`: 49406 and 49407."""
        start, end = (self.model().encoder[special] for special in _CLIP_SPECIALS)
        return (start,), end

    def decode(self, ids: Sequence[int]) -> str:
        """open_clip's `SimpleTokenizer.decode` of the ids after `<start_of_text>` and before
        `<end_of_text>`: the pieces' bytes as UTF-8, `</w>` as a space, stripped."""
        (start,), end = self.text_ends()
        ids = [int(i) for i in ids]
        ids = ids[: ids.index(end)] if end in ids else ids
        pieces = {i: piece for piece, i in self.model().encoder.items()}
        chars = {char: byte for byte, char in self.model().byte_char.items()}
        text = "".join(pieces[i] for i in ids if i != start)
        return bytearray(chars.get(c, 32) for c in text.replace("</w>", " ")).decode("utf-8", errors="replace").strip()


_BY_SUFFIX = {".model": SentencePieceTokenizer, ".json": HuggingFaceTokenizer, ".txt.gz": ClipBpeTokenizer}
_BY_PREFIX = {"siglip:": (SigLipTokenizer, {"pad": "eos"}), "siglip2:": (SigLipTokenizer, {"pad": "pad"})}


def _parse(spec: str) -> tuple[type[_ModelFile], str, dict]:
    """(the tokenizer class, the file's path, its options) of a model-file `spec`."""
    for prefix, (kind, options) in _BY_PREFIX.items():
        if spec.startswith(prefix):
            return kind, spec[len(prefix) :], options
    for suffix, kind in _BY_SUFFIX.items():
        if spec.endswith(suffix):
            return kind, spec, {}
    raise ConfigError(
        f"config.data.tokenizer={spec!r} is not a tokenizer; use 'bytes', a SentencePiece .model "
        "file, a Hugging Face tokenizers .json file, CLIP's BPE .txt.gz file, or 'siglip:' or "
        "'siglip2:' and a SentencePiece .model file."
    )


def model_file(spec: str) -> str | None:
    """The path of the model file tokenizer `spec` reads, as the spec gives it; None for
    "bytes".

    Raises:
      ConfigError: an unknown spec.
    """
    return None if spec == BYTES else _parse(spec)[1]


def absolute(spec: str) -> str:
    """`spec` with its model file's absolute path (it then names the file from any directory)."""
    path = model_file(spec)
    return spec if path is None else spec[: len(spec) - len(path)] + os.path.abspath(path)


def load(spec: str) -> Tokenizer:
    """The tokenizer `spec` names: "bytes"; a SentencePiece `.model` or a `tokenizers`
    `.json` file (ids + 1); CLIP's BPE merges file, a path ending `.txt.gz`
    (open_clip's `bpe_simple_vocab_16e6.txt.gz`; CLIP's ids); "siglip:PATH" or
    "siglip2:PATH", a SentencePiece `.model` file tokenizing as SigLIP's or SigLIP 2's
    training did (big_vision; the model's ids). See the module docstring.

    Raises:
      ConfigError: an unknown spec, a missing or unreadable file, or its package not
        installed.
    """
    if spec == BYTES:
        return ByteTokenizer()
    kind, path, options = _parse(spec)
    if not os.path.isfile(path):
        raise ConfigError(f"config.data.tokenizer={spec!r}: no such file; give the path of the model file.")
    for package in kind.packages:
        try:
            __import__(package)
        except ImportError:
            raise ConfigError(
                f"config.data.tokenizer={spec!r} needs the {package} package: "
                f"pip install 'contrastive-jax[{kind.extra}]'."
            ) from None
    try:
        return kind(os.path.abspath(path), **options)
    except Exception as error:  # sentencepiece raises RuntimeError, tokenizers a bare Exception, gzip OSError
        raise ConfigError(
            f"config.data.tokenizer={spec!r} is not a {kind.what} ({error}); give a SentencePiece .model, "
            "a tokenizers tokenizer.json or CLIP's bpe_simple_vocab_16e6.txt.gz file."
        ) from None
