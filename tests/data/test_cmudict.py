"""The built-in cmudict records: the exact split by word, the counts and the grouping ids."""

import collections
import hashlib
import itertools

import numpy as np
import pytest

from contrastive_jax.data import input_pipeline, records, settings
from contrastive_jax.data.builtin import cmudict
from contrastive_jax.training.run_plan import data_settings

SIZES = {"train": 121_490, "test": 13_676, "fit": 108_000, "validation": 13_490}


@pytest.fixture(scope="module")
def metadata(cmudict_data_dir):
    return records.read_metadata(settings.builtin_records("cmudict", cmudict_data_dir))


@pytest.fixture(scope="module")
def splits(metadata):
    """Each split's records as columns: `word` (bytes), `phonemes` (ids, 0-padded),
    the ids, and `line` (the dictionary line: records are in file order)."""
    out = {}
    lines = {name: [] for name in SIZES}
    for entry in cmudict.entries():
        for name in SIZES:
            if cmudict.in_split(entry.word, name):
                lines[name].append(entry.line)
    for name in SIZES:
        split = records.RecordSet(metadata, name)
        examples = [records.decode(r) for r in split.read_many(range(len(split)))]
        out[name] = {
            "word": [e["text"].encode() for e in examples],
            "phonemes": [e["sequence"] for e in examples],
            "word_id": np.array([e["word_id"] for e in examples]),
            "pronunciation_id": np.array([e["pronunciation_id"] for e in examples]),
            "line": np.array(lines[name]),
        }
    return out


def test_split_sizes(metadata):
    assert {name: split.num_records for name, split in metadata.splits.items()} == SIZES
    assert len(cmudict.entries()) == 135_166
    assert metadata.id_keys == ("word_id", "pronunciation_id")
    assert metadata.match_keys == ("pronunciation_id", "word_id")


def test_split_is_md5_of_the_word_with_all_its_pronunciations(splits):
    for name, split in splits.items():
        words = {w.decode() for w in split["word"]}
        in_test = {int(hashlib.md5(w.encode()).hexdigest(), 16) % 10 == 0 for w in words}
        assert in_test == {name == "test"}, name
    train_words, test_words = (set(splits[s]["word"]) for s in ("train", "test"))
    assert train_words.isdisjoint(test_words)
    # All the pronunciations of a word are in its split: every line is somewhere, once.
    lines = np.concatenate([splits[s]["line"] for s in ("train", "test")])
    assert sorted(lines) == list(range(135_166))
    # validation and fit cut train in two by the same hash (remainder 1, the rest).
    fit, validation = (set(splits[s]["line"]) for s in ("fit", "validation"))
    assert fit.isdisjoint(validation) and fit | validation == set(splits["train"]["line"])
    buckets = {int(hashlib.md5(w).hexdigest(), 16) % 10 for w in splits["validation"]["word"]}
    assert buckets == {1}
    assert cmudict.split_of("read") == "train" and cmudict.split_of("abacus") == "test"


def test_examples_are_the_dictionary_lines(splits):
    # Golden lines of cmudict.dict: an alternate ("read(2)") keeps the word, a comment is dropped.
    entries = cmudict.entries()
    by_word = collections.defaultdict(list)
    for e in entries:
        by_word[e.word].append(e.phonemes)
    assert by_word["read"] == [("R", "EH1", "D"), ("R", "IY1", "D")]
    assert by_word["aalborg"] == [("AO1", "L", "B", "AO0", "R", "G"), ("AA1", "L", "B", "AO0", "R", "G")]
    symbols = np.array(cmudict.phonemes())
    assert len(symbols) == 84
    for split in splits.values():
        for i in range(0, len(split["line"]), 997):
            entry = entries[split["line"][i]]
            assert split["word"][i].decode() == entry.word
            assert tuple(symbols[split["phonemes"][i]]) == entry.phonemes


def test_grouping_ids(splits):
    entries = cmudict.entries()
    # word_id groups exactly the lines of one spelling, pronunciation_id those of one string.
    for key, value in (("word_id", lambda e: e.word), ("pronunciation_id", lambda e: e.phonemes)):
        pairs = {(getattr(e, key), value(e)) for e in entries}
        assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs}), key
    assert len({e.word_id for e in entries}) == 126_052
    assert len({e.pronunciation_id for e in entries}) == 116_111
    first = {e.word: e for e in entries}
    assert first["knight"].pronunciation_id == first["night"].pronunciation_id  # homophones
    assert first["knight"].word_id != first["night"].word_id
    # The records carry the ids of their lines.
    for split in splits.values():
        for i in range(0, len(split["line"]), 997):
            entry = entries[split["line"][i]]
            assert split["word_id"][i] == entry.word_id
            assert split["pronunciation_id"][i] == entry.pronunciation_id


def test_longest_sequences(metadata):
    entries = cmudict.entries()
    assert max(len(e.word.encode()) for e in entries) == cmudict.MAX_WORD_LENGTH
    assert max(len(e.phonemes) for e in entries) == cmudict.MAX_PHONEMES
    longest = max(cmudict.MAX_WORD_LENGTH, cmudict.MAX_PHONEMES)
    assert metadata.max_text_length == longest and metadata.sequence_vocab_size == 84


# Through the input pipeline: configs/cmudict_clip.py reading the (smaller) test split.


@pytest.fixture
def config(load_config, cmudict_data_dir):
    config = load_config("cmudict_clip")
    config.data.data_dir = cmudict_data_dir
    config.data.train_split = "test"
    config.train.global_batch_size = 512
    return config


def decode(tokens_a, tokens_b):
    """(spelling, phonemes) of one pipeline pair: byte tokens and phoneme ids + 1."""
    word = bytes(int(t) - 1 for t in tokens_a if t).decode()
    return word, tuple(cmudict.phonemes()[int(t) - 1] for t in tokens_b if t)


def test_pairs_are_dictionary_lines_as_padded_token_sequences(config):
    batch = next(iter(input_pipeline.train_dataset(data_settings(config))))
    length = config.data.text_max_length
    assert batch["a"].shape == batch["b"].shape == (512, length)
    assert batch["a"].dtype == batch["b"].dtype == np.int32
    assert batch["word_id"].shape == batch["pronunciation_id"].shape == (512,)
    lines = {(e.word_id, e.pronunciation_id): e for e in cmudict.entries()}
    for i in range(512):
        entry = lines[batch["word_id"][i], batch["pronunciation_id"][i]]
        assert decode(batch["a"][i], batch["b"][i]) == (entry.word, entry.phonemes)
        # 0-padded after the real tokens.
        assert np.all(batch["a"][i, len(entry.word) :] == 0) and np.all(batch["a"][i, : len(entry.word)] > 0)
        assert np.all(batch["b"][i, len(entry.phonemes) :] == 0)
    assert batch["b"].max() <= len(cmudict.phonemes())


def test_stream_is_a_function_of_the_step(config):
    data = data_settings(config)
    first = [next(iter(input_pipeline.train_dataset(data, start_step=s))) for s in (0, 3)]
    stream = list(itertools.islice(input_pipeline.train_dataset(data), 4))
    for key in first[0]:
        np.testing.assert_array_equal(first[0][key], stream[0][key])
        np.testing.assert_array_equal(first[1][key], stream[3][key])
    assert not np.array_equal(stream[0]["word_id"], stream[1]["word_id"])


def test_eval_arrays_hold_the_whole_split_with_its_ids(config):
    arrays = input_pipeline.eval_arrays(data_settings(config), "test")
    assert arrays["a"].shape == (13_676, config.data.text_max_length)
    assert set(arrays) == {"a", "b", "word_id", "pronunciation_id"}
    test_lines = [e for e in cmudict.entries() if cmudict.split_of(e.word) == "test"]
    assert sorted(arrays["word_id"]) == sorted(e.word_id for e in test_lines)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("data.text_max_length", 20, r"text_max_length=20 would truncate cmudict.*at least 28"),
        ("data.task", "views", r"sequence pairs; set config.data.task='pairs'"),
        ("data.augment.noise_std", 0.1, r"augment applies to images.*noise_std=0.0"),
    ],
)
def test_bad_config_raises_a_clear_error(config, field, value, message):
    group, name = field.rsplit(".", 1)
    node = config
    for part in group.split("."):
        node = node[part]
    node[name] = value
    with pytest.raises(ValueError, match=message):
        settings.check_data_config(data_settings(config))
