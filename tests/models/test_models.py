"""Models: reference parameter counts, output contracts, temperature, ties, dtypes."""

import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses
from contrastive_jax.models import encoders, two_tower
from contrastive_jax.training.run_plan import model_settings


def num_params(module, *inputs):
    variables = jax.eval_shape(lambda: module.init(jax.random.key(0), *inputs))
    return sum(x.size for x in jax.tree.leaves(variables["params"]))


@pytest.mark.parametrize(
    "module, reference",
    [
        # torchvision resnet18 / resnet50 (11,689,512 / 25,557,032) less the 1000-way fc.
        (encoders.ResNet((2, 2, 2, 2), encoders.BasicBlock), 11_689_512 - 513_000),
        (encoders.ResNet((3, 4, 6, 3), encoders.BottleneckBlock), 25_557_032 - 2_049_000),
        # timm vit_base_patch16_224 (86,567,656) less the 1000-way head.
        (encoders.ViT(768, 12, 12, 3072, patch_size=16), 86_567_656 - 769_000),
    ],
)
def test_encoders_match_reference_parameter_counts(module, reference):
    assert num_params(module, jnp.zeros((1, 224, 224, 3))) == reference


@pytest.fixture
def config(load_config):
    return load_config("default")


def test_two_tower_outputs(config):
    model = two_tower.create_model(model_settings(config), text_vocab_size=257)
    a, b = jax.random.uniform(jax.random.key(1), (2, 5, 4, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(0), a, b)
    out = jax.jit(model.apply)(variables, a, b)
    assert out["za"].shape == out["zb"].shape == (5, 64)
    assert out["za"].dtype == jnp.float32
    np.testing.assert_allclose(jnp.linalg.norm(out["za"], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(out["zb"], axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out["temperature"], 0.07, rtol=1e-6)
    assert variables["params"][two_tower.TEMPERATURE_PARAM] == pytest.approx(math.log(1 / 0.07))
    assert "bias" not in out


def test_siglip_temperature_and_bias(config):
    config.loss.name, config.loss.temperature = "siglip", 0.1
    model = two_tower.create_model(
        model_settings(config, learned_bias=losses.LOSSES["siglip"].learned_bias), text_vocab_size=257
    )
    x = jnp.zeros((2, 4, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(0), x, x)
    assert variables["params"][two_tower.TEMPERATURE_PARAM] == pytest.approx(math.log(10))
    assert jax.jit(model.apply)(variables, x, x)["bias"] == -10.0


def test_fixed_temperature_is_not_a_parameter(config):
    config.loss.learn_temperature = False
    model = two_tower.create_model(model_settings(config), text_vocab_size=257)
    x = jnp.zeros((2, 4, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(0), x, x)
    assert two_tower.TEMPERATURE_PARAM not in variables["params"]
    np.testing.assert_allclose(jax.jit(model.apply)(variables, x, x)["temperature"], 0.07, rtol=1e-6)


def test_clamp_caps_inverse_temperature_at_100():
    params = {"log_inv_temperature": jnp.float32(7.0), "dense": {"kernel": jnp.full((2,), 9.0)}}
    clamped = two_tower.clamp_temperature(params)
    assert float(clamped["log_inv_temperature"]) == pytest.approx(math.log(100))
    np.testing.assert_array_equal(clamped["dense"]["kernel"], 9.0)  # other params untouched
    assert float(two_tower.clamp_temperature({"log_inv_temperature": jnp.float32(2.0)})["log_inv_temperature"]) == 2.0


def test_tied_towers_share_one_encoder(config):
    x = jax.random.uniform(jax.random.key(1), (3, 8, 8, 1))
    config.model.tie_towers = True
    tied = two_tower.create_model(model_settings(config), text_vocab_size=257)
    variables = jax.jit(tied.init)(jax.random.key(0), x, x)
    out = jax.jit(tied.apply)(variables, x, x)
    np.testing.assert_array_equal(out["za"], out["zb"])
    config.model.tie_towers = False
    untied = two_tower.create_model(model_settings(config), text_vocab_size=257)
    assert num_params(untied, x, x) == 2 * num_params(tied, x, x) - 1  # one temperature


def test_bfloat16_compute_keeps_float32_params_and_embeddings(config):
    config.model.compute_dtype = "bfloat16"
    model = two_tower.create_model(model_settings(config), text_vocab_size=257)
    x = jnp.ones((2, 4, 8, 1))
    variables = jax.jit(model.init)(jax.random.key(0), x, x)
    assert {p.dtype for p in jax.tree.leaves(variables)} == {jnp.dtype(jnp.float32)}
    out = jax.jit(model.apply)(variables, x, x)
    assert out["za"].dtype == jnp.float32


def test_classifier_head_and_text_tower(config):
    config.model.num_classes = 10
    config.model.encoder_b = "text_transformer"
    config.model.encoder_dim = 64
    config.model.text_num_layers = 1
    model = two_tower.create_model(model_settings(config), text_vocab_size=257)
    image = jnp.ones((2, 4, 8, 1))
    tokens = jnp.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    variables = jax.jit(model.init)(jax.random.key(0), image, tokens)
    apply = jax.jit(model.apply)  # one compile, not one per op
    out = apply(variables, image, tokens)
    assert out["logits"].shape == (2, 10) and out["proxies"].shape == (10, 64)
    # The text embedding depends on the real tokens.
    changed = apply(variables, image, tokens.at[0, 1].set(9))["zb"]
    assert not np.allclose(changed[0], out["zb"][0])
    np.testing.assert_allclose(changed[1], out["zb"][1], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(encoders.ENCODERS))
def test_every_encoder_builds(config, name):
    config.model.encoder_a = name
    config.model.patch_size = 4
    config.model.encoder_dim = 64
    model = two_tower.create_model(model_settings(config), text_vocab_size=257)
    a = jnp.ones((2, 8), jnp.int32) if name.startswith("text_") else jnp.ones((2, 16, 16, 3))
    out = jax.eval_shape(lambda: model.apply(model.init(jax.random.key(0), a, None), a, None))
    assert out["za"].shape == (2, 64)


def test_a_patch_size_that_does_not_divide_the_image_is_named(config):
    config.model.encoder_a, config.model.patch_size = "vit_tiny", 5
    model = two_tower.create_model(model_settings(config), text_vocab_size=257)
    images = jnp.ones((2, 16, 16, 3))
    message = r"config.model.patch_size=5 must divide the image size \(config.data.image_size\) \(16\); use 4 or 8\."
    with pytest.raises(ValueError, match=message):
        jax.eval_shape(lambda: model.init(jax.random.key(0), images, None))


def test_unknown_encoder_names_the_field(config):
    config.model.encoder_b = "resnet19"
    with pytest.raises(ValueError, match=r"config.model.encoder_b='resnet19'.*resnet18"):
        two_tower.create_model(model_settings(config), text_vocab_size=257)


def test_text_cnn_ignores_padding_and_depends_on_every_real_token():
    cnn = encoders.TextCNN(vocab_size=257, features=(8, 8), out_dim=4)
    tokens = jnp.array([[5, 6, 7, 0, 0], [9, 0, 0, 0, 0]])
    variables = jax.jit(cnn.init)(jax.random.key(0), tokens)
    apply = jax.jit(cnn.apply)  # one compile per shape, not one per op
    out = apply(variables, tokens)
    # Padded further, or with no padding at all, the real tokens give the same output.
    longer = apply(variables, jnp.pad(tokens, ((0, 0), (0, 7))))
    np.testing.assert_allclose(longer, out, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(apply(variables, tokens[1:, :1]), out[1:], rtol=1e-6, atol=1e-6)
    for position in range(3):  # every real token of row 0 matters, row 1 is untouched
        changed = apply(variables, tokens.at[0, position].set(11))
        assert not np.allclose(changed[0], out[0])
        np.testing.assert_allclose(changed[1], out[1], rtol=1e-6)
    # An all-padding row is finite.
    assert np.all(np.isfinite(apply(variables, jnp.zeros((1, 5), jnp.int32))))


@pytest.mark.parametrize("kernel_size", [1, 3, 4])
def test_conv1d_equals_flax_conv_in_value_and_gradient(kernel_size):
    x = jax.random.normal(jax.random.key(0), (5, 7, 6))
    conv = encoders.Conv1D(features=8, kernel_size=kernel_size)
    params = conv.init(jax.random.key(1), x)
    params["params"]["bias"] = jax.random.normal(jax.random.key(2), (8,))
    flax_conv = nn.Conv(8, (kernel_size,), padding="SAME")

    def loss(module, params, x):
        return jnp.sum(jnp.sin(module.apply(params, x)))

    np.testing.assert_allclose(conv.apply(params, x), flax_conv.apply(params, x), atol=1e-5)
    grads = jax.jit(jax.grad(functools.partial(loss, conv), argnums=(0, 1)))(params, x)
    expected = jax.jit(jax.grad(functools.partial(loss, flax_conv), argnums=(0, 1)))(params, x)
    chex.assert_trees_all_close(grads, expected, atol=1e-5)
