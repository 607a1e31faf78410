"""Captions decoded in jitted JAX (`models.captioning`) from the tiny open_clip CoCa of
`test_coca`, loaded here: greedy is the step-by-step argmax of the model's own logits
and open_clip's `generate` (top-1); beam search of width 1 is greedy; wider beams find
captions at least as probable."""

import dataclasses
import functools

import jax
import numpy as np
import pytest
from test_coca import CONTEXT, EOT, SOT, inputs, loaded, open_clip_coca, torch_pixels

from contrastive_jax import trained
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import captioning, encoders

torch = pytest.importorskip("torch")
open_clip = pytest.importorskip("open_clip")
MAX_LENGTH = 10


@pytest.fixture(scope="module")
def coca_model(tmp_path_factory):
    reference = open_clip_coca()
    model, variables = loaded(tmp_path_factory.mktemp("coca"), reference)
    images = np.concatenate([inputs()[0], np.random.default_rng(1).random((3, 32, 32, 3), dtype=np.float32)])
    image_tokens = model.apply(variables, images, method="image_tokens")
    logits_fn = functools.partial(model.apply, variables, method="next_token_logits")
    return reference, model, variables, images, image_tokens, logits_fn


def decoded(coca_model, method, **options):
    """`captioning.captioner`'s `(ids, scores)` of the images, from CLIP's start id."""
    _, model, variables, images, *_ = coca_model
    caption = captioning.captioner(model, max_length=MAX_LENGTH, method=method, end_id=EOT, **options)
    return jax.device_get(caption(variables, images, np.full((len(images), 1), SOT, np.int32)))


def test_greedy_is_the_step_by_step_argmax(coca_model):
    """A Python loop over the positions, each step the argmax of the model's logits at
    the last id so far (in a buffer of the caption's length: one compile; open_clip's
    `generate`, below, grows its prefix instead)."""
    _, model, variables, images, image_tokens, logits_fn = coca_model
    tokens, scores = decoded(coca_model, "greedy")
    want = np.zeros((len(images), MAX_LENGTH), np.int32)
    want[:, 0] = SOT
    want_scores = np.zeros(len(images))
    done = np.zeros(len(images), bool)
    logits_of = jax.jit(logits_fn)
    for position in range(MAX_LENGTH - 1):
        log_probs = np.asarray(jax.nn.log_softmax(logits_of(image_tokens, want)[:, position]))
        chosen = np.where(done, 0, log_probs.argmax(-1))
        want_scores += np.where(done, 0.0, log_probs[np.arange(len(images)), chosen])
        done |= (chosen == EOT) | (chosen == 0)
        want[:, position + 1] = chosen
    np.testing.assert_array_equal(tokens, want)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_greedy_is_open_clips_generate(coca_model, monkeypatch):
    """open_clip's top-1 `generate` forces the end-of-text id at the last position; the
    positions before it agree. (open_clip 3.3.0 turns `generate` off where transformers
    has no `BeamSearchScorer`, as 5.x has not; its top-k path needs none: turned on.)"""
    from open_clip import coca_model as open_clip_coca_module
    from transformers import TopKLogitsWarper

    monkeypatch.setattr(open_clip_coca_module, "_has_transformers", True)
    monkeypatch.setitem(open_clip_coca_module.GENERATION_TYPES, "top_k", TopKLogitsWarper)
    reference, *_ = coca_model
    images = coca_model[3]
    tokens, _ = decoded(coca_model, "greedy")
    with torch.no_grad():
        want = reference.generate(
            torch_pixels(images),
            seq_len=MAX_LENGTH,
            generation_type="top_k",
            top_k=1,
            min_seq_len=0,
            sot_token_id=SOT,
            eos_token_id=EOT,
            pad_token_id=0,
            fixed_output_length=True,
        ).numpy()
    assert want.shape == tokens.shape
    np.testing.assert_array_equal(tokens[:, :-1], want[:, :-1])


@pytest.mark.slow
def test_beam_of_one_is_greedy_and_wider_beams_score_at_least_as_high(coca_model):
    greedy_tokens, greedy_scores = decoded(coca_model, "greedy")
    tokens, scores = decoded(coca_model, "beam", beam_size=1)
    np.testing.assert_array_equal(tokens, greedy_tokens)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-6)
    wide_tokens, wide_scores = decoded(coca_model, "beam", beam_size=4)
    assert np.all(wide_scores >= greedy_scores - 1e-5)
    assert np.any(wide_scores > greedy_scores + 1e-3)  # the search found a better caption somewhere
    # its score is its caption's: the step-by-step log probabilities of the ids it holds
    *_, image_tokens, logits_fn = coca_model
    log_probs = np.asarray(jax.nn.log_softmax(logits_fn(image_tokens, wide_tokens)))
    gains = np.take_along_axis(log_probs[:, :-1], wide_tokens[:, 1:, None], axis=-1)[..., 0]
    ended = np.cumsum((wide_tokens[:, :-1] == EOT) | (wide_tokens[:, :-1] == 0), axis=1) > 0
    ended[:, 0] = False  # the prompt
    np.testing.assert_allclose(np.sum(np.where(ended, 0.0, gains), axis=1), wide_scores, rtol=1e-5, atol=1e-4)


def trained_coca(coca_model) -> trained.TrainedModel:
    """The tiny CoCa as a run's `TrainedModel` that read bytes (no start id: prompts given)."""
    _, model, variables, *_ = coca_model
    inputs = {"a": ((32, 32, 3), np.dtype(np.float32)), "b": ((CONTEXT,), np.dtype(np.int32))}
    tokenizer = {"spec": "bytes", "text_max_length": CONTEXT, "files": {}}
    return trained.TrainedModel(model, {"params": variables["params"]}, inputs, tokenizer, 0, 64, {})


@pytest.mark.slow
def test_a_trained_model_captions_and_exports_its_captioner(coca_model):
    run, images = trained_coca(coca_model), coca_model[3]
    captions = run.caption(images, max_length=MAX_LENGTH, prompt=[SOT], batch_size=4)  # two chunks, one padded
    caption = captioning.captioner(run.model, max_length=MAX_LENGTH)
    want_ids, want_scores = jax.device_get(caption(run.variables, images, np.full((6, 1), SOT, np.int32)))
    np.testing.assert_array_equal(captions.ids, want_ids)
    np.testing.assert_allclose(captions.scores, want_scores, rtol=1e-6)
    assert captions.texts == [bytes(int(i) - 1 for i in row if i).decode("utf-8", "replace") for row in want_ids]
    exported = jax.export.deserialize(run.export_captioner(max_length=MAX_LENGTH, prompt=[SOT]).serialize())
    ids, scores = exported.call(images[:5])  # another batch size than traced
    np.testing.assert_array_equal(ids, want_ids[:5])
    np.testing.assert_allclose(scores, want_scores[:5], rtol=1e-5, atol=1e-5)
    texts = np.zeros((2, CONTEXT), np.int32)
    texts[:, :3] = [SOT, 5, EOT]
    exported_texts = run.export("b").call(texts)  # the text tower alone, without the decoder's weights
    np.testing.assert_allclose(exported_texts, run.embed(texts, "b"), rtol=1e-5, atol=1e-6)
    assert set(run.tower_variables("b")["params"]) == {"txt", "log_inv_temperature"}


def test_caption_refuses_what_it_cannot_do(coca_model):
    run = trained_coca(coca_model)
    with pytest.raises(ConfigError, match="give a prompt"):
        run.caption(coca_model[3], max_length=MAX_LENGTH)  # bytes have no start-of-text id
    with pytest.raises(ConfigError, match=f"at most the model's {CONTEXT} ids"):
        run.caption(coca_model[3], max_length=CONTEXT + 1, prompt=[SOT])
    with pytest.raises(ConfigError, match="method='sample'"):
        run.caption(coca_model[3], max_length=MAX_LENGTH, prompt=[SOT], method="sample")
    with pytest.raises(ConfigError, match="has no text decoder"):
        dataclasses.replace(run, model=encoders.MLP((8,), 4)).caption(coca_model[3], max_length=4, prompt=[1])


def test_clips_bpe_decodes_a_caption_as_open_clip_does():
    """A caption's text (`Captions.texts`) through CLIP's BPE: open_clip's decoding of the
    ids between its start and end."""
    import os

    from contrastive_jax.data import tokenizers

    path = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
    tokenizer = tokenizers.load(path)
    ids = tokenizer.encode("a photo of two café cats, sleeping!", 20)
    assert tokenizer.text_ends() == ((49406,), 49407)
    want = open_clip.tokenizer.SimpleTokenizer(path).decode([i for i in ids if i not in (0, 49406, 49407)])
    assert tokenizer.decode(ids) == want.strip() == "a photo of two café cats , sleeping !"
