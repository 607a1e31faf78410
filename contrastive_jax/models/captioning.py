"""Decoding captions in jitted JAX: greedy and beam search over fixed-length buffers
(`lax.while_loop`, stopping early once every row has ended), for a captioning model
(`coca.CoCa`) through `logits_fn`.

`logits_fn(tokens [n, T]) -> [n, T, V]` float32 gives, at each position i of a buffer of
ids, the logits of the id at i + 1 (`coca.CoCa.next_token_logits` with the images' tokens
bound). The model is causal, so the logits at i depend on ids 0..i alone: the buffer
holds the caption so far, then padding (0), and each step reads one position (no key /
value cache: each step runs the text tower and decoder over the whole buffer, T steps
of O(T) work).

A caption starts with `prompt` `[B, P]` (e.g. CLIP's start-of-text id) and grows to
`max_length` ids, in a buffer of `buffer_length` (the model's text length, where its
position embedding is as long as its training texts; `max_length` by default); a row
ends after `end_id` (e.g. CLIP's end-of-text) or a padding id (as open_clip's `generate`
ends it), padding after. Its score is the sum of the log
probabilities of the ids it generated (the end included, the padding after it 0), with
no length normalisation. `captioner` binds a model's image tokens and logits to either
search. Shapes: `B` images, `K` beams, `T` = `max_length`, `V` vocabulary.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from contrastive_jax.errors import ConfigError

PAD_ID = 0
_NEVER = -1e9  # the score of a hypothesis that must not be kept (finite: no inf - inf)


def _buffer(prompt, max_length: int, buffer_length: int | None):
    """`prompt` `[..., P]` int32 then padding, `[..., buffer_length]`; P must be in
    [1, max_length), `max_length` at most `buffer_length` (None: `max_length`)."""
    length, buffer_length = prompt.shape[-1], buffer_length or max_length
    if not 1 <= length < max_length <= buffer_length:
        raise ValueError(
            f"a prompt of {length} ids, max_length={max_length}, buffer_length={buffer_length}: give 1 to "
            "max_length - 1 ids and a max_length of at most the buffer's."
        )
    pad = [(0, 0)] * (prompt.ndim - 1) + [(0, buffer_length - length)]
    return jnp.pad(prompt.astype(jnp.int32), pad)


def _ended(tokens, end_id: int | None):
    """Whether each id of `tokens` ends a caption (padding, or `end_id`)."""
    return (tokens == PAD_ID) | (tokens == (PAD_ID if end_id is None else end_id))


def _log_probs(logits_fn: Callable, tokens, position):
    """log-softmax of `logits_fn(tokens)` at `position`: `[n, T]` -> `[n, V]` float32."""
    logits = jax.lax.dynamic_index_in_dim(logits_fn(tokens), position, axis=1, keepdims=False)
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def greedy(
    logits_fn: Callable, prompt, *, max_length: int, end_id: int | None = None, buffer_length: int | None = None
):
    """Greedy decoding: each step appends each row's most probable id.

    Args:
      logits_fn: `[B, T]` ids -> `[B, T, V]` logits (the module's docstring).
      prompt: `[B, P]` int32, the ids every caption starts with.
      max_length: T, the captions' length with the prompt.
      end_id: the id that ends a caption (None: none but padding).
      buffer_length: the ids `logits_fn` takes, at least T (None: T).

    Returns:
      `(tokens [B, T] int32, scores [B] float32)`: the captions and their summed log
      probabilities.
    """
    tokens = _buffer(prompt, max_length, buffer_length)
    start = prompt.shape[-1] - 1
    done = jnp.zeros(tokens.shape[:1], bool)

    def step(state):
        position, tokens, scores, done = state
        log_probs = _log_probs(logits_fn, tokens, position)
        chosen = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
        gain = jnp.take_along_axis(log_probs, chosen[:, None], axis=-1)[:, 0]
        chosen, gain = jnp.where(done, PAD_ID, chosen), jnp.where(done, 0.0, gain)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, chosen, position + 1, axis=1)
        return position + 1, tokens, scores + gain, done | _ended(chosen, end_id)

    def going(state):
        return (state[0] < max_length - 1) & ~jnp.all(state[3])

    state = (jnp.int32(start), tokens, jnp.zeros(tokens.shape[:1], jnp.float32), done)
    _, tokens, scores, _ = jax.lax.while_loop(going, step, state)
    return tokens[:, :max_length], scores


def beam_search(
    logits_fn: Callable,
    prompt,
    *,
    max_length: int,
    beam_size: int,
    end_id: int | None = None,
    buffer_length: int | None = None,
):
    """Beam search: each step keeps, per image, the `beam_size` most probable captions
    so far (ended ones kept with their score, growing by padding at no cost); the most
    probable of the last beams is the caption. `beam_size=1` is `greedy`.

    Args:
      logits_fn: `[B K, T]` ids -> `[B K, T, V]` logits (the module's docstring).
      prompt: `[B, P]` int32, the ids every caption starts with.
      max_length: T, the captions' length with the prompt.
      beam_size: K.
      end_id: the id that ends a caption (None: none but padding).
      buffer_length: the ids `logits_fn` takes, at least T (None: T).

    Returns:
      `(tokens [B, T] int32, scores [B] float32)`: each image's best caption and its
      summed log probability.
    """
    batch, beams = prompt.shape[0], beam_size
    tokens = jnp.repeat(_buffer(prompt, max_length, buffer_length)[:, None], beams, axis=1)  # [B, K, T]
    scores = jnp.tile(jnp.where(jnp.arange(beams) == 0, 0.0, _NEVER), (batch, 1))  # one live beam at first
    done = jnp.zeros((batch, beams), bool)

    def step(state):
        position, tokens, scores, done = state
        log_probs = _log_probs(logits_fn, tokens.reshape(batch * beams, -1), position).reshape(batch, beams, -1)
        vocab = log_probs.shape[-1]
        padding_only = jnp.where(jnp.arange(vocab) == PAD_ID, 0.0, _NEVER)
        log_probs = jnp.where(done[..., None], padding_only, log_probs)
        best, index = jax.lax.top_k((scores[..., None] + log_probs).reshape(batch, beams * vocab), beams)
        parent, chosen = index // vocab, (index % vocab).astype(jnp.int32)
        tokens = jnp.take_along_axis(tokens, parent[..., None], axis=1)
        tokens = jax.lax.dynamic_update_index_in_dim(tokens, chosen, position + 1, axis=2)
        done = jnp.take_along_axis(done, parent, axis=1) | _ended(chosen, end_id)
        return position + 1, tokens, best, done

    def going(state):
        return (state[0] < max_length - 1) & ~jnp.all(state[3])

    state = (jnp.int32(prompt.shape[-1] - 1), tokens, scores, done)
    _, tokens, scores, _ = jax.lax.while_loop(going, step, state)
    best = jnp.argmax(scores, axis=1)
    tokens, scores = jnp.take_along_axis(tokens, best[:, None, None], axis=1)[:, 0], jnp.max(scores, axis=1)
    return tokens[:, :max_length], scores


METHODS = ("greedy", "beam")


def captioner(
    model,
    *,
    max_length: int,
    method: str = "greedy",
    beam_size: int = 4,
    end_id: int | None = None,
    buffer_length: int | None = None,
):
    """The jitted `(variables, images [B, H, W, C], prompt [B, P]) -> (ids [B, T], scores
    [B])` of a captioning `model` (`coca.CoCa`: its `image_tokens`, each image's once, and
    its `next_token_logits`): `greedy`, or `beam_search` of `beam_size` (`method="beam"`);
    `end_id`, `buffer_length`: theirs.

    Raises:
      ConfigError: a method not in `METHODS`, or a beam size below 1.
    """
    if method not in METHODS or beam_size < 1:
        raise ConfigError(f"method={method!r}, beam_size={beam_size}: use a method of {METHODS} and a beam size >= 1.")

    def caption(variables, images, prompt):
        image_tokens = model.apply(variables, images, method="image_tokens")
        if method == "greedy":
            logits_fn = functools.partial(model.apply, variables, image_tokens, method="next_token_logits")
            return greedy(logits_fn, prompt, max_length=max_length, end_id=end_id, buffer_length=buffer_length)
        rows = jnp.repeat(image_tokens, beam_size, axis=0)  # beam k of image b: row b K + k
        logits_fn = functools.partial(model.apply, variables, rows, method="next_token_logits")
        return beam_search(
            logits_fn, prompt, max_length=max_length, beam_size=beam_size, end_id=end_id, buffer_length=buffer_length
        )

    return jax.jit(caption)
