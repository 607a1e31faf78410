"""Text tokenizers for captions and texts: bytes (the default), SentencePiece, or a
Hugging Face `tokenizers` JSON file (`config.data.tokenizer`).

Every tokenizer maps a string to int32 [length] ids, truncated and 0-padded, with 0
meaning padding alone (the text encoders take `tokens > 0` as the mask): bytes are
1 + the UTF-8 byte (vocabulary 257); a SentencePiece or `tokenizers` model's ids are
shifted by one (vocabulary: the model's size + 1). A model file's tokenizer reads the
file when loaded (for `vocab_size`) and pickles as its path alone (grain's worker
processes receive it), reading the file again on its first use there. The
`sentencepiece` and `tokenizers` packages (the `text` extra) are imported only for
their files.
"""

import os
from collections.abc import Sequence

import numpy as np

from contrastive_jax.config_lib import ConfigError

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


class ByteTokenizer(Tokenizer):
    """1 + each UTF-8 byte: no vocabulary file, any language."""

    vocab_size = 257

    def _ids(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")]


class _ModelFile(Tokenizer):
    """A tokenizer model read from `path` on first use (and after unpickling)."""

    package = ""

    def __init__(self, path: str):
        self.path = path
        self._model = None
        self.vocab_size = self._loaded_size() + 1

    def __getstate__(self):
        return {"path": self.path, "vocab_size": self.vocab_size}

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

    package = "sentencepiece"

    def _load(self):
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=self.path)

    def _loaded_size(self) -> int:
        return self.model().get_piece_size()

    def _ids(self, text: str) -> list[int]:
        return [i + 1 for i in self.model().encode(text)]


class HuggingFaceTokenizer(_ModelFile):
    """A Hugging Face `tokenizers` JSON file (`tokenizer.json`); ids + 1, no special
    tokens added."""

    package = "tokenizers"

    def _load(self):
        import tokenizers

        return tokenizers.Tokenizer.from_file(self.path)

    def _loaded_size(self) -> int:
        return self.model().get_vocab_size(with_added_tokens=True)

    def _ids(self, text: str) -> list[int]:
        return [i + 1 for i in self.model().encode(text, add_special_tokens=False).ids]


_BY_SUFFIX = {".model": SentencePieceTokenizer, ".json": HuggingFaceTokenizer}


def load(spec: str) -> Tokenizer:
    """The tokenizer `spec` names: "bytes", a SentencePiece `.model` or a `tokenizers` `.json` file.

    Raises:
      ConfigError: an unknown spec, a missing or unreadable file, or its package not
        installed.
    """
    if spec == BYTES:
        return ByteTokenizer()
    suffix = os.path.splitext(spec)[1]
    if suffix not in _BY_SUFFIX:
        raise ConfigError(
            f"config.data.tokenizer={spec!r} is not a tokenizer; use 'bytes', a SentencePiece .model "
            "file or a Hugging Face tokenizers .json file."
        )
    if not os.path.isfile(spec):
        raise ConfigError(f"config.data.tokenizer={spec!r}: no such file; give the path of the model file.")
    kind = _BY_SUFFIX[suffix]
    try:
        __import__(kind.package)
    except ImportError:
        raise ConfigError(
            f"config.data.tokenizer={spec!r} needs the {kind.package} package: pip install 'contrastive-jax[text]'."
        ) from None
    try:
        return kind(os.path.abspath(spec))
    except Exception as error:  # sentencepiece raises RuntimeError, tokenizers a bare Exception
        raise ConfigError(
            f"config.data.tokenizer={spec!r} is not a {kind.package} model file ({error}); "
            "give a SentencePiece .model or a tokenizers tokenizer.json file."
        ) from None
