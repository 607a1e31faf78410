"""Captions decoded in jitted JAX (`models.captioning`) from the tiny open_clip CoCa of
`test_coca`, loaded here: greedy is the step-by-step argmax of the model's own logits
and open_clip's `generate` (top-1); beam search of width 1 is greedy; wider beams find
captions at least as probable."""

import functools

import jax
import numpy as np
import pytest
from test_coca import EOT, SOT, inputs, loaded, open_clip_coca, torch_pixels

from contrastive_jax.models import captioning

torch = pytest.importorskip("torch")
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
    *_, image_tokens, logits_fn = coca_model
    prompt = np.full((len(image_tokens), 1), SOT, np.int32)

    def run(image_tokens, prompt):
        rows = jax.numpy.repeat(image_tokens, options.get("beam_size", 1), axis=0)  # a beam's rows: its image's
        return method(lambda ids: logits_fn(rows, ids), prompt, max_length=MAX_LENGTH, end_id=EOT, **options)

    return jax.device_get(jax.jit(run)(image_tokens, prompt))


def test_greedy_is_the_step_by_step_argmax(coca_model):
    _, model, variables, images, image_tokens, logits_fn = coca_model
    tokens, scores = decoded(coca_model, captioning.greedy)
    want = np.full((len(images), 1), SOT, np.int32)
    want_scores = np.zeros(len(images))
    done = np.zeros(len(images), bool)
    for _ in range(MAX_LENGTH - 1):  # the prefix so far alone, no buffer: its last position's logits
        log_probs = np.asarray(jax.nn.log_softmax(logits_fn(image_tokens, want)[:, -1]))
        chosen = np.where(done, 0, log_probs.argmax(-1))
        want_scores += np.where(done, 0.0, log_probs[np.arange(len(images)), chosen])
        done |= (chosen == EOT) | (chosen == 0)
        want = np.concatenate([want, chosen[:, None].astype(np.int32)], axis=1)
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
    tokens, _ = decoded(coca_model, captioning.greedy)
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


def test_beam_of_one_is_greedy_and_wider_beams_score_at_least_as_high(coca_model):
    greedy_tokens, greedy_scores = decoded(coca_model, captioning.greedy)
    tokens, scores = decoded(coca_model, captioning.beam_search, beam_size=1)
    np.testing.assert_array_equal(tokens, greedy_tokens)
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-6)
    wide_tokens, wide_scores = decoded(coca_model, captioning.beam_search, beam_size=4)
    assert np.all(wide_scores >= greedy_scores - 1e-5)
    assert np.any(wide_scores > greedy_scores + 1e-3)  # the search found a better caption somewhere
    # its score is its caption's: the step-by-step log probabilities of the ids it holds
    *_, image_tokens, logits_fn = coca_model
    log_probs = np.asarray(jax.nn.log_softmax(logits_fn(image_tokens, wide_tokens)))
    gains = np.take_along_axis(log_probs[:, :-1], wide_tokens[:, 1:, None], axis=-1)[..., 0]
    ended = np.cumsum((wide_tokens[:, :-1] == EOT) | (wide_tokens[:, :-1] == 0), axis=1) > 0
    ended[:, 0] = False  # the prompt
    np.testing.assert_allclose(np.sum(np.where(ended, 0.0, gains), axis=1), wide_scores, rtol=1e-5, atol=1e-4)
