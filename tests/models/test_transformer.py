"""The one Transformer (`contrastive_jax.models.transformer`): attention through
`jax.nn.dot_product_attention` equals Flax's own, masks included; rematerialised blocks
give the same numbers and gradients in less compiled memory; bfloat16 activations and
logits' matmul stay within a stated tolerance of float32 in a whole CLIP step."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses
from contrastive_jax.errors import ConfigError
from contrastive_jax.models import encoders, transformer, two_tower
from contrastive_jax.training.run_plan import model_settings


def _qkv(batch=3, length=7, heads=2, head_dim=8, dtype=jnp.float32):
    keys = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(k, (batch, length, heads, head_dim), dtype) for k in keys]


def _padding_mask(lengths, length):
    """[B, 1, L, L] 0/1 float (as `nn.make_attention_mask` makes them): real tokens attend
    to real tokens; a row of length 0 is all padding (every score masked)."""
    valid = jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]
    return nn.make_attention_mask(valid, valid)


@pytest.mark.parametrize("masked", ["none", "padding", "causal", "padding_and_causal"])
def test_fused_attention_equals_flax_attention(masked):
    query, key, value = _qkv()
    padding = _padding_mask([7, 4, 0], 7) if "padding" in masked else None
    causal = "causal" in masked
    flax_mask = padding
    if causal:
        flax_mask = nn.combine_masks(padding, nn.make_causal_mask(jnp.ones((3, 7))))
    expected = nn.dot_product_attention(query, key, value, mask=flax_mask)
    got = transformer.dot_product_attention(query, key, value, mask=padding, is_causal=causal, attention="xla")
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    if masked != "none":  # the mask matters: without it the numbers differ
        unmasked = transformer.dot_product_attention(query, key, value, attention="xla")
        assert not np.allclose(unmasked, expected, atol=1e-3)


def test_attention_dropout_when_training_uses_flax_attention_with_the_causal_mask():
    query, key, value = _qkv()
    rng = jax.random.key(1)
    options = dict(dropout_rng=rng, dropout_rate=0.5, deterministic=False)
    expected = nn.dot_product_attention(
        query, key, value, mask=nn.make_causal_mask(jnp.ones((3, 7))), broadcast_dropout=True, **options
    )
    got = transformer.dot_product_attention(query, key, value, is_causal=True, **options)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def _encoder(**options):
    return transformer.Encoder(depth=3, mlp_dim=64, num_heads=2, causal=True, **options)


@pytest.mark.slow
def test_encoder_gradients_equal_with_and_without_remat():
    x = jax.random.normal(jax.random.key(0), (4, 9, 32))
    params = _encoder().init(jax.random.key(1), x)

    def value_and_grad(remat):
        def loss(params, x):
            return jnp.sum(jnp.sin(_encoder(remat=remat).apply(params, x)))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)

    plain_value, plain_grads = value_and_grad("none")
    for remat in ("full", "dots"):
        value, grads = value_and_grad(remat)
        np.testing.assert_allclose(value, plain_value, rtol=1e-6)
        for got, expected in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)  # float32 round-off


def _kept_for_backward(model, x):
    """Bytes the backward pass of `sum(model(x))` keeps from the forward (the
    residuals: parameters and the activations not recomputed), from `jax.vjp` traced
    abstractly. XLA's CPU backend does not show rematerialisation in
    `memory_analysis()` (its scheduler computes the recomputations early: a remat'd MLP
    chain's temporaries rose from 88 to 102 MiB here); GPUs do (experiments/bench/bench_step.py)."""
    params = jax.eval_shape(model.init, jax.random.key(0), x)

    def loss(params, x):
        return jnp.sum(model.apply(params, x))

    residuals = jax.eval_shape(lambda p, x: jax.vjp(loss, p, x)[1], params, x)
    return sum(math.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(residuals))


def _params(sizes, x):
    return jax.eval_shape(transformer.Encoder(**sizes).init, jax.random.key(0), x)


@pytest.mark.slow
def test_remat_keeps_fewer_activations_for_the_backward_pass():
    x = jax.ShapeDtypeStruct((16, 64, 128), jnp.float32)
    deep = dict(depth=6, mlp_dim=512, num_heads=4)
    plain = _kept_for_backward(transformer.Encoder(**deep), x)  # 66 MiB (126 with GELU, LayerNorm as written)
    attention = _kept_for_backward(transformer.Encoder(**deep, remat="attention"), x)  # 54 MiB
    full = _kept_for_backward(transformer.Encoder(**deep, remat="full"), x)  # 9 MiB
    dots = _kept_for_backward(transformer.Encoder(**deep, remat="dots"), x)  # 33 MiB
    params = 4 * sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(_params(deep, x)))
    activation = 4 * math.prod(x.shape)  # one [B, L, W] float32 array
    # Fully rematerialised: each block's input and the final LayerNorm's statistics.
    assert full - params <= (6 + 4) * activation, (full, params, activation)
    assert full < dots < 0.5 * plain and dots < attention < plain, (full, dots, attention, plain)


def test_remat_keeps_the_parameter_tree():
    x = jnp.ones((2, 5, 16))
    plain = jax.eval_shape(_encoder().init, jax.random.key(0), x)
    rematerialised = jax.eval_shape(_encoder(remat="full").init, jax.random.key(0), x)
    assert jax.tree.structure(plain) == jax.tree.structure(rematerialised)
    assert "encoderblock_2" in plain["params"]


BAD_REMATS = ["some", "full:6", "full,none", "full:0,none", "full:x,none", "dots:2,fast:1,none", ""]


@pytest.mark.parametrize("remat", BAD_REMATS)
def test_a_bad_remat_setting_is_one_config_error_line(remat):
    with pytest.raises(ConfigError) as error:
        transformer.check_options(remat=remat, attention="auto")
    message = str(error.value)
    assert message.startswith(f"config.model.remat={remat!r}; use one of ['none', 'attention', 'dots', 'full']")
    assert "'full:6,none'" in message and "\n" not in message


def test_unknown_attention_is_a_config_error():
    with pytest.raises(ConfigError, match="config.model.attention='flash'"):
        transformer.check_options(remat="none", attention="flash")


@pytest.mark.parametrize(
    "remat, plan",
    [
        ("dots", ("dots",) * 4),
        ("full:1,none", ("full", "none", "none", "none")),
        ("full:2,attention:1,dots", ("full", "full", "attention", "dots")),
        ("full:6,none", ("full",) * 4),  # a tower shallower than the counts: the first runs
        ("none:4,full", ("none",) * 4),  # the last run may take no block
    ],
)
def test_remat_plan_gives_each_block_its_policy(remat, plan):
    assert transformer.remat_plan(remat, 4) == plan


def _tiny_vit(remat):
    return encoders.ViT(width=32, depth=3, num_heads=2, mlp_dim=64, patch_size=4, remat=remat, attention="xla")


@pytest.mark.slow
@pytest.mark.parametrize("remat", ["attention", "dots", "full", "full:1,none", "attention:1,dots:1,full"])
def test_remat_settings_give_a_tiny_vit_equal_losses_and_gradients(remat):
    images = jax.random.normal(jax.random.key(0), (4, 8, 8, 3))
    params = _tiny_vit("none").init(jax.random.key(1), images)

    def value_and_grad(remat):
        def loss(params, images):
            return jnp.sum(jnp.sin(_tiny_vit(remat).apply(params, images)))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, images)

    plain_value, plain_grads = value_and_grad("none")
    value, grads = value_and_grad(remat)
    np.testing.assert_allclose(value, plain_value, rtol=1e-6)
    for got, expected in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
        # float32 round-off, relative to the array's largest entry (the keys' biases: 0 exactly)
        scale = max(float(np.max(np.abs(expected))), 1.0)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6 * scale)


def _residual_shapes(model, x) -> list[tuple[int, ...]]:
    """The shapes of what the backward pass of `sum(model(x))` keeps (differentiated in its
    parameters and in `x`, as inside a network), parameters apart."""
    params = jax.eval_shape(model.init, jax.random.key(0), x)
    closure = jax.eval_shape(lambda p, x: jax.vjp(lambda q, y: jnp.sum(model.apply(q, y)), p, x)[1], params, x)
    param_shapes = {leaf.shape for leaf in jax.tree.leaves(params)}
    return [leaf.shape for leaf in jax.tree.leaves(closure) if leaf.shape not in param_shapes]


@pytest.mark.parametrize(
    "remat, blocks_keeping_probabilities",
    [
        ("none", 3),
        ("attention", 0),
        ("dots", 0),
        ("full:1,none", 2),
        ("none:2,attention", 2),
        ("attention:1,dots:1,none", 1),
    ],
)
def test_each_block_keeps_the_attention_probabilities_its_policy_says(remat, blocks_keeping_probabilities):
    """XLA's attention keeps two [1, B, heads, L, L] arrays per block (its probabilities and
    scores; a causal mask adds itself and one more); recomputed ("attention"), or in a
    rematerialised block, none."""
    x = jax.ShapeDtypeStruct((2, 5, 16), jnp.float32)
    encoder = transformer.Encoder(depth=3, mlp_dim=64, num_heads=2, remat=remat, attention="xla")
    assert sum(shape[-2:] == (5, 5) for shape in _residual_shapes(encoder, x)) == 2 * blocks_keeping_probabilities


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_layer_norm_keeps_only_its_input(dtype):
    """Recomputed from its input: the backward pass keeps the float32 input alone, whatever
    the activations' dtype; differentiated as written, Flax's kept two float32 arrays of its
    input's shape (its centred input, a square or its normalised output) and statistics."""
    x = jax.ShapeDtypeStruct((2, 5, 16), jnp.float32)
    shapes = _residual_shapes(transformer.LayerNorm(dtype=dtype), x)
    assert shapes == [(2, 5, 16)], shapes


@pytest.mark.parametrize("activation", sorted(transformer.ACTIVATIONS))
def test_the_mlp_s_activation_keeps_only_its_input_and_output(activation):
    """Recomputed from its input: of the [B, L, mlp_dim] arrays, the backward pass keeps the
    activation's input and output (the second Dense's input); differentiated as written,
    exact GELU kept two more (its erf and erf's derivative)."""
    x = jax.ShapeDtypeStruct((2, 5, 16), jnp.float32)
    shapes = _residual_shapes(transformer.MlpBlock(64, activation), x)
    assert shapes.count((2, 5, 64)) == 2, shapes


def test_auto_attention_is_xla_on_the_cpu():
    query = jnp.ones((1, 4, 2, 64), jnp.bfloat16)
    assert transformer._implementation(query, "auto") == "xla"  # the CPU here; cudnn on a GPU
    assert transformer._implementation(query, "cudnn") == "cudnn"


@pytest.mark.parametrize(
    "length_q, length_k, masked",
    [(7, 7, "none"), (7, 7, "padding"), (7, 7, "causal"), (7, 7, "broadcast"), (1, 7, "none"), (6, 5, "none")],
)
def test_attention_padded_to_even_lengths_equals_attention_values_and_gradients(length_q, length_k, masked):
    """The padding cuDNN needs (odd lengths: ViT-B/16's 197, CLIP's 77, the MAP head's 1
    query) changes no number: values and gradients against unpadded attention, through
    XLA's kernel here (the CPU has no cuDNN; on a GPU the same padding feeds cuDNN's)."""
    query = _qkv(length=length_q)[0]
    key, value = _qkv(length=length_k)[1:]
    mask = None
    if masked == "padding":
        mask = _padding_mask([7, 4, 0], 7).astype(bool)  # the third row all padding
    if masked == "broadcast":
        mask = (jnp.arange(length_k) < 5)[None, None, None, :]  # [1, 1, 1, Lk]
    causal = masked == "causal"
    # A query that attends to nothing (a padding token's, which no tower reads) gets what
    # the kernel gives it (XLA: the mean over all keys, the padded one included): left out.
    attends = jnp.ones((1, length_q)) if mask is None else jnp.any(mask, axis=-1)[:, 0]
    attends = attends[:, :, None, None]

    def total(kernel):
        def loss(q, k, v):
            out = kernel(q, k, v, mask=mask, is_causal=causal) * attends
            return jnp.sum(jnp.sin(out)), out

        return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(query, key, value)

    (_, expected), expected_grads = total(functools.partial(jax.nn.dot_product_attention, implementation="xla"))
    (_, got), grads = total(functools.partial(transformer.attention_at_even_lengths, implementation="xla"))
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    for got_grad, expected_grad in zip(grads, expected_grads):
        np.testing.assert_allclose(got_grad, expected_grad, rtol=1e-5, atol=1e-6)


# bfloat16: the towers' activations and the logits' matmul operands in bfloat16,
# float32 accumulation, softmax / log-sum-exp, parameters and gradients. Tolerance: the
# loss within 1%, all gradients together within 3% of their norm, each parameter's within
# 10% of its own norm (bfloat16 keeps 8 bits of mantissa, 0.4% per rounding, over 12
# layers of them; measured 0.1%, 1.3% and at most 5.8%). The key projections' biases are
# left out: their exact gradient is 0 (a softmax ignores what it adds to every score).
LOSS_RTOL, GRADS_RTOL, PARAM_RTOL = 1e-2, 3e-2, 1e-1


def _clip_step(config, params, images, tokens):
    model = two_tower.create_model(model_settings(config), text_vocab_size=64)
    dtype = config.loss.matmul_dtype

    def loss(params):
        out = model.apply(params, images, tokens)
        return losses.clip_loss(out["za"], out["zb"], temperature=out["temperature"], matmul_dtype=dtype)

    return jax.jit(jax.value_and_grad(loss))(params)


def _relative_error(got, expected):
    return float(np.linalg.norm(np.ravel(got - expected)) / np.linalg.norm(np.ravel(expected)))


@pytest.mark.slow
def test_bfloat16_clip_step_within_tolerance_of_float32(load_config):
    config = load_config("default")
    config.model.update(encoder_a="vit_tiny", encoder_b="text_transformer", patch_size=8, encoder_dim=64)
    config.model.update(text_num_layers=2, dropout_rate=0.0, embed_dim=32)
    images = jax.random.uniform(jax.random.key(0), (32, 16, 16, 3))
    tokens = jax.random.randint(jax.random.key(1), (32, 6), 1, 64)
    model = two_tower.create_model(model_settings(config), text_vocab_size=64)
    params = model.init(jax.random.key(2), images, tokens)
    value32, grads32 = _clip_step(config, params, images, tokens)
    config.model.compute_dtype, config.loss.matmul_dtype = "bfloat16", "bfloat16"
    value16, grads16 = _clip_step(config, params, images, tokens)
    assert value16.dtype == jnp.float32 and value16 != value32  # bfloat16 really used
    np.testing.assert_allclose(value16, value32, rtol=LOSS_RTOL)
    flat16, flat32 = (jnp.concatenate([jnp.ravel(g) for g in jax.tree.leaves(t)]) for t in (grads16, grads32))
    assert _relative_error(flat16, flat32) < GRADS_RTOL
    for (path, g16), g32 in zip(jax.tree_util.tree_leaves_with_path(grads16), jax.tree.leaves(grads32)):
        name = jax.tree_util.keystr(path)
        assert g16.dtype == jnp.float32, name
        if "['key']['bias']" not in name:
            assert _relative_error(g16, g32) < PARAM_RTOL, name


def test_transformer_encoders_are_listed(load_config):
    config = load_config("default")
    config.model.update(patch_size=4, encoder_dim=64, text_num_layers=1)
    for name in encoders.ENCODERS:
        config.model.encoder_a = name
        model = two_tower.create_model(model_settings(config), text_vocab_size=16)
        a = jnp.ones((1, 8), jnp.int32) if name.startswith("text_") else jnp.ones((1, 8, 8, 3))
        params = jax.eval_shape(model.init, jax.random.key(0), a, None)["params"]["tower_a"]
        assert ("Transformer" in params) == (name in encoders.TRANSFORMER_ENCODERS), name
