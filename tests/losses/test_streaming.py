"""The tiled and ring paths of the softmax/sigmoid losses equal the dense loss.

Each streamed form is compared with the dense single-device loss on the concatenated
batch: the value and the gradients of every array argument and of the temperature
(and SigLIP's bias), to 1e-5 relative in float32. The metrics the paired losses return
equal ``contrastive_metrics``; bfloat16 matmuls stay within a stated tolerance of
float32; SigLIP and InfoNCE stream in one pass.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses, sharding
from contrastive_jax.losses import _common, logit_stats

N, D = 32, 8
RTOL = 1e-5


def _embeddings(seed, n=N, d=D):
    return _common.l2_normalize(jax.random.normal(jax.random.key(seed), (n, d)))


def _paired():
    return (_embeddings(0), _embeddings(1))


def _labeled():
    return (_embeddings(2), jnp.arange(N) % 5)


# name -> (loss, inputs, hyperparameters, which inputs are differentiable)
LOSSES = {
    "infonce": (losses.infonce_loss, _paired, {"temperature": 0.1}, (0, 1)),
    "clip": (losses.clip_loss, _paired, {"temperature": 0.1}, (0, 1)),
    "siglip": (losses.siglip_loss, _paired, {"temperature": 0.1, "bias": -3.0}, (0, 1)),
    "ntxent": (losses.ntxent_loss, _paired, {"temperature": 0.2}, (0, 1)),
    "supcon": (losses.supcon_loss, _labeled, {"temperature": 0.1}, (0,)),
}


def _value_and_grads(name, num_devices=None, **mode):
    """Loss value and gradients (inputs, then array hyperparameters) of one mode."""
    loss_fn, inputs, hyper, diff_args = LOSSES[name]
    arrays = inputs()
    hyper = {k: jnp.float32(v) for k, v in hyper.items()}
    if num_devices is not None:
        loss_fn = sharding.shard_loss(loss_fn, sharding.make_mesh(num_devices))

    def loss(diff, hyper):
        args = list(arrays)
        for index, value in zip(diff_args, diff):
            args[index] = value
        return loss_fn(*args, **hyper, **mode)

    diff = tuple(arrays[i] for i in diff_args)
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(diff, hyper)
    return value, jax.tree.leaves(grads)


@functools.cache
def _dense(name):
    return _value_and_grads(name)


def _assert_equal_to_dense(name, value, grads):
    dense_value, dense_grads = _dense(name)
    np.testing.assert_allclose(value, dense_value, rtol=RTOL)
    for grad, dense_grad in zip(grads, dense_grads, strict=True):
        scale = np.max(np.abs(dense_grad))
        np.testing.assert_allclose(grad / scale, dense_grad / scale, rtol=0, atol=RTOL)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("chunk_size", [8, N])
def test_chunked_equals_dense(name, chunk_size):
    _assert_equal_to_dense(name, *_value_and_grads(name, chunk_size=chunk_size))


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize(
    "mode",
    [
        {"chunk_size": 8},
        {"collective": "ring"},
        {"collective": "ring", "chunk_size": 2},
    ],
    ids=["all_gather-chunked", "ring", "ring-chunked"],
)
@pytest.mark.compat
def test_sharded_streaming_equals_dense_on_8_devices(name, mode):
    _assert_equal_to_dense(name, *_value_and_grads(name, num_devices=8, **mode))


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("num_devices", [2, 4])
def test_ring_equals_dense(name, num_devices):
    _assert_equal_to_dense(name, *_value_and_grads(name, num_devices=num_devices, collective="ring", chunk_size=4))


# CLIP (both directions, the two-pass kernel) by default; every loss with -m slow.
@pytest.mark.parametrize("name", [n if n == "clip" else pytest.param(n, marks=pytest.mark.slow) for n in LOSSES])
@pytest.mark.parametrize("num_devices", [2, 4])
@pytest.mark.parametrize("mode", [{"collective": "ring"}, {"chunk_size": 16}], ids=str)
def test_more_device_counts(name, num_devices, mode):
    _assert_equal_to_dense(name, *_value_and_grads(name, num_devices=num_devices, **mode))


@pytest.mark.compat
def test_ring_under_pmap_gives_each_device_its_local_loss_gradient():
    """Under pmap each device's gradient w.r.t. its rows is its local loss's: K times
    its rows' share of the global gradient (docs/global_batch.md, the contract)."""
    a, b = _paired()
    devices = 4

    def local(a, b):
        return losses.clip_loss(a, b, temperature=0.1, axis_name="d", collective="ring", chunk_size=4)

    value, (grad_a, grad_b) = jax.pmap(jax.value_and_grad(local, argnums=(0, 1)), "d")(
        a.reshape(devices, -1, D), b.reshape(devices, -1, D)
    )
    dense_value, (dense_a, dense_b, _) = _dense("clip")
    np.testing.assert_allclose(value, np.full(devices, dense_value), rtol=RTOL)
    np.testing.assert_allclose(grad_a.reshape(N, D) / devices, dense_a, atol=RTOL * np.max(np.abs(dense_a)))
    np.testing.assert_allclose(grad_b.reshape(N, D) / devices, dense_b, atol=RTOL * np.max(np.abs(dense_b)))


def test_bfloat16_embeddings_stream_like_dense():
    a, b = (x.astype(jnp.bfloat16) for x in _paired())
    dense = losses.clip_loss(a, b, temperature=0.1)
    chunked = losses.clip_loss(a, b, temperature=0.1, chunk_size=8)
    np.testing.assert_allclose(chunked, dense, rtol=RTOL)
    grad = jax.grad(lambda a: losses.clip_loss(a, b, temperature=0.1, chunk_size=8))(a)
    assert grad.dtype == jnp.bfloat16


# ------------------------------------------------------------------- options


def test_auto_chunk_size_by_platform_and_width():
    assert logit_stats.auto_chunk_size(16384, 64, "cpu") == 512
    assert logit_stats.auto_chunk_size(16384, 512, "cpu") == 1024
    assert logit_stats.auto_chunk_size(16384, 512, "gpu") == 8192
    assert logit_stats.auto_chunk_size(16384, 512, "tpu") == 2048
    assert logit_stats.auto_chunk_size(8192, 512, "gpu") is None  # one GPU tile: dense
    assert logit_stats.auto_chunk_size(3 * 1000, 64, "cpu") == 500  # a divisor of N
    assert logit_stats.auto_chunk_size(512, 64, "cpu") is None  # one tile: dense


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_auto_chunk_size_streams_and_equals_dense(name):
    loss_fn, _, hyper, _ = LOSSES[name]
    a, b = (_embeddings(seed, n=1024) for seed in (0, 1))
    dense = jax.jit(lambda a, b: loss_fn(a, b, **hyper))(a, b)
    auto = jax.jit(lambda a, b: loss_fn(a, b, **hyper, chunk_size="auto"))
    np.testing.assert_allclose(auto(a, b), dense, rtol=RTOL)
    # Streamed, not dense: no [1024, 1024] logits in the compiled program.
    assert "1024x1024xf32" not in auto.lower(a, b).as_text()
    assert "1024x1024xf32" in jax.jit(lambda a, b: loss_fn(a, b, **hyper)).lower(a, b).as_text()


# Mixed precision: bfloat16 matmul operands, float32 accumulation, logits and
# logsumexps. Measured (N=256, D=32): values within 1.1e-4 relative, gradients within
# 5e-3 of their largest entry. Stated tolerance: 1e-3 and 1e-2.
BF16_VALUE_RTOL, BF16_GRAD_ATOL = 1e-3, 1e-2


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("chunk_size", [None, 8])
def test_bfloat16_matmuls_within_tolerance_of_float32(name, chunk_size):
    value, grads = _value_and_grads(name, chunk_size=chunk_size, matmul_dtype="bfloat16")
    dense_value, dense_grads = _dense(name)
    np.testing.assert_allclose(value, dense_value, rtol=BF16_VALUE_RTOL)
    assert not np.allclose(value, dense_value, rtol=1e-7, atol=0)  # bfloat16 really used
    for grad, dense_grad in zip(grads, dense_grads, strict=True):
        scale = np.max(np.abs(dense_grad))
        np.testing.assert_allclose(grad / scale, dense_grad / scale, rtol=0, atol=BF16_GRAD_ATOL)


def _matmuls_in_gradient(name, **mode):
    loss_fn, inputs, hyper, _ = LOSSES[name]
    a, b = inputs()
    jaxpr = jax.make_jaxpr(jax.grad(lambda a, b: loss_fn(a, b, **hyper, **mode), (0, 1)))(a, b)
    return str(jaxpr).count("dot_general")


@pytest.mark.parametrize("name", ["siglip", "infonce"])
def test_one_pass_losses_do_three_tile_matmuls_clip_four(name):
    """One pass: the logits and the two gradient products (6 N^2 D flops); CLIP
    recomputes the logits in its backward pass (8 N^2 D)."""
    assert _matmuls_in_gradient(name, chunk_size=8) == 3
    assert _matmuls_in_gradient("clip", chunk_size=8) == 4


# ------------------------------------------------------------------- metrics


def _retrieval_pairs():
    """Pairs where about half the rows retrieve their partner (accuracy not 0 or 1)."""
    a = _embeddings(0)
    b = _common.l2_normalize(a + 0.35 * jax.random.normal(jax.random.key(6), a.shape))
    return a, b


def _reference_metrics(a, b, temperature):
    """contrastive_metrics' definitions on the dense logits, in float64 numpy."""
    logits = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T / temperature
    n = len(logits)
    diagonal = np.diag(logits)
    row_max = logits.max(axis=1, keepdims=True)
    return {
        "accuracy_a_to_b": np.mean(logits.argmax(axis=1) == np.arange(n)),
        "accuracy_b_to_a": np.mean(logits.argmax(axis=0) == np.arange(n)),
        "positive_logit": diagonal.mean(),
        "negative_logit": (logits.sum() - diagonal.sum()) / (n * (n - 1)),
        "logsumexp": np.mean(row_max[:, 0] + np.log(np.exp(logits - row_max).sum(axis=1))),
    }


METRIC_LOSSES = {
    "clip": (losses.clip_loss, {}),
    "infonce": (losses.infonce_loss, {}),
    "siglip": (losses.siglip_loss, {"bias": -3.0}),
}


@pytest.mark.parametrize("name", METRIC_LOSSES)
@pytest.mark.parametrize(
    "num_devices, mode",
    [
        (None, {"chunk_size": 8}),
        (1, {"chunk_size": 8}),
        (2, {"chunk_size": 8}),
        (4, {}),
        (8, {"collective": "ring", "chunk_size": 2}),
        pytest.param(None, {}, marks=pytest.mark.slow),
        pytest.param(8, {"chunk_size": 8}, marks=pytest.mark.slow),
        pytest.param(2, {"collective": "ring"}, marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_metrics_from_the_loss_equal_contrastive_metrics(name, num_devices, mode):
    loss_fn, hyper = METRIC_LOSSES[name]
    a, b = _retrieval_pairs()
    want = _reference_metrics(a, b, temperature=0.1)
    assert want["accuracy_a_to_b"] != want["accuracy_b_to_a"]  # the directions differ
    np.testing.assert_allclose(  # and contrastive_metrics agrees with the reference
        list(losses.contrastive_metrics(a, b, temperature=0.1).values()),
        [want[k] for k in losses.contrastive_metrics(a, b, temperature=0.1)],
        rtol=RTOL,
    )
    if num_devices is not None:
        loss_fn = sharding.shard_loss(loss_fn, sharding.make_mesh(num_devices))

    def loss_and_metrics(a, b):
        return loss_fn(a, b, temperature=0.1, **hyper, **mode, return_metrics=True)

    loss, got = jax.jit(loss_and_metrics)(a, b)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=1e-6, err_msg=key)
    plain_loss = jax.jit(lambda a, b: loss_fn(a, b, temperature=0.1, **hyper, **mode))(a, b)
    np.testing.assert_allclose(loss, plain_loss, rtol=RTOL)
    # The metrics carry no gradient: adding them to the loss changes no gradient.
    with_metrics = jax.jit(jax.grad(lambda a: sum(jax.tree.leaves(loss_and_metrics(a, b)))))(a)
    without = jax.jit(jax.grad(lambda a: loss_and_metrics(a, b)[0]))(a)
    np.testing.assert_array_equal(with_metrics, without)


# ----------------------------------------------------------------------------- errors


def test_chunk_size_that_does_not_divide_names_a_fix():
    a, b = _paired()
    with pytest.raises(
        ValueError, match=r"chunk_size=12 must divide the candidate columns \(N\) \(32\); use 8 or 16\."
    ):
        losses.clip_loss(a, b, temperature=0.1, chunk_size=12)
    with pytest.raises(ValueError, match="chunk_size must be a positive int, 'auto' or None"):
        losses.infonce_loss(a, b, temperature=0.1, chunk_size=0)
    with pytest.raises(ValueError, match=r"matmul_dtype must be one of \(None, 'bfloat16'"):
        losses.siglip_loss(a, b, temperature=0.1, bias=0.0, matmul_dtype="fp8")


def test_ring_chunk_must_divide_the_local_shard():
    a, b = _paired()
    loss = sharding.shard_loss(losses.clip_loss, sharding.make_mesh(8))
    with pytest.raises(
        ValueError,
        match=r"chunk_size=8 must divide the columns of each device's shard with collective='ring' \(4\); use 4\.",
    ):
        loss(a, b, temperature=0.1, collective="ring", chunk_size=8)


def test_unknown_collective_lists_the_valid_ones():
    a, b = _paired()
    with pytest.raises(ValueError, match=r"one of \('all_gather', 'ring'\), got 'tree'"):
        losses.clip_loss(a, b, temperature=0.1, collective="tree")


def test_ring_without_axis_name_says_what_to_do():
    z, labels = _labeled()
    with pytest.raises(ValueError, match="collective='ring' .* needs axis_name"):
        losses.supcon_loss(z, labels, temperature=0.1, collective="ring")


# ----------------------------------------------------------------------------- memory


def _temp_bytes(fn, *shapes):
    compiled = jax.jit(jax.grad(fn, argnums=tuple(range(len(shapes))))).lower(*shapes).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_gradient_memory_is_linear_in_the_batch():
    def temp(n, chunk_size):
        shape = jax.ShapeDtypeStruct((n, 16), jnp.float32)
        return _temp_bytes(
            lambda a, b: losses.clip_loss(a, b, temperature=0.1, chunk_size=chunk_size),
            shape,
            shape,
        )

    assert temp(2048, 64) * 20 < temp(2048, None)
    assert temp(4096, 64) < 2.2 * temp(2048, 64)


def test_ring_per_device_memory_is_at_most_all_gather():
    mesh = sharding.make_mesh(8)
    shape = jax.ShapeDtypeStruct((1024, 16), jnp.float32, sharding=sharding.data_sharding(mesh))

    def temp(**mode):
        loss = sharding.shard_loss(losses.clip_loss, mesh)
        return _temp_bytes(lambda a, b: loss(a, b, temperature=0.1, **mode), shape, shape)

    assert temp(collective="ring") <= temp(chunk_size=128) <= temp()


@pytest.mark.parametrize(
    "loss",
    [
        functools.partial(losses.triplet_loss, margin=0.2, mining="batch_all"),
        functools.partial(losses.triplet_loss, margin=0.2, mining="semi_hard"),
        functools.partial(losses.triplet_loss, margin=0.2, mining="batch_hard"),
        functools.partial(losses.contrastive_loss, margin=0.5),
        losses.multi_similarity_loss,
        functools.partial(losses.supcon_loss, temperature=0.1),
    ],
    ids=["batch_all", "semi_hard", "batch_hard", "contrastive", "multi_similarity", "supcon"],
)
def test_label_losses_gradient_memory_is_at_most_quadratic(loss):
    def temp(n):
        labels = jnp.arange(n) % 7
        return _temp_bytes(lambda z: loss(z, labels), jax.ShapeDtypeStruct((n, 8), jnp.float32))

    # O(N^3) (a [N, N, N] triplet table kept for the backward pass) would give 8x.
    assert temp(1024) < 4.5 * temp(512)
