"""The negatives apart from the batch (`losses.Candidates`): `group_size` (CLIP, InfoNCE and
SigLIP within groups of K consecutive global rows) and `query_rows` (CLIP and InfoNCE
whose rows are the first n of each device's, against every column), against float64
dense references written from the formulas (the groups cut from the global arrays, the
query rows picked by a mask), value and gradient (a, b, the temperature; SigLIP's bias),
on one device dense and tiled and on 8 devices all-gathered, tiled and around the ring.

The groups are cut by global row: K = 2 and 4 lie inside a device's 4 rows (a group by
local index would pair rows of different devices), K = 16 spans 4 devices. The
references group the concatenated global batch, so a wrong offset gives another loss.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loss_cases import MODES, assert_matches, enable_x64

from contrastive_jax import losses, sharding

N, D = 32, 8
TEMPERATURE = 0.1
BIAS = -3.0


def _infonce(queries, keys, temperature):
    """Per query row ``-log softmax(q_i . K / T)_i`` over all the keys given ([n])."""
    return -jnp.diagonal(jax.nn.log_softmax(queries @ keys.T / temperature, axis=1))


def _clip(a, b, temperature):
    return 0.5 * (_infonce(a, b, temperature) + _infonce(b, a, temperature))


def _siglip(a, b, temperature, bias):
    """Per row ``-sum_j log sigmoid(z_ij (a_i . b_j / T + bias))``, z = +1 on the diagonal."""
    labels = 2.0 * jnp.eye(len(a)) - 1.0
    return -jnp.sum(jax.nn.log_sigmoid(labels * (a @ b.T / temperature + bias)), axis=1)


def group_reference(per_row, size):
    """The mean over the N rows of ``per_row`` computed within each group of ``size``
    consecutive rows of the global batch (the mean of the groups' losses)."""

    def reference(a, b, *params):
        groups = [per_row(a[g : g + size], b[g : g + size], *params) for g in range(0, N, size)]
        return jnp.mean(jnp.concatenate(groups))

    return reference


GROUP_LOSSES = {
    "clip": (losses.clip_loss, {}, _clip),
    "infonce": (losses.infonce_loss, {}, _infonce),
    "siglip": (losses.siglip_loss, {"bias": BIAS}, _siglip),
}


def embeddings(seed):
    return losses.l2_normalize(jax.random.normal(jax.random.key(seed), (N, D)))


def kernel_value_and_grads(kernel, extra, num_devices, options):
    """The kernel's value and gradients w.r.t. (a, b, (temperature[, bias])) in float32."""
    if num_devices is not None:
        kernel = sharding.shard_loss(kernel, sharding.make_mesh(num_devices))
    params = (jnp.float32(TEMPERATURE), *(jnp.float32(v) for v in extra.values()))

    def loss(a, b, params):
        return kernel(a, b, temperature=params[0], **dict(zip(extra, params[1:])), **options)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(embeddings(0), embeddings(1), params)


def reference_value_and_grads(reference, extra):
    a, b = (np.asarray(embeddings(seed), np.float64) for seed in (0, 1))  # the kernel's, widened
    with enable_x64():
        params = (np.float64(TEMPERATURE), *(np.float64(v) for v in extra.values()))
        value, grads = jax.value_and_grad(lambda a, b, p: reference(a, b, *p), argnums=(0, 1, 2))(a, b, params)
        return float(value), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [2, 4, 16])
@pytest.mark.parametrize("name", GROUP_LOSSES)
def test_groups_equal_the_per_group_reference(name, size, mode):
    kernel, extra, per_row = GROUP_LOSSES[name]
    num_devices, options = MODES[mode]
    got = kernel_value_and_grads(kernel, extra, num_devices, dict(options, group_size=size))
    assert_matches(got, reference_value_and_grads(group_reference(per_row, size), extra))


@pytest.mark.parametrize("mode", ["dense", "8-ring-tiled"])
@pytest.mark.parametrize("name", GROUP_LOSSES)
def test_one_group_of_the_whole_batch_is_the_plain_loss(name, mode):
    kernel, extra, _ = GROUP_LOSSES[name]
    num_devices, options = MODES[mode]
    whole = kernel_value_and_grads(kernel, extra, num_devices, dict(options, group_size=N))
    plain = kernel_value_and_grads(kernel, extra, num_devices, options)
    for got, want in zip(jax.tree.leaves(whole), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_group_metrics_score_within_the_group():
    """With groups, top-1 and the logsumexp are the group's: with every pair alone in its
    group (K = 1) each row is right and its logsumexp is its own logit."""
    a, b = embeddings(0), embeddings(1)
    _, metrics = losses.clip_loss(a, b, temperature=TEMPERATURE, group_size=1, return_metrics=True)
    assert float(metrics["accuracy_a_to_b"]) == float(metrics["accuracy_b_to_a"]) == 1.0
    assert float(metrics["logsumexp"]) == pytest.approx(float(metrics["positive_logit"]), rel=1e-6)


def query_reference(name, queries):
    """The mean over the query rows (``queries`` [N] bool) of each query row's loss
    against all N rows of the other side (CLIP: both sides' query rows)."""
    index = np.flatnonzero(queries)

    def direction(x, y, t):
        # -log softmax over all N columns of y, at the query row's own column
        return -jax.nn.log_softmax(x[index] @ y.T / t, axis=1)[np.arange(len(index)), index]

    if name == "clip":
        return lambda a, b, t: jnp.mean(0.5 * (direction(a, b, t) + direction(b, a, t)))
    return lambda a, b, t: jnp.mean(direction(a, b, t))


QUERY_CASES = {  # mode -> (query rows per device, the global query rows)
    "dense": (24, np.arange(N) < 24),
    "tiled": (24, np.arange(N) < 24),
    "8-all_gather": (3, np.arange(N) % 4 < 3),
    "8-all_gather-tiled": (3, np.arange(N) % 4 < 3),
    "8-ring": (1, np.arange(N) % 4 < 1),
    "8-ring-tiled": (3, np.arange(N) % 4 < 3),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["clip", "infonce"])
def test_query_rows_equal_the_reference(name, mode):
    """The first n rows of each device are queries against all N columns; the other
    rows, as negatives, get the loss's gradient too."""
    kernel = GROUP_LOSSES[name][0]
    num_devices, options = MODES[mode]
    per_device, queries = QUERY_CASES[mode]
    got = kernel_value_and_grads(kernel, {}, num_devices, dict(options, query_rows=per_device))
    assert_matches(got, reference_value_and_grads(query_reference(name, queries), {}))
    assert np.max(np.abs(got[1][1][~queries])) > 1e-3  # the negative keys' own gradient


@pytest.mark.parametrize("name", ["clip", "infonce"])
def test_all_rows_queries_is_the_plain_loss_with_its_metrics(name):
    kernel = GROUP_LOSSES[name][0]
    a, b = embeddings(0), embeddings(1)
    got = kernel(a, b, temperature=TEMPERATURE, query_rows=N, return_metrics=True)
    want = kernel(a, b, temperature=TEMPERATURE, return_metrics=True)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("num_devices", [None, 8])
def test_infonce_query_rows_return_their_metrics(num_devices):
    """InfoNCE with query rows and metrics (the trainer's "infonce" with extra negatives):
    the metrics score the query rows, b -> a each query row's own key against the query
    rows (it failed on [n] positives against [B] column statistics)."""
    kernel = functools.partial(losses.infonce_loss, return_metrics=True)
    if num_devices is not None:
        kernel = sharding.shard_loss(kernel, sharding.make_mesh(num_devices))
    a, b = embeddings(0), embeddings(1)
    per_device = 3 if num_devices else 24
    queries = np.arange(N) % 4 < 3 if num_devices else np.arange(N) < 24
    loss, metrics = jax.jit(lambda a, b: kernel(a, b, temperature=TEMPERATURE, query_rows=per_device))(a, b)
    assert float(loss) == pytest.approx(reference_value_and_grads(query_reference("infonce", queries), {})[0], rel=1e-5)
    logits = np.asarray(a @ b.T)[np.ix_(queries, queries)]
    right = logits.diagonal() > np.max(np.where(np.eye(len(logits), dtype=bool), -np.inf, logits), axis=0)
    assert float(metrics["accuracy_b_to_a"]) == pytest.approx(np.mean(right))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group_size": 5}, "must divide the global batch N = 32"),
        ({"group_size": -4}, "must divide"),
        ({"query_rows": 0}, r"query_rows=0 must be in \[1, 32\]"),
        ({"query_rows": 33}, "must be in"),
        ({"query_rows": 8, "group_size": 8}, "not both"),
    ],
)
def test_bad_options_are_one_line(options, message):
    with pytest.raises(ValueError, match=message):
        losses.clip_loss(embeddings(0), embeddings(1), temperature=TEMPERATURE, **options)
