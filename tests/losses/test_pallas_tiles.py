"""The Pallas fused-tile path equals XLA's streamed path.

``Streaming(kernel="pallas_interpret")`` runs :mod:`contrastive_jax.losses.pallas_tiles`'
kernels in Pallas's interpret mode on the CPU; each case compares the loss and the
gradients of the embeddings, the temperature and SigLIP's bias with XLA's tiles, to
float32 round-off. The kernels' blocks (``chunk_size``) do not divide the batch, so the
last block is padded; 1 and 8 devices inside ``shard_map``, all-gather and ring.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from contrastive_jax import losses, sharding
from contrastive_jax.losses import _common, logit_stats, streaming

N, D = 24, 8  # 3 rows per device on 8 devices
BLOCK = 5  # divides neither N nor a device's 3 rows
RTOL = 2e-6

LOSSES = {
    "clip": (losses.clip_loss, {"temperature": 0.1}),
    "infonce": (losses.infonce_loss, {"temperature": 0.1}),
    "siglip": (losses.siglip_loss, {"temperature": 0.1, "bias": -3.0}),
}


def _embeddings(seed, n=N):
    return _common.l2_normalize(jax.random.normal(jax.random.key(seed), (n, D)))


def _value_and_grads(name, num_devices=None, candidates=None, **options):
    """Loss value and the gradients of ``a``, ``b`` and the hyperparameters."""
    loss_fn, hyper = LOSSES[name]
    hyper = {k: jnp.float32(v) for k, v in hyper.items()}
    if num_devices is not None:
        loss_fn = sharding.shard_loss(loss_fn, sharding.make_mesh(num_devices))

    def loss(a, b, hyper):
        return loss_fn(a, b, **hyper, candidates=candidates, streaming=losses.Streaming(**options))

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(_embeddings(0), _embeddings(1), hyper)
    return value, jax.tree.leaves(grads)


def _assert_close(got, want):
    np.testing.assert_allclose(got[0], want[0], rtol=RTOL)
    for grad, want_grad in zip(got[1], want[1], strict=True):
        scale = np.max(np.abs(want_grad))
        np.testing.assert_allclose(grad / scale, want_grad / scale, rtol=0, atol=RTOL)


def _pallas_equals_xla(name, num_devices=None, candidates=None, xla_chunk=4, **options):
    pallas = _value_and_grads(name, num_devices, candidates, chunk_size=BLOCK, kernel="pallas_interpret", **options)
    xla = _value_and_grads(name, num_devices, candidates, chunk_size=xla_chunk, **options)
    _assert_close(pallas, xla)


@pytest.mark.parametrize("name", LOSSES)
def test_pallas_equals_xla_with_a_partial_last_block(name):
    _pallas_equals_xla(name)


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize(
    "num_devices, collective",
    [
        (1, "all_gather"),
        (8, "all_gather"),
        pytest.param(1, "ring", marks=pytest.mark.slow),
        pytest.param(8, "ring", marks=pytest.mark.slow),
    ],
)
def test_pallas_equals_xla_inside_shard_map(name, num_devices, collective):
    # The ring's XLA tiles must divide a device's shard (3 rows on 8 devices).
    xla_chunk = 3 if collective == "ring" else 4
    _pallas_equals_xla(name, num_devices, collective=collective, xla_chunk=xla_chunk)


@pytest.mark.slow
def test_pallas_ring_on_two_devices_equals_xla():
    """The ring's hops and last return of the column carry, in the default suite."""
    _pallas_equals_xla("clip", 2, collective="ring", xla_chunk=4)


OPTIONS = {
    # several positives (ids compared as sets on the softmax losses' positives)
    "clip-positive_ids": ("clip", losses.Candidates(positive_ids=jnp.arange(N) // 3), {}),
    "siglip-positive_ids": ("siglip", losses.Candidates(positive_ids=jnp.arange(N) // 2), {}),
    # in-batch false negatives left out of the softmax
    "infonce-false_negatives": ("infonce", losses.Candidates(false_negative_ids=jnp.arange(N) % 7), {}),
    # each row's candidates its group of K
    "clip-group_size": ("clip", losses.Candidates(group_size=4), {}),
    "siglip-group_size": ("siglip", losses.Candidates(group_size=6), {}),
    # two extra negative columns per row (hard negatives)
    "infonce-extra_columns": ("infonce", losses.Candidates(extra_columns=_embeddings(2, 2 * N).reshape(N, 2, D)), {}),
    "clip-bfloat16": ("clip", None, {"matmul_dtype": "bfloat16"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", OPTIONS)
def test_pallas_takes_the_losses_options(case):
    name, candidates, options = OPTIONS[case]
    _pallas_equals_xla(name, candidates=candidates, **options)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_pallas_metrics_equal_xla(name):
    """The best negatives (a masked max) and row logsumexps of the retrieval metrics."""
    loss_fn, hyper = LOSSES[name]
    a, b = _embeddings(0), _embeddings(1)

    def metrics(**options):
        return loss_fn(a, b, **hyper, streaming=losses.Streaming(**options), return_metrics=True)[1]

    got, want = metrics(chunk_size=BLOCK, kernel="pallas_interpret"), metrics()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, err_msg=key)


def test_pallas_is_xla_where_it_cannot_compile():
    assert streaming.resolve_kernel("pallas", "cpu") == "xla"
    assert streaming.resolve_kernel("pallas", "gpu") == "pallas"
    assert streaming.resolve_kernel("pallas_interpret", "cpu") == "pallas_interpret"
    # On this CPU "pallas" is XLA's path, tiled by the largest divisor of N under the block.
    _assert_close(_value_and_grads("clip", chunk_size=BLOCK, kernel="pallas"), _value_and_grads("clip", chunk_size=4))


def test_pallas_auto_block_and_plan():
    x = jnp.zeros((N, D))
    plan = logit_stats._plan(losses.Streaming("auto", kernel="pallas_interpret"), x.shape, 300, False, x.dtype)
    assert plan == (streaming.PALLAS_BLOCK, streaming.PALLAS_BLOCK, x.dtype, "pallas_interpret")


def test_unknown_kernel_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"kernel must be one of \('xla', 'pallas', 'pallas_interpret'\)"):
        losses.clip_loss(_embeddings(0), _embeddings(1), temperature=0.1, streaming=losses.Streaming(4, kernel="cuda"))
