"""tokenizers: bytes (golden ids), SentencePiece and Hugging Face models trained here, each
against its own library's ids shifted by one; padding, truncation, pickling, errors. The
released models' tokenizers: CLIP's BPE against open_clip's `tokenize`, SigLIP's
SentencePiece rule against Hugging Face's `SiglipTokenizer` and big_vision's rule."""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from contrastive_jax.data import tokenizers
from contrastive_jax.errors import ConfigError

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
        ("/no/such/bpe.txt.gz", r"config.data.tokenizer='/no/such/bpe.txt.gz': no such file; give the path"),
        ("siglip:/no/such.model", r"config.data.tokenizer='siglip:/no/such.model': no such file; give the path"),
    ],
)
def test_bad_specs_name_the_field(spec, message):
    with pytest.raises(ConfigError, match=message):
        tokenizers.load(spec)


@pytest.mark.parametrize(
    "prefix, suffix, package",
    [
        ("", ".model", "sentencepiece"),
        ("", ".json", "tokenizers"),
        ("siglip:", ".model", "sentencepiece"),
        ("", ".txt.gz", "ftfy"),
    ],
)
def test_an_unreadable_model_file_is_one_line(tmp_path, prefix, suffix, package):
    pytest.importorskip(package)
    path = tmp_path / f"tokenizer{suffix}"
    path.write_text("not a model")
    with pytest.raises(
        ConfigError, match=r"config.data.tokenizer='.*' is not a .*(model|merges) file \(.*\); give a"
    ) as error:
        tokenizers.load(prefix + str(path))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "suffix, package, extra",
    [
        (".model", "sentencepiece", "text"),
        (".json", "tokenizers", "text"),
        (".txt.gz", "regex", "released"),
        (".txt.gz", "ftfy", "released"),
    ],
)
def test_a_missing_package_names_the_extra(tmp_path, monkeypatch, suffix, package, extra):
    path = tmp_path / f"tokenizer{suffix}"
    path.write_text("")
    monkeypatch.setitem(sys.modules, package, None)  # `import package` raises ImportError
    message = f"config.data.tokenizer='{path}' needs the {package} package: pip install 'contrastive-jax[{extra}]'."
    with pytest.raises(ConfigError) as error:
        tokenizers.load(str(path))
    assert str(error.value) == message


def test_bytes_import_no_tokenizer_package_and_clip_no_open_clip(clip_merges):
    code = (
        "import sys; from contrastive_jax.data import tokenizers; tokenizers.load('bytes').encode('a', 4); "
        "assert not {'sentencepiece', 'tokenizers', 'regex', 'ftfy'} & set(sys.modules), sorted(sys.modules); "
        f"tokenizers.load({clip_merges!r}).encode('a cat', 8); "
        "assert not {'open_clip', 'torch'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- The released models' tokenizers ----------------------------------------------------

CAPTIONS = [
    "a photo of a cat",
    "A Photo Of A DOG.",
    "two dogs, one cat; and a bird!",
    "it's the dog's ball, isn't it? they'll see",
    "3 apples and 42 oranges cost $12.50",
    "year 2024: 100% done",
    "café au lait in Zürich",
    "naïve résumé über straße",
    "a 🐱 and a 🐶 on a sofa 🛋️",
    "東京の夜景 and 北京",
    "ΑΒΓ Greek CAPITALS in İstanbul",
    "fish &amp; chips &lt;b&gt;bold&lt;/b&gt;",
    "double &amp;amp; escaped &quot;quotes&quot;",
    "a <b>tag</b> with &amp;amp; (ftfy leaves entities next to a <, the two unescapes do not)",
    "   lots   of\twhite\nspace   ",
    "",
    "e-mail: someone@example.com #tag",
    "mojibake: cafÃ© â€œquotedâ€\x9d",
    "<start_of_text> literal specials <END_OF_TEXT>",
    " ".join(["a large red circle next to a small blue square"] * 12),
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]


@pytest.mark.parametrize("length", [77, 16])
def test_clip_bpe_gives_open_clip_ids(clip_merges, length):
    open_clip = pytest.importorskip("open_clip")
    tokenizer = tokenizers.load(clip_merges)
    assert isinstance(tokenizer, tokenizers.ClipBpeTokenizer) and tokenizer.vocab_size == 49408
    expected = open_clip.tokenize(CAPTIONS, context_length=length).numpy()
    encoded = tokenizer.encode_batch(CAPTIONS, length)
    assert encoded.dtype == np.int32 and encoded.shape == (len(CAPTIONS), length)
    for caption, ours, theirs in zip(CAPTIONS, encoded, expected):
        np.testing.assert_array_equal(ours, theirs, err_msg=repr(caption))
    long = tokenizer.encode(CAPTIONS[-2], length)  # cut: start first, end last, no padding
    assert long[0] == 49406 and long[-1] == 49407 and (long[1:-1] < 49406).all()
    np.testing.assert_array_equal(tokenizer.encode("", 4), [49406, 49407, 0, 0])


def test_clip_bpe_pickles_as_its_path(clip_merges):
    tokenizer = tokenizers.load(clip_merges)
    pickled = pickle.dumps(tokenizer)
    assert len(pickled) < 1000 and clip_merges.encode() in pickled
    np.testing.assert_array_equal(
        pickle.loads(pickled).encode_batch(CAPTIONS, 77), tokenizer.encode_batch(CAPTIONS, 77)
    )


def train_sentencepiece(folder, **ids) -> str:
    """A tiny SentencePiece model with the special ids `ids` (pad_id=, eos_id=, ...)."""
    spm = pytest.importorskip("sentencepiece", reason="the text extra is not installed")
    words = "a the red blue small large cat dog photo of with two on in near tree house man café über straße".split()
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, rng.integers(3, 12))) for _ in range(300)]
    lines += ["Capitals Here, and punctuation: yes! (maybe) 42 items.", "ÉCOLE Über ÄPFEL 東京"] * 5
    (folder / "corpus.txt").write_text("\n".join(lines))
    spm.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "m"), vocab_size=60, minloglevel=2, **ids
    )
    return str(folder / "m.model")


@pytest.fixture(scope="module")
def siglip_model(tmp_path_factory):
    """Special ids as in c4_en and mc4, SigLIP's vocabularies (T5's): <pad> 0, </s> 1, <unk> 2, no BOS."""
    return train_sentencepiece(tmp_path_factory.mktemp("siglip"), pad_id=0, eos_id=1, unk_id=2, bos_id=-1)


def big_vision_ids(path: str, text: str, length: int, pad: int) -> list[int]:
    """big_vision's `tokenize(max_len=length, eos="sticky", pad_value=pad)` (pp/ops_text.py)
    in plain Python: `tf.strings.lower` (ASCII bytes only), tf_text's SentencePiece with
    `add_eos`, then `force_eos`: cut to `tokens[:length - 1] + tokens[-1:]`, or padded."""
    import sentencepiece

    model = sentencepiece.SentencePieceProcessor(model_file=path)
    lowered = bytes(b + 32 if 65 <= b <= 90 else b for b in text.encode("utf-8")).decode("utf-8")
    tokens = model.encode(lowered) + [model.eos_id()]
    if len(tokens) >= length:
        return tokens[: length - 1] + tokens[-1:]
    return tokens + [pad] * (length - len(tokens))


# Where Hugging Face's SiglipTokenizer differs from big_vision's training rule: it lower-cases
# all letters (big_vision: ASCII only), drops ASCII punctuation and parses "<unk>"/"</s>" in
# the text as special tokens (big_vision does neither).
HF_DIFFERS = {"A Photo Of A DOG.", "ΑΒΓ Greek CAPITALS in İstanbul", "<start_of_text> literal specials <END_OF_TEXT>"}


def hf_differs(caption: str) -> bool:
    return caption in HF_DIFFERS or any(c in caption for c in ",;!?.$%:&@#'") or caption.startswith("mojibake")


@pytest.mark.parametrize("length", [64, 16])
def test_siglip_gives_big_vision_ids_and_hugging_faces_where_they_agree(siglip_model, length):
    transformers = pytest.importorskip("transformers")
    tokenizer = tokenizers.load(f"siglip:{siglip_model}")
    assert isinstance(tokenizer, tokenizers.SigLipTokenizer) and tokenizer.vocab_size == 60
    assert type(tokenizers.load(siglip_model)) is tokenizers.SentencePieceTokenizer  # no prefix: ids + 1
    hf = transformers.SiglipTokenizer(vocab_file=siglip_model)
    assert (hf.eos_token_id, hf.pad_token_id) == (1, 1)
    for caption in CAPTIONS + ["É", "Über", "<unk> x"]:
        ours = tokenizer.encode(caption, length)
        assert ours.dtype == np.int32 and ours.shape == (length,)
        np.testing.assert_array_equal(ours, big_vision_ids(siglip_model, caption, length, pad=1), err_msg=repr(caption))
        theirs = hf(caption, padding="max_length", max_length=length, truncation=True)["input_ids"]
        if not hf_differs(caption) and caption not in ("É", "Über", "<unk> x"):
            np.testing.assert_array_equal(ours, theirs, err_msg=repr(caption))
    assert tokenizer.encode(CAPTIONS[-2], length)[-1] == 1  # cut: EOS kept last
    np.testing.assert_array_equal(tokenizer.encode("", 3), [1, 1, 1])  # EOS, then EOS as padding
    assert (tokenizer.encode("A Cat", 8) == tokenizer.encode("a cat", 8)).all()
    assert (tokenizer.encode("É", 8) != tokenizer.encode("é", 8)).any()  # only ASCII is lower-cased


def test_siglip_documented_differences_from_hugging_face_hold(siglip_model):
    transformers = pytest.importorskip("transformers")
    tokenizer = tokenizers.load(f"siglip:{siglip_model}")
    hf = transformers.SiglipTokenizer(vocab_file=siglip_model)
    for caption in ["cat, dog!", "ÉCOLE", "<unk> x"]:
        theirs = hf(caption, padding="max_length", max_length=16, truncation=True)["input_ids"]
        assert list(tokenizer.encode(caption, 16)) != theirs, caption


def test_siglip2_pads_with_the_models_pad(tmp_path):
    gemma_like = train_sentencepiece(tmp_path, pad_id=0, eos_id=1, bos_id=2, unk_id=3)  # Gemma's special ids
    tokenizer = tokenizers.load(f"siglip2:{gemma_like}")
    assert tokenizer.pad == "pad" and tokenizer.vocab_size == 60
    for caption in CAPTIONS:
        np.testing.assert_array_equal(tokenizer.encode(caption, 16), big_vision_ids(gemma_like, caption, 16, pad=0))
    np.testing.assert_array_equal(tokenizer.encode("", 3), [1, 0, 0])  # EOS, no BOS, then <pad>


def test_siglip_pickles_as_its_path_and_options(siglip_model):
    for spec in (f"siglip:{siglip_model}", f"siglip2:{siglip_model}"):
        tokenizer = tokenizers.load(spec)
        pickled = pickle.dumps(tokenizer)
        assert len(pickled) < os.path.getsize(siglip_model)
        restored = pickle.loads(pickled)
        assert restored.pad == tokenizer.pad
        np.testing.assert_array_equal(restored.encode_batch(CAPTIONS, 16), tokenizer.encode_batch(CAPTIONS, 16))


def test_a_siglip_model_without_eos_is_refused(tmp_path):
    path = train_sentencepiece(tmp_path, pad_id=0, eos_id=-1, unk_id=1, bos_id=-1)
    with pytest.raises(ConfigError, match=r"is not a sentencepiece model file \(the model has no EOS piece\)"):
        tokenizers.load(f"siglip:{path}")
