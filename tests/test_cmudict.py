"""The cmudict TFDS builder: the exact split by word, the counts and the grouping ids."""

import collections
import hashlib

import numpy as np
import pytest
import tensorflow_datasets as tfds

from contrastive_jax.datasets import cmudict

SIZES = {"train": 121_490, "test": 13_676}


@pytest.fixture(scope="module")
def splits(cmudict_data_dir):
    return {
        name: tfds.as_numpy(tfds.load("cmudict", split=name, data_dir=cmudict_data_dir, batch_size=-1))
        for name in SIZES
    }


def test_split_sizes(cmudict_data_dir):
    builder = tfds.builder("cmudict", data_dir=cmudict_data_dir)
    assert {name: info.num_examples for name, info in builder.info.splits.items()} == SIZES
    assert len(cmudict.entries()) == 135_166


def test_split_is_md5_of_the_word_with_all_its_pronunciations(splits):
    for name, split in splits.items():
        words = {w.decode() for w in split["word"]}
        in_test = {int(hashlib.md5(w.encode()).hexdigest(), 16) % 10 == 0 for w in words}
        assert in_test == {name == "test"}, name
    train_words, test_words = (set(splits[s]["word"]) for s in ("train", "test"))
    assert train_words.isdisjoint(test_words)
    # All the pronunciations of a word are in its split: every line is somewhere, once.
    lines = np.concatenate([splits[s]["line"] for s in SIZES])
    assert sorted(lines) == list(range(135_166))
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
            ids = split["phonemes"][i]  # 0-padded to the longest in the split
            assert tuple(symbols[ids[: len(entry.phonemes)]]) == entry.phonemes


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
    # The TFDS examples carry the ids of their lines.
    for split in splits.values():
        for i in range(0, len(split["line"]), 997):
            entry = entries[split["line"][i]]
            assert split["word_id"][i] == entry.word_id
            assert split["pronunciation_id"][i] == entry.pronunciation_id


def test_longest_sequences():
    entries = cmudict.entries()
    assert max(len(e.word.encode()) for e in entries) == cmudict.MAX_WORD_LENGTH
    assert max(len(e.phonemes) for e in entries) == cmudict.MAX_PHONEMES
