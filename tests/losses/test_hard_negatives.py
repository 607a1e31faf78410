"""Hard negatives (`losses.Candidates(extra_columns=...)`): `clip_loss`, `infonce_loss` and
`siglip_loss` with each pair's M extra columns [B, M, D], against float64 dense references written from the
formulas on the global arrays (a -> b over the N b's and all N M hard negatives; b -> a
over the N a's only; SigLIP's hard negatives labelled -1 for every row), value and
gradient (a, b, the hard negatives, the temperature; SigLIP's bias), M = 1 and 3, on one
device dense and tiled and on 8 devices all-gathered, tiled and around the ring.

Each row's hard negatives lie near its own a (they are hard), and the rows are shuffled
before they are split over the devices, so a device's rows and their negatives are
unrelated to its neighbours'. The references pool the concatenated global arrays: a
kernel that scores a row against its own negatives only, or its device's, or lets a
hard negative into b -> a, gives another loss; one that takes a row's positive by
position in the pool (sentence-transformers PR #3453) pairs it with a negative.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from loss_cases import MODES, assert_matches, enable_x64, with_hard_negatives

from contrastive_jax import losses, sharding
from contrastive_jax.config_lib import load_config
from contrastive_jax.training import run_plan

N, D = 32, 8
TEMPERATURE = 0.1
BIAS = -3.0


def _log_softmax_diagonal(x, y, temperature):
    """``log softmax(x_i . y / T)_i`` [n]: row i's log-probability of its own column i."""
    return jnp.diagonal(jax.nn.log_softmax(x @ y.T / temperature, axis=1)[:, : len(x)])


def _pool(b, hard):
    """The a -> b candidates: the N b's, then the N M hard negatives ``[N (1 + M), D]``."""
    return jnp.concatenate([b, hard.reshape(-1, b.shape[1])])


def infonce_reference(a, b, hard, temperature):
    return -jnp.mean(_log_softmax_diagonal(a, _pool(b, hard), temperature))


def clip_reference(a, b, hard, temperature):
    """a -> b over the pool; b -> a over the N a's (no hard negative)."""
    a_to_b = _log_softmax_diagonal(a, _pool(b, hard), temperature)
    b_to_a = _log_softmax_diagonal(b, a, temperature)
    return -jnp.mean(0.5 * (a_to_b + b_to_a))


def siglip_reference(a, b, hard, temperature, bias):
    """-1/N [sum_ij log sigmoid(z_ij s_ij) + sum_i sum_k log sigmoid(-(a_i . h_k / T + bias))]."""
    labels = 2.0 * jnp.eye(len(a)) - 1.0
    pairs = jnp.sum(jax.nn.log_sigmoid(labels * (a @ b.T / temperature + bias)))
    negatives = jnp.sum(jax.nn.log_sigmoid(-(a @ hard.reshape(-1, a.shape[1]).T / temperature + bias)))
    return -(pairs + negatives) / len(a)


CASES = {  # name -> (kernel, extra hyperparameters, float64 reference)
    "clip": (losses.clip_loss, {}, clip_reference),
    "infonce": (losses.infonce_loss, {}, infonce_reference),
    "siglip": (losses.siglip_loss, {"bias": BIAS}, siglip_reference),
}


def inputs(num_negatives, seed=0):
    """``(a, b, hard)``: unit rows, b near a, each row's hard negatives near its own a
    (closer than b: harder), rows shuffled together."""
    k_a, k_b, k_h, k_perm = jax.random.split(jax.random.key(seed), 4)
    a = losses.l2_normalize(jax.random.normal(k_a, (N, D)))
    b = losses.l2_normalize(a + 0.8 * jax.random.normal(k_b, (N, D)))
    hard = losses.l2_normalize(a[:, None, :] + 0.5 * jax.random.normal(k_h, (N, num_negatives, D)))
    order = jax.random.permutation(k_perm, N)
    return a[order], b[order], hard[order]


def kernel_value_and_grads(name, num_negatives, num_devices, options):
    """The kernel's value and gradients w.r.t. (a, b, hard, (temperature[, bias])), float32."""
    kernel, extra, _ = CASES[name]
    kernel = with_hard_negatives(kernel)
    if num_devices is not None:
        kernel = sharding.shard_loss(kernel, sharding.make_mesh(num_devices))
    params = (jnp.float32(TEMPERATURE), *(jnp.float32(v) for v in extra.values()))

    def loss(a, b, hard, params):
        return kernel(a, b, hard, temperature=params[0], **dict(zip(extra, params[1:])), **options)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(*inputs(num_negatives), params)


def reference_value_and_grads(name, num_negatives, reference=None):
    _, extra, default = CASES[name]
    reference = reference or default
    arrays = tuple(np.asarray(x, np.float64) for x in inputs(num_negatives))  # the kernel's, widened
    with enable_x64():
        params = (np.float64(TEMPERATURE), *(np.float64(v) for v in extra.values()))
        value, grads = jax.value_and_grad(lambda a, b, h, p: reference(a, b, h, *p), argnums=(0, 1, 2, 3))(
            *arrays, params
        )
        return float(value), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("num_negatives", [1, 3])
@pytest.mark.parametrize("name", CASES)
def test_equals_the_float64_reference(name, num_negatives, mode):
    got = kernel_value_and_grads(name, num_negatives, *MODES[mode])
    assert_matches(got, reference_value_and_grads(name, num_negatives))
    assert np.max(np.abs(got[1][2])) > 1e-3  # the hard negatives get their gradient


@pytest.mark.parametrize("mode", ["dense", "8-ring-tiled"])
@pytest.mark.parametrize("name", CASES)
def test_no_hard_negatives_is_the_plain_loss(name, mode):
    """M = 0 (``[B, 0, D]``) and None give the plain loss and its gradients."""
    kernel, extra, _ = CASES[name]
    num_devices, options = MODES[mode]
    a, b, hard = inputs(0)
    wrapped = with_hard_negatives(kernel)
    plain = lambda a, b, hard, **kw: kernel(a, b, **kw)  # noqa: E731
    results = []
    for fn in (wrapped, plain):
        if num_devices is not None:
            fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices))
        loss = lambda a, b, fn=fn: fn(a, b, hard, temperature=TEMPERATURE, **extra, **options)  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, b))
    for got, want in zip(*(jax.tree.leaves(r) for r in results), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def own_negatives_reference(a, b, hard, temperature):
    """InfoNCE with each row against the N b's and its own M hard negatives only."""
    logits = jnp.concatenate([a @ b.T, jnp.einsum("nd,nmd->nm", a, hard)], axis=1) / temperature
    return -jnp.mean(jnp.diagonal(jax.nn.log_softmax(logits, axis=1)[:, :N]))


def test_the_pool_is_shared_whoever_brought_the_negatives():
    """Moving hard negatives between rows leaves the loss unchanged (one pool), while a
    row scored against its own negatives only gives another loss on these inputs."""
    a, b, hard = inputs(3)
    moved = jnp.roll(hard.reshape(-1, D), 5, axis=0).reshape(hard.shape)
    pooled = losses.infonce_loss(a, b, temperature=TEMPERATURE, hard_negatives=hard)
    assert float(losses.infonce_loss(a, b, temperature=TEMPERATURE, hard_negatives=moved)) == pytest.approx(
        float(pooled), rel=1e-6
    )
    own, _ = reference_value_and_grads("infonce", 3, reference=own_negatives_reference)
    assert abs(own - float(pooled)) > 0.1


@pytest.mark.parametrize("name", CASES)
def test_metrics_count_a_hard_negative_that_beats_the_pair(name):
    """A hard negative equal to its row's a beats every b: a -> b top-1 is 0; b -> a, which
    no hard negative enters, is the plain loss's."""
    kernel, extra, _ = CASES[name]
    a, b, _ = inputs(1)
    _, plain = kernel(a, b, temperature=TEMPERATURE, **extra, return_metrics=True)
    _, metrics = kernel(a, b, temperature=TEMPERATURE, **extra, hard_negatives=a[:, None, :], return_metrics=True)
    assert float(metrics["accuracy_a_to_b"]) == 0.0 < float(plain["accuracy_a_to_b"])
    assert float(metrics["accuracy_b_to_a"]) == pytest.approx(float(plain["accuracy_b_to_a"]))


@pytest.mark.parametrize("name", CASES)
def test_the_registry_passes_the_outputs_hard_negatives(name):
    """`losses.LOSSES[name]` lists the option and hands the outputs' `hard_negatives` to
    its kernel, on 8 devices: the reference's loss; without them, the plain loss."""
    assert "extra_columns" in losses.LOSSES[name].options
    settings = run_plan.loss_settings(load_config("default"))
    a, b, hard = inputs(3)
    shared = {"temperature": jnp.float32(TEMPERATURE), "bias": jnp.float32(BIAS)}

    def registered(outputs):
        fn = lambda o: losses.LOSSES[name].fn({**o, **shared}, settings)[0]  # noqa: E731
        spec = P(sharding.BATCH_AXES)
        return jax.jit(jax.shard_map(fn, mesh=sharding.make_mesh(8), in_specs=(spec,), out_specs=P()))(outputs)

    want, _ = reference_value_and_grads(name, 3)
    assert float(registered({"za": a, "zb": b, "hard_negatives": hard})) == pytest.approx(want, rel=1e-5)
    plain = CASES[name][0](a, b, temperature=TEMPERATURE, **CASES[name][1])
    assert float(registered({"za": a, "zb": b})) == pytest.approx(float(plain), rel=1e-5)


def test_only_the_pair_softmax_and_sigmoid_losses_take_hard_negatives():
    takes = sorted(name for name, loss in losses.LOSSES.items() if "extra_columns" in loss.options)
    assert takes == ["clip", "clip_masking_false_negatives", "infonce", "siglip"]
