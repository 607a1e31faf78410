"""tokenizers: bytes (golden ids), SentencePiece and Hugging Face models trained here, each
against its own library's ids shifted by one; padding, truncation, pickling, errors."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from contrastive_jax import tokenizers
from contrastive_jax.config_lib import ConfigError

TEXTS = ["a large red circle at the top left", "two shapes: a blue square", "héllo wörld", ""]
CORPUS = [
    "a small green triangle in the center and a large red circle at the top left",
    "two shapes: a blue square (small, right) and a yellow cross (large, bottom)",
    "a picture with 3 shapes on a grey background",
] * 30


def test_bytes_are_one_plus_each_utf8_byte():
    tokenizer = tokenizers.load("bytes")
    assert tokenizer.vocab_size == 257
    np.testing.assert_array_equal(tokenizer.encode("hé", 5), [105, 196, 170, 0, 0])  # h, then é = C3 A9
    np.testing.assert_array_equal(tokenizer.encode("abcdef", 3), [98, 99, 100])  # truncated
    assert tokenizer.encode_batch(TEXTS, 8).shape == (4, 8) and not tokenizer.encode("", 4).any()


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece", reason="the text extra is not installed")
    folder = tmp_path_factory.mktemp("spm")
    (folder / "corpus.txt").write_text("\n".join(CORPUS))
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "m"), vocab_size=45, minloglevel=2
    )
    return str(folder / "m.model")


@pytest.fixture(scope="module")
def huggingface_json(tmp_path_factory):
    hf = pytest.importorskip("tokenizers", reason="the text extra is not installed")
    model = hf.Tokenizer(hf.models.BPE(unk_token="[UNK]"))
    model.pre_tokenizer = hf.pre_tokenizers.Whitespace()
    model.train_from_iterator(CORPUS, hf.trainers.BpeTrainer(vocab_size=80, special_tokens=["[UNK]"]))
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    model.save(str(path))
    return str(path)


def reference_ids(path: str, text: str) -> list[int]:
    """The library's own ids of `text`."""
    if path.endswith(".model"):
        import sentencepiece

        return sentencepiece.SentencePieceProcessor(model_file=path).encode(text)
    import tokenizers as hf

    return hf.Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("model", ["sentencepiece_model", "huggingface_json"])
def test_model_files_give_their_library_ids_plus_one(request, model):
    path = request.getfixturevalue(model)
    tokenizer = tokenizers.load(path)
    for text in TEXTS:
        ids = np.asarray(reference_ids(path, text)) + 1
        encoded = tokenizer.encode(text, 40)
        np.testing.assert_array_equal(encoded[: len(ids)], ids)
        assert not encoded[len(ids) :].any() and (ids > 0).all()
        np.testing.assert_array_equal(tokenizer.encode(text, 2), ids[:2] if len(ids) >= 2 else encoded[:2])
    assert tokenizer.vocab_size > max(int(tokenizer.encode(t, 40).max()) for t in TEXTS)
    pickled = pickle.dumps(tokenizer)  # what grain's workers receive: the path, not the model
    assert len(pickled) < os.path.getsize(path)
    np.testing.assert_array_equal(pickle.loads(pickled).encode_batch(TEXTS, 40), tokenizer.encode_batch(TEXTS, 40))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("gpt2", r"config.data.tokenizer='gpt2' is not a tokenizer; use 'bytes'"),
        ("/no/such/spm.model", r"config.data.tokenizer='/no/such/spm.model': no such file"),
    ],
)
def test_bad_specs_name_the_field(spec, message):
    with pytest.raises(ConfigError, match=message):
        tokenizers.load(spec)


@pytest.mark.parametrize("suffix", [".model", ".json"])
def test_an_unreadable_model_file_is_one_line(tmp_path, suffix):
    pytest.importorskip("sentencepiece" if suffix == ".model" else "tokenizers")
    path = tmp_path / f"tokenizer{suffix}"
    path.write_text("not a model")
    with pytest.raises(
        ConfigError, match=r"config.data.tokenizer='.*' is not a \w+ model file \(.*\); give a"
    ) as error:
        tokenizers.load(str(path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("suffix, package", [(".model", "sentencepiece"), (".json", "tokenizers")])
def test_a_missing_package_names_the_extra(tmp_path, monkeypatch, suffix, package):
    path = tmp_path / f"tokenizer{suffix}"
    path.write_text("")
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    message = f"config.data.tokenizer='{path}' needs the {package} package: pip install 'contrastive-jax[text]'."
    with pytest.raises(ConfigError) as error:
        tokenizers.load(str(path))
    assert str(error.value) == message


def test_bytes_import_neither_tokenizer_package():
    code = (
        "import sys; from contrastive_jax import tokenizers; tokenizers.load('bytes').encode('a', 4); "
        "assert not {'sentencepiece', 'tokenizers'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
