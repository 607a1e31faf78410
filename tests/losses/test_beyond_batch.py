"""DCL, SogCLR, the MoCo queue and the cross-batch memory against direct references.

Values against float64 NumPy written from the papers' formulas (SogCLR: the math of
LibAUC's ``GCLoss`` classes, two modalities, with ``GCLoss_v2``'s running-max shift),
gradients against ``jax.grad`` of the dense references; the streamed forms (tiles,
ring) and the sharded forms (state included) against the single-device dense one. The
kernels' sharded == single-device value and gradient on 1/2/4/8 devices (shard_map and
pmap) are in ``test_losses_sharded.py`` (``loss_cases.loss_examples`` holds DCL, DCLW, the queue
and XBM). Each bad input: one ValueError, its message matched.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from loss_cases import enable_x64

from contrastive_jax import losses, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import _common, registry
from contrastive_jax.sharding import BATCH_AXES, DATA_AXIS
from contrastive_jax.training.run_plan import loss_settings

N, D, K = 16, 8, 32
T = 0.2


def _unit(seed, n, d=D):
    return _common.l2_normalize(jax.random.normal(jax.random.key(seed), (n, d)))


def _pairs(seed=0):
    a = _unit(seed, N)
    return a, _common.l2_normalize(a + 0.7 * _unit(seed + 100, N))


def _close(actual, expected, rtol=1e-5):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=rtol * 1e-2)


def _grads_close(actual, expected, rtol=1e-5):
    for got, want in zip(actual, expected):
        scale = float(np.max(np.abs(np.asarray(want))))
        assert float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) <= rtol * scale


def _float64(fn, *arrays):
    """``fn`` of the arrays in float64, value and gradients (every array argument)."""
    with enable_x64():
        arrays = [jnp.asarray(np.asarray(x, np.float64)) for x in arrays]
        value, grads = jax.jit(jax.value_and_grad(fn, argnums=tuple(range(len(arrays)))))(*arrays)
        return float(value), [np.asarray(g) for g in grads]


# ------------------------------------------------------------------------------ DCL


def _dcl_numpy(a, b, temperature, sigma=None):
    """DCL / DCLW pair by pair in float64, both directions averaged."""
    s = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T
    n = len(s)
    weight = np.ones(n)
    if sigma is not None:
        e = np.exp(np.diag(s) / sigma)
        weight = 2 - e / e.mean()
    total = 0.0
    for i in range(n):
        for logits in (s[i], s[:, i]):
            negatives = [logits[j] / temperature for j in range(n) if j != i]
            total += -weight[i] * s[i, i] / temperature + np.log(np.sum(np.exp(negatives)))
    return total / (2 * n)


def _dcl_dense(a, b, temperature, sigma=None, weight_gradient=False):
    """The dense DCL in jnp (for jax.grad); DCLW's weight without gradient, or with it
    (``weight_gradient``: lightly's ``DCLWLoss`` before it detached the weight, ``2 - N
    softmax(cos / sigma)``, the DCL authors' weight times N)."""
    s = a @ b.T / temperature
    off = ~jnp.eye(len(s), dtype=bool)
    row = jax.nn.logsumexp(jnp.where(off, s, -jnp.inf), axis=1)
    col = jax.nn.logsumexp(jnp.where(off, s, -jnp.inf), axis=0)
    weight = 1.0
    if sigma is not None:
        weight = 2 - len(s) * jax.nn.softmax(jnp.sum(a * b, axis=1) / sigma)
        if not weight_gradient:
            weight = jax.lax.stop_gradient(weight)
    return jnp.mean(0.5 * (row + col) - weight * jnp.diag(s))


@pytest.mark.parametrize("sigma", [None, 0.5])
def test_dcl_matches_the_float64_reference_and_its_gradient(sigma):
    a, b = _pairs()
    value, grads = jax.jit(
        jax.value_and_grad(lambda a, b: losses.dcl_loss(a, b, temperature=T, weight_sigma=sigma), argnums=(0, 1))
    )(a, b)
    _close(value, _dcl_numpy(a, b, T, sigma))
    want_value, want_grads = _float64(functools.partial(_dcl_dense, temperature=T, sigma=sigma), a, b)
    _close(value, want_value)
    _grads_close(grads, want_grads)


@pytest.mark.parametrize(
    "num_devices, options",
    [(None, {}), (None, {"chunk_size": 8}), (4, {}), (8, {"chunk_size": 2, "collective": "ring"})],
)
def test_dclw_weight_gradient_is_the_reference_codes_gradient(num_devices, options):
    """``weight_gradient=True``: the value is DCLW's, the gradient flows through the
    weight (float64 reference), single device, streamed and sharded; a gradient far
    from the detached weight's."""
    a, b = _pairs()
    fn = functools.partial(losses.dcl_loss, temperature=T, weight_sigma=0.5, weight_gradient=True, **options)
    if num_devices is not None:
        fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices))
    value, grads = jax.jit(jax.value_and_grad(fn, argnums=(0, 1)))(a, b)
    _close(value, _dcl_numpy(a, b, T, 0.5))
    want_value, want_grads = _float64(
        functools.partial(_dcl_dense, temperature=T, sigma=0.5, weight_gradient=True), a, b
    )
    _close(value, want_value)
    _grads_close(grads, want_grads)
    _, detached = _float64(functools.partial(_dcl_dense, temperature=T, sigma=0.5), a, b)
    for got, other in zip(grads, detached):
        assert np.linalg.norm(np.asarray(got) - other) > 0.05 * np.linalg.norm(other)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"weight_sigma": 0.5, "weight_gradient": 1}, r"^dcl_loss's weight_gradient must be a bool .* got 1\.$"),
        ({"weight_gradient": True}, r"^dcl_loss's weight_gradient=True needs DCLW's weighting: pass weight_sigma"),
    ],
)
def test_dcl_rejects_a_bad_weight_gradient(options, match):
    a, b = _pairs()
    with pytest.raises(ValueError, match=match):
        losses.dcl_loss(a, b, temperature=T, **options)


def test_dcl_drops_the_positive_from_the_denominator():
    """DCL is InfoNCE's clip loss minus the positive's share of each softmax:
    clip - dcl = mean over rows and columns of -log(1 - softmax_ii)."""
    a, b = _pairs()
    s = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T / T
    p_row = np.exp(np.diag(s) - np.log(np.exp(s).sum(1)))
    p_col = np.exp(np.diag(s) - np.log(np.exp(s).sum(0)))
    gap = -0.5 * (np.log1p(-p_row) + np.log1p(-p_col)).mean()
    _close(losses.clip_loss(a, b, temperature=T) - losses.dcl_loss(a, b, temperature=T), gap, 1e-4)


# --------------------------------------------------------------------------- SogCLR


def _sogclr_numpy(a, b, index, u, shift, temperature, gamma):
    """SogCLR written from LibAUC's ``GCLoss`` classes: ``GCLoss_v2``'s two modalities,
    one ``u`` per direction and running-max shift; ``GCLoss_v1``'s estimate (``g`` the
    mean of ``exp(s_ij / T)`` over the ``N - 1`` negatives, the positive outside it);
    the positive is the pair's own (the global diagonal; v2 takes its local block's).

    State per example and direction: ``u`` and the running maximum ``shift`` of the
    logits (``u e^shift`` is the moving average; ``shift = -inf``: never visited).
    Returns ``(value, weights [2, N, N], u, shift)``: the estimate ``log u + shift -
    s_ii`` averaged over rows and directions, the surrogate's negative weights
    ``exp(s_ij - shift_i) / u_i / (N - 1)`` (0 on the diagonal), and the new state
    (reads before writes; an index twice: the last write wins).
    """
    s = np.asarray(a, np.float64) @ np.asarray(b, np.float64).T / temperature
    n = len(s)
    u, shift = u.copy(), shift.copy()
    new_u, new_shift = np.zeros((n, 2)), np.zeros((n, 2))
    weights = np.zeros((2, n, n))
    value = 0.0
    for direction, logits in enumerate((s, s.T)):
        for i in range(n):
            negatives = np.delete(logits[i], i)
            old_u, old_shift = u[index[i], direction], shift[index[i], direction]
            b_new = max(old_shift, negatives.max())
            g = np.mean(np.exp(negatives - b_new))
            if np.isfinite(old_shift):
                u_i = (1 - gamma) * old_u * np.exp(old_shift - b_new) + gamma * g
            else:
                u_i = g
            new_u[i, direction], new_shift[i, direction] = u_i, b_new
            weights[direction, i] = np.exp(logits[i] - b_new) / u_i / (n - 1)
            weights[direction, i, i] = 0.0
            value += np.log(u_i) + b_new - logits[i, i]
    for i in range(n):
        u[index[i]], shift[index[i]] = new_u[i], new_shift[i]
    return value / (2 * n), weights, u, shift


def _sogclr_surrogate(a, b, weights, temperature):
    """``mean_i, directions [sum_j w_ij s_ij - s_ii]`` with the reference's weights."""
    s = a @ b.T / temperature
    rows = jnp.sum(weights[0] * s, axis=1)
    cols = jnp.sum(weights[1] * s.T, axis=1)
    return jnp.mean(0.5 * (rows + cols) - jnp.diag(s))


def _sogclr_steps(loss_fn, batches, table_size, gamma):
    """Runs ``loss_fn`` over the batches, checking each step against the NumPy port."""
    log_u = losses.sogclr_init_state(table_size)
    u, shift = np.zeros((table_size, 2)), np.full((table_size, 2), -np.inf)
    for a, b, index in batches:
        (value, log_u), grads = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(a, b, index, log_u)
        want, weights, u, shift = _sogclr_numpy(a, b, np.asarray(index), u, shift, T, gamma)
        _close(value, want)
        _, want_grads = _float64(lambda a, b, w: _sogclr_surrogate(a, b, w, T), a, b, weights)
        _grads_close(grads, want_grads[:2])
        visited = np.isfinite(shift)
        assert np.array_equal(np.isfinite(np.asarray(log_u)), visited)
        _close(np.asarray(log_u)[visited], np.log(u[visited]) + shift[visited])


def _batches(steps, table_size, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        a, b = _pairs(seed + step)
        index = rng.choice(table_size, N, replace=False)
        if step == 2:
            index[5] = index[11]  # an example twice in one batch: the last write wins
        out.append((a, b, jnp.asarray(index, jnp.int32)))
    return out


def test_sogclr_matches_the_libauc_port_over_steps():
    """Update, value and gradient over four steps that revisit examples (gamma = 0.9)."""
    fn = lambda a, b, i, u: losses.sogclr_loss(a, b, i, u, temperature=T, gamma=0.9)  # noqa: E731
    _sogclr_steps(jax.jit(fn), _batches(4, table_size=24), table_size=24, gamma=0.9)


def test_sogclr_first_visit_is_dcl_minus_log_negatives():
    """gamma = 1 on the first visit: u is this batch's negative mean, so the value is
    DCL's minus log(N - 1) and the gradient is DCL's."""
    a, b = _pairs()
    index = jnp.arange(N)

    def sog(a, b):
        return losses.sogclr_loss(a, b, index, losses.sogclr_init_state(N), temperature=T)[0]

    value, grads = jax.jit(jax.value_and_grad(sog, argnums=(0, 1)))(a, b)
    dcl = jax.value_and_grad(lambda a, b: losses.dcl_loss(a, b, temperature=T), argnums=(0, 1))
    dcl_value, dcl_grads = jax.jit(dcl)(a, b)
    _close(value, dcl_value - np.log(N - 1))
    _grads_close(grads, dcl_grads)


def _sharded_sogclr(mesh, **options):
    fn = functools.partial(losses.sogclr_loss, temperature=T, gamma=0.9, **options)
    return jax.shard_map(
        lambda a, b, i, u: fn(a, b, i, u, axis_name=DATA_AXIS),
        mesh=mesh,
        in_specs=(P(DATA_AXIS), P(DATA_AXIS), P(DATA_AXIS), P()),
        out_specs=(P(), P()),
    )


@pytest.mark.parametrize(
    "num_devices, options",
    [(1, {}), (2, {}), (4, {"chunk_size": 4}), (8, {}), (8, {"chunk_size": 2, "collective": "ring"})],
)
def test_sogclr_sharded_equals_single_device_with_its_state(num_devices, options):
    fn = _sharded_sogclr(sharding.make_mesh(num_devices), **options)
    _sogclr_steps(jax.jit(fn), _batches(3, table_size=24), table_size=24, gamma=0.9)


def test_sogclr_without_index_is_an_error():
    a, b = _pairs()
    with pytest.raises(ValueError, match="sogclr_loss needs index"):
        losses.sogclr_loss(a, b, None, losses.sogclr_init_state(N), temperature=T)


@pytest.mark.parametrize("outside", [-1, 24])
def test_sogclr_rejects_a_concrete_index_outside_the_table(outside):
    """-1 would wrap to the last row and 24 clamp to it: another example's state."""
    a, b = _pairs()
    index = jnp.arange(N).at[5].set(outside)
    with pytest.raises(ValueError, match=rf"^index must lie in \[0, 24\) \(the rows of log_u\), got {outside}: "):
        losses.sogclr_loss(a, b, index, losses.sogclr_init_state(24), temperature=T)


@pytest.mark.parametrize("num_devices", [None, 4])
def test_sogclr_traced_index_outside_the_table_changes_no_other_row(num_devices):
    """Under jit an index outside [0, n) reads as a first visit and is not written: the
    same loss and rows as an in-range index to a never-visited row, which is then left
    as it was."""
    a, b = _pairs()
    log_u = jax.random.normal(jax.random.key(5), (24, 2))  # every row visited
    index = jnp.arange(N).at[3].set(-1).at[7].set(24)
    fn = functools.partial(losses.sogclr_loss, temperature=T)
    if num_devices is not None:
        fn = _sharded_sogclr(sharding.make_mesh(num_devices))
    loss, table = jax.jit(fn)(a, b, index, log_u)
    in_range = index.at[3].set(16).at[7].set(17)
    want_loss, want_table = losses.sogclr_loss(a, b, in_range, log_u.at[16:18].set(-jnp.inf), temperature=T)
    _close(loss, want_loss)
    untouched = np.isin(np.arange(24), np.asarray(index), invert=True)
    np.testing.assert_array_equal(np.asarray(table)[untouched], np.asarray(log_u)[untouched])
    written = np.asarray(index)[(np.asarray(index) >= 0) & (np.asarray(index) < 24)]
    _close(np.asarray(table)[written], np.asarray(want_table)[written])


def test_sogclr_gamma_schedule_under_jit_equals_eager():
    """gamma as an array argument: one compile for the whole schedule, each step equal
    to the eager call with gamma a Python number (gamma = 1 included)."""

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(a, b, index, log_u, gamma):
        return losses.sogclr_loss(a, b, index, log_u, temperature=T, gamma=gamma)

    log_u = want_log_u = losses.sogclr_init_state(24)
    for gamma, (a, b, index) in zip([0.5, 1.0, 0.9], _batches(3, table_size=24)):
        loss, log_u = step(a, b, index, log_u, jnp.float32(gamma))
        want, want_log_u = losses.sogclr_loss(a, b, index, want_log_u, temperature=T, gamma=gamma)
        _close(loss, want)
        np.testing.assert_allclose(np.asarray(log_u), np.asarray(want_log_u), rtol=1e-6)


def test_sogclr_zero_table_reads_as_visited_with_u_one():
    """The table marks "never visited" with -inf; LibAUC's zeros are log u = 0, u = 1:
    the first step averages 1 in, u = (1 - gamma) + gamma g (documented)."""
    a, b = _pairs()
    index = jnp.arange(N)
    _, first = losses.sogclr_loss(a, b, index, losses.sogclr_init_state(N), temperature=T)  # log g
    _, from_zeros = losses.sogclr_loss(a, b, index, jnp.zeros((N, 2)), temperature=T, gamma=0.9)
    _close(from_zeros, np.log(0.1 + 0.9 * np.exp(np.asarray(first, np.float64))))


@pytest.mark.parametrize(
    "gamma, log_u, match",
    [
        (1.5, jnp.zeros((N, 2)), r"^gamma must be in \(0, 1\] \(0.9 in the paper\), got 1.5\.$"),
        (0.9, jnp.zeros((N, 2), jnp.int32), r"^log_u must be the \[n, 2\] float table of sogclr_init_state\(n\), "),
        (0.9, jnp.zeros((N,)), r"^log_u must be the \[n, 2\] float table .* got shape \(16,\) and dtype float32\.$"),
    ],
)
def test_sogclr_rejects_bad_gamma_and_tables(gamma, log_u, match):
    a, b = _pairs()
    with pytest.raises(ValueError, match=match):
        losses.sogclr_loss(a, b, jnp.arange(N), log_u, temperature=T, gamma=gamma)


@pytest.mark.parametrize("name", ["dcl_loss", "sogclr_loss"])
@pytest.mark.parametrize("jit", [False, True])
def test_a_global_batch_of_one_pair_is_an_error(name, jit):
    """DCL at N = 1 would return -1e9 (an empty logsumexp), SogCLR log(0); N is static."""
    a, b = _pairs()
    args = (a[:1], b[:1]) if name == "dcl_loss" else (a[:1], b[:1], jnp.arange(1), losses.sogclr_init_state(4))
    fn = functools.partial(getattr(losses, name), temperature=T)
    with pytest.raises(ValueError, match=rf"^{name} got a global batch of 1 pair, but a contrastive loss needs >= 2 "):
        (jax.jit(fn) if jit else fn)(*args)


# ------------------------------------------------------------------------ MoCo queue


def _moco_numpy(q, k, queue, temperature):
    """``-log softmax([q.k, q.queue] / T)_0`` per query, [B, 1 + K] logits, float64."""
    q, k, queue = (np.asarray(x, np.float64) for x in (q, k, queue))
    logits = np.concatenate([np.sum(q * k, 1, keepdims=True), q @ queue.T], axis=1) / temperature
    top = logits.max(1, keepdims=True)
    log_softmax = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
    return -log_softmax[:, 0].mean()


def _moco_dense(q, k, queue, temperature):
    logits = jnp.concatenate([jnp.sum(q * k, 1, keepdims=True), q @ queue.T], axis=1) / temperature
    return -jnp.mean(jax.nn.log_softmax(logits, axis=1)[:, 0])


@pytest.mark.parametrize(
    "num_devices, options",
    [(None, {}), (None, {"chunk_size": 8}), (4, {"chunk_size": 4}), (8, {"collective": "ring", "chunk_size": 2})],
)
def test_moco_queue_matches_the_direct_softmax(num_devices, options):
    (q, k), queue = _pairs(), _unit(7, K)
    fn = functools.partial(losses.moco_queue_loss, temperature=T, **options)
    if num_devices is not None:
        fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices))
    value, grads = jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2)))(q, k, queue)
    _close(value, _moco_numpy(q, k, queue, T))
    want_value, want_grads = _float64(functools.partial(_moco_dense, temperature=T), q, k, queue)
    _close(value, want_value)
    _grads_close(grads[:2], want_grads[:2])
    assert not np.any(np.asarray(grads[2]))  # the queue is state: no gradient


def test_streamed_queue_holds_one_tile_not_the_batch_by_queue_logits():
    """Compiled temp memory of value and gradient: dense holds [B, K] logits, the
    streamed loss far less."""
    b, k = 64, 8192
    q, queue = _unit(0, b), _unit(1, k)

    def temp_bytes(chunk_size):
        fn = jax.value_and_grad(lambda q: losses.moco_queue_loss(q, q, queue, temperature=T, chunk_size=chunk_size))
        return jax.jit(fn).lower(q).compile().memory_analysis().temp_size_in_bytes

    logits_bytes = b * k * 4
    assert temp_bytes(None) >= logits_bytes
    assert temp_bytes(64) < logits_bytes / 4


def _fifo(keys_per_step, size):
    """The last ``size`` keys, newest overwriting oldest in a ring (NumPy)."""
    queue, pointer = np.zeros((size, D)), 0
    for keys in keys_per_step:
        for row in np.asarray(keys):
            queue[pointer] = row
            pointer = (pointer + 1) % size
    return queue, pointer


@pytest.mark.parametrize("num_devices", [None, 4, 8])
def test_enqueue_keeps_the_last_keys_and_wraps(num_devices):
    steps = [_unit(20 + s, N) for s in range(3)]  # 48 keys into 32 rows: wraps once
    enqueue = functools.partial(losses.enqueue, axis_name=None)
    if num_devices is not None:
        enqueue = jax.shard_map(
            functools.partial(losses.enqueue, axis_name=DATA_AXIS),
            mesh=sharding.make_mesh(num_devices),
            in_specs=(P(DATA_AXIS), P(), P(DATA_AXIS)),
            out_specs=(P(DATA_AXIS), P()),
        )
    queue, pointer = jnp.zeros((K, D)), jnp.int32(0)
    for keys in steps:
        queue, pointer = jax.jit(enqueue)(queue, pointer, keys)
    want_queue, want_pointer = _fifo(steps, K)
    np.testing.assert_array_equal(np.asarray(queue), want_queue.astype(np.float32))
    assert int(pointer) == want_pointer


def test_enqueue_rejects_a_queue_not_a_multiple_of_the_batch():
    with pytest.raises(
        ValueError, match=r"the buffer's rows=40 must be a multiple of the global batch \(16\); use 32 or 48\."
    ):
        losses.enqueue(jnp.zeros((40, D)), jnp.int32(0), _unit(0, N))


@pytest.mark.parametrize(
    "new, match",
    [
        # [B, 1] would broadcast one number over each row's D columns.
        ((jnp.ones((N, 1)), jnp.arange(N)), r"^enqueue's new\[0\] must have shape \(16, 8\) .* got \(16, 1\)\.$"),
        ((_unit(0, N), jnp.arange(N)[:, None]), r"^enqueue's new\[1\] must have shape \(16,\) .* got \(16, 1\)\.$"),
        ((_unit(0, N), jnp.arange(N) + 0.5), r"^enqueue's new\[1\] must be integers \(labels\) .* dtype float32\.$"),
        ((_unit(0, N),), r"^enqueue's new must have the structure of buffers"),
    ],
)
def test_enqueue_rejects_rows_unlike_the_buffers(new, match):
    buffers = (jnp.zeros((K, D)), jnp.full((K,), -1, jnp.int32))
    with pytest.raises(ValueError, match=match):
        losses.enqueue(buffers, jnp.int32(0), new)


@pytest.mark.parametrize("momentum", [1.5, -0.1])
def test_momentum_update_rejects_a_momentum_outside_0_1(momentum):
    with pytest.raises(ValueError, match=rf"^momentum must be in \[0, 1\] .*, got {momentum}\.$"):
        losses.momentum_update({"w": jnp.ones(3)}, {"w": jnp.zeros(3)}, momentum=momentum)


@pytest.mark.parametrize("jit", [False, True])
def test_moco_rejects_a_queue_of_another_width(jit):
    q, k = _pairs()
    fn = functools.partial(losses.moco_queue_loss, temperature=T)
    with pytest.raises(ValueError, match=r"^queue has shape \(32, 12\) but the embeddings have D = 8: "):
        (jax.jit(fn) if jit else fn)(q, k, _unit(7, K, 12))


def _moco_registry_dense(za, zb, queue_a, queue_b, *, stop_gradient):
    """The registry's symmetric "moco_queue" in jnp: each tower's queries against the
    other's keys (detached with `stop_gradient`) and its queue, or the batch's keys
    when there is no queue (None)."""
    keys_a, keys_b = (jax.lax.stop_gradient(za), jax.lax.stop_gradient(zb)) if stop_gradient else (za, zb)

    def one_way(q, k, queue):
        if queue is None:
            return -jnp.mean(jnp.diag(jax.nn.log_softmax(q @ k.T / T, axis=1)))
        return _moco_dense(q, k, queue, T)

    return 0.5 * (one_way(za, keys_b, queue_b) + one_way(zb, keys_a, queue_a))


@pytest.mark.parametrize("queue_size", [0, K])
@pytest.mark.parametrize("stop_gradient", [False, True])
def test_trainer_moco_with_and_without_a_queue(load_config, queue_size, stop_gradient):
    """The registry's "moco_queue" on 4 devices, value and gradients against the dense
    float64 form: K > 0 scores the queue (MoCo v1, v2), K = 0 the batch's keys (MoCo v3);
    `queue_stop_gradient` takes the keys' gradient away. Without either it is CLIP."""
    config = override(
        load_config("default"),
        {"loss.queue_size": queue_size, "loss.queue_stop_gradient": stop_gradient, "model.embed_dim": D},
    )
    settings = loss_settings(config)
    za, zb = _pairs()
    queues = {"queue_a": _unit(5, K), "queue_b": _unit(6, K), "pointer": jnp.int32(0)} if queue_size else {}
    rows, whole = P(BATCH_AXES), P()
    state_specs = {name: rows if name.startswith("queue") else whole for name in queues}

    def loss(za, zb, state):
        outputs = {"za": za, "zb": zb, "temperature": T, "state": state, "step": jnp.int32(0)}
        return registry.get("moco_queue").fn(outputs, settings)[0]

    sharded = jax.shard_map(loss, mesh=sharding.make_mesh(4), in_specs=(rows, rows, state_specs), out_specs=whole)
    value, grads = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1)))(za, zb, queues)
    queue_a, queue_b = (queues["queue_a"], queues["queue_b"]) if queue_size else (None, None)
    dense = functools.partial(_moco_registry_dense, stop_gradient=stop_gradient)
    want_value, want_grads = _float64(lambda za, zb: dense(za, zb, queue_a, queue_b), za, zb)
    _close(value, want_value)
    _grads_close(grads, want_grads)
    if not queue_size and not stop_gradient:
        clip_value, clip_grads = jax.value_and_grad(losses.clip_loss, argnums=(0, 1))(za, zb, temperature=T)
        _close(value, clip_value)
        _grads_close(grads, clip_grads)


# ------------------------------------------------------------------------------- XBM


def _anchors_numpy(z, labels, candidates, loss, temperature=None, margin=None, alpha=2.0, beta=50.0, base=0.5):
    """The base loss of each anchor ``z[i]`` over ``candidates[i]`` (a list of ``(vector,
    label)``), pair by pair in float64, averaged over the anchors (SupCon: those with a
    positive)."""
    z, labels = np.asarray(z, np.float64), np.asarray(labels)
    per_anchor, weights = [], []
    for i, cands in enumerate(candidates):
        s = np.array([z[i] @ c for c, _ in cands])
        same = np.array([y == labels[i] for _, y in cands])
        if loss == "supcon":
            log_denominator = np.log(np.sum(np.exp(s / temperature)))
            per_anchor.append(np.mean(log_denominator - s[same] / temperature) if same.any() else 0.0)
            weights.append(float(same.any()))
        elif loss == "contrastive":
            d = np.sqrt(np.maximum(2 - 2 * s, 0))
            per_anchor.append(np.mean(np.where(same, d**2, np.maximum(margin - d, 0) ** 2)))
            weights.append(1.0)
        else:
            pos = np.log1p(np.sum(np.exp(-alpha * (s[same] - base)))) / alpha
            neg = np.log1p(np.sum(np.exp(beta * (s[~same] - base)))) / beta
            per_anchor.append(pos + neg)
            weights.append(1.0)
    return np.sum(np.array(per_anchor) * weights) / np.sum(weights)


def _xbm_numpy(z, labels, memory, memory_labels, loss, **hyper):
    """Pooled: each anchor against every candidate (the batch but itself, the filled
    memory slots)."""
    z, memory = np.asarray(z, np.float64), np.asarray(memory, np.float64)
    labels, memory_labels = np.asarray(labels), np.asarray(memory_labels)
    filled = [(m, y) for m, y in zip(memory, memory_labels) if y >= 0]
    candidates = [[(z[j], labels[j]) for j in range(len(z)) if j != i] + filled for i in range(len(z))]
    return _anchors_numpy(z, labels, candidates, loss, **hyper)


def _xbm_paper_numpy(z, labels, memory, memory_labels, own_slot, weight, loss, **hyper):
    """The XBM paper's code (research-xbm's trainer): the batch enqueued first, then
    ``criterion(batch, batch) + weight * criterion(batch, memory)``; each anchor's own
    copy (slot ``own_slot[i]``) is no candidate (the paper's criteria drop positives at
    cosine ``>= 1 - 1e-5``, the anchor's own copy)."""
    z, memory = np.asarray(z, np.float64), np.asarray(memory, np.float64)
    labels, memory_labels = np.asarray(labels), np.asarray(memory_labels)
    batch = [[(z[j], labels[j]) for j in range(len(z)) if j != i] for i in range(len(z))]
    remembered = [
        [(m, y) for k, (m, y) in enumerate(zip(memory, memory_labels)) if y >= 0 and k != own_slot[i]]
        for i in range(len(z))
    ]
    return _anchors_numpy(z, labels, batch, loss, **hyper) + weight * _anchors_numpy(
        z, labels, remembered, loss, **hyper
    )


def _label_dense(z, labels, cands, cand_labels, candidate, loss, temperature=None, margin=None):
    """A base loss of the anchors ``z`` over ``cands`` where ``candidate: [B, C]``, dense
    in jnp on ``[B, C]`` similarities (for jax.grad)."""
    s = z @ cands.T
    same = labels[:, None] == cand_labels[None, :]
    pos, neg = same & candidate, ~same & candidate
    if loss == "supcon":
        lse = jax.nn.logsumexp(jnp.where(candidate, s / temperature, -jnp.inf), axis=1)
        count = pos.sum(1)
        per = lse - jnp.where(pos, s / temperature, 0).sum(1) / jnp.maximum(count, 1)
        return jnp.sum(jnp.where(count > 0, per, 0)) / jnp.sum(count > 0)
    if loss == "contrastive":
        d2 = jnp.maximum(2 - 2 * s, 1e-12)
        cost = jnp.where(same, d2, jax.nn.relu(margin - jnp.sqrt(d2)) ** 2)
        return jnp.mean(jnp.sum(jnp.where(candidate, cost, 0), 1) / candidate.sum(1))
    return jnp.mean(
        jnp.log1p(jnp.where(pos, jnp.exp(-2.0 * (s - 0.5)), 0).sum(1)) / 2.0
        + jnp.log1p(jnp.where(neg, jnp.exp(50.0 * (s - 0.5)), 0).sum(1)) / 50.0
    )


def _xbm_dense(z, memory, labels, memory_labels, loss, **hyper):
    """The dense pooled XBM on [B, N + M] similarities (for jax.grad)."""
    cands = jnp.concatenate([z, memory])
    all_labels = jnp.concatenate([labels, memory_labels])
    candidate = (jnp.arange(len(cands))[None, :] != jnp.arange(len(z))[:, None]) & (all_labels >= 0)[None, :]
    return _label_dense(z, labels, cands, all_labels, candidate, loss, **hyper)


def _xbm_paper_dense(z, memory, labels, memory_labels, own_slot, weight, loss, **hyper):
    """The dense two-term XBM (for jax.grad): the batch's loss plus ``weight`` times the
    loss against the memory but each anchor's own slot."""
    batch = _label_dense(z, labels, z, labels, ~jnp.eye(len(z), dtype=bool), loss, **hyper)
    candidate = (jnp.arange(len(memory))[None, :] != own_slot[:, None]) & (memory_labels >= 0)[None, :]
    return batch + weight * _label_dense(z, labels, memory, memory_labels, candidate, loss, **hyper)


def _xbm_inputs():
    z = _unit(3, N)
    labels = jnp.arange(N) % 3
    memory = _unit(4, K)
    memory_labels = jnp.where(jnp.arange(K) % 4 == 1, -1, jnp.arange(K) % 4)
    return z, labels, memory, memory_labels


XBM_HYPER = {
    "supcon": {"temperature": 0.3},
    "contrastive": {"margin": 1.2},
    "multi_similarity": {},
}


@pytest.mark.parametrize(
    "num_devices, options",
    [(None, {}), (None, {"chunk_size": 8}), (4, {}), (8, {"collective": "ring", "chunk_size": 2})],
)
@pytest.mark.parametrize("loss", losses.XBM_LOSSES)
def test_xbm_matches_the_direct_pairs(loss, num_devices, options):
    z, labels, memory, memory_labels = _xbm_inputs()
    fn = functools.partial(losses.xbm_loss, loss=loss, **XBM_HYPER[loss], **options)
    if num_devices is not None:
        fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices))
    value, grad = jax.jit(jax.value_and_grad(fn))(z, labels, memory, memory_labels)
    _close(value, _xbm_numpy(z, labels, memory, memory_labels, loss, **XBM_HYPER[loss]))
    dense = lambda z, memory: _xbm_dense(  # noqa: E731
        z, memory, labels, memory_labels, loss, **XBM_HYPER[loss]
    )
    want_value, want_grads = _float64(dense, z, memory)
    _close(value, want_value)
    _grads_close([grad], want_grads[:1], 1e-4)


@pytest.mark.parametrize(
    "loss, plain",
    [
        ("supcon", lambda z, y: losses.supcon_loss(z, y, temperature=0.3)),
        ("contrastive", lambda z, y: losses.contrastive_loss(z, y, margin=1.2)),
        ("multi_similarity", lambda z, y: losses.multi_similarity_loss(z, y)),
    ],
)
def test_xbm_with_an_empty_memory_is_the_plain_loss(loss, plain):
    """Gradients through the normalisation: XBM's contrastive distances assume unit
    vectors (``2 - 2 cos``), the plain loss's do not, so only the tangent parts agree."""
    z, labels, memory, _ = _xbm_inputs()
    empty = jnp.full((K,), -1)
    unit = _common.l2_normalize
    xbm = jax.value_and_grad(lambda z: losses.xbm_loss(unit(z), labels, memory, empty, loss=loss, **XBM_HYPER[loss]))
    got = jax.jit(xbm)(z)
    want = jax.jit(jax.value_and_grad(lambda z: plain(unit(z), labels)))(z)
    _close(got[0], want[0], 1e-4)
    _grads_close([got[1]], [want[1]], 1e-4)


def test_xbm_rejects_a_loss_that_is_not_label_based():
    z, labels, memory, memory_labels = _xbm_inputs()
    with pytest.raises(ValueError, match="loss must be one of"):
        losses.xbm_loss(z, labels, memory, memory_labels, loss="clip")


@pytest.mark.parametrize("jit", [False, True])
def test_xbm_rejects_a_memory_of_another_width(jit):
    z, labels, _, memory_labels = _xbm_inputs()
    fn = functools.partial(losses.xbm_loss, loss="supcon", temperature=0.3)
    with pytest.raises(ValueError, match=r"^memory has shape \(32, 12\) but the embeddings have D = 8: "):
        (jax.jit(fn) if jit else fn)(z, labels, _unit(4, K, 12), memory_labels)


def test_xbm_contrastive_without_a_margin_is_an_error():
    z, labels, memory, memory_labels = _xbm_inputs()
    with pytest.raises(ValueError, match=r"^xbm_loss with loss='contrastive' needs margin: pass margin > 0"):
        losses.xbm_loss(z, labels, memory, memory_labels, loss="contrastive")


def _enqueued(z, labels, memory, memory_labels, pointer):
    """The memory and labels after ``enqueue`` wrote the batch at ``pointer``, and each
    batch row's slot ``[N]``."""
    slots = (pointer + jnp.arange(len(z))) % len(memory)
    return memory.at[slots].set(z), memory_labels.at[slots].set(labels), slots


@pytest.mark.parametrize(
    "num_devices, options",
    [(None, {}), (None, {"chunk_size": 8}), (4, {}), (8, {"collective": "ring", "chunk_size": 2})],
)
@pytest.mark.parametrize("loss", losses.XBM_LOSSES)
def test_xbm_memory_weight_is_the_papers_two_losses(loss, num_devices, options):
    """``memory_weight=0.5`` with the batch enqueued at row 24 (wrapping past the end):
    the paper's ``loss(batch) + 0.5 loss(batch vs memory)``, each anchor's own copy out
    of its memory candidates; value and gradient, single device, streamed and sharded."""
    z, labels, memory, memory_labels = _xbm_inputs()
    memory, memory_labels, own_slot = _enqueued(z, labels, memory, memory_labels, 24)
    hyper = XBM_HYPER[loss]
    fn = functools.partial(losses.xbm_loss, loss=loss, memory_weight=0.5, enqueued_at=24, **hyper, **options)
    if num_devices is not None:
        fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices))
    value, grad = jax.jit(jax.value_and_grad(fn))(z, labels, memory, memory_labels)
    _close(value, _xbm_paper_numpy(z, labels, memory, memory_labels, np.asarray(own_slot), 0.5, loss, **hyper))
    dense = lambda z, memory: _xbm_paper_dense(  # noqa: E731
        z, memory, labels, memory_labels, own_slot, 0.5, loss, **hyper
    )
    want_value, want_grads = _float64(dense, z, memory)
    _close(value, want_value)
    _grads_close([grad], want_grads[:1], 1e-4)


@pytest.mark.parametrize(
    "options, match",
    [
        ({"memory_weight": -1.0, "enqueued_at": 0}, r"^xbm_loss's memory_weight must be None .* got -1\.0\.$"),
        ({"memory_weight": True, "enqueued_at": 0}, r"^xbm_loss's memory_weight must be None .* got True\.$"),
        ({"memory_weight": 1.0}, r"^xbm_loss with memory_weight needs enqueued_at: .* call enqueue first"),
        ({"enqueued_at": 0}, r"^xbm_loss's enqueued_at is read only with memory_weight"),
    ],
)
def test_xbm_rejects_a_bad_memory_weight(options, match):
    z, labels, memory, memory_labels = _xbm_inputs()
    with pytest.raises(ValueError, match=match):
        losses.xbm_loss(z, labels, memory, memory_labels, loss="supcon", temperature=0.3, **options)


@pytest.mark.parametrize("memory_weight", [None, 0.5])
def test_trainer_xbm_scores_the_memory_before_or_after_enqueue(load_config, memory_weight):
    """The registry's stateful "xbm" on 4 devices: pooled, the loss scores the memory as
    it was (then enqueues); in the paper's form it enqueues first and scores the memory
    holding the batch. The new state is the enqueued one either way."""
    config = override(
        load_config("default"),
        {
            "loss.xbm_loss": "supcon",
            "loss.xbm_memory_weight": memory_weight,
            "loss.xbm_memory_size": K,
            "model.embed_dim": D,
        },
    )
    settings = loss_settings(config)
    z, labels, memory, memory_labels = _xbm_inputs()
    state = {"memory": memory, "labels": memory_labels, "pointer": jnp.int32(24)}
    rows, whole = P(BATCH_AXES), P()

    def step(z, labels, state):
        outputs = {"za": z, "label": labels, "temperature": 0.3, "state": state, "step": jnp.int32(5)}
        return registry.get("xbm").fn(outputs, settings)

    state_specs = {"memory": rows, "labels": rows, "pointer": whole}
    fn = jax.shard_map(
        step,
        mesh=sharding.make_mesh(4),
        in_specs=(rows, rows, state_specs),
        out_specs=(whole, {}, state_specs),
    )
    loss, _, new_state = jax.jit(fn)(z, labels, state)
    enqueued, enqueued_labels, own_slot = _enqueued(z, labels, memory, memory_labels, 24)
    if memory_weight is None:
        want = _xbm_numpy(z, labels, memory, memory_labels, "supcon", temperature=0.3)
    else:
        want = _xbm_paper_numpy(
            z, labels, enqueued, enqueued_labels, np.asarray(own_slot), memory_weight, "supcon", temperature=0.3
        )
    _close(loss, want)
    np.testing.assert_array_equal(np.asarray(new_state["memory"]), np.asarray(enqueued))
    np.testing.assert_array_equal(np.asarray(new_state["labels"]), np.asarray(enqueued_labels))
    assert int(new_state["pointer"]) == (24 + N) % K


def test_trainer_rejects_a_negative_xbm_memory_weight(load_config):
    config = override(load_config("default"), {"loss.name": "xbm", "loss.xbm_memory_weight": -1.0})
    with pytest.raises(ConfigError, match=r"^config.loss.xbm_memory_weight=-1.0 must be None .* or >= 0 "):
        registry.get("xbm").state.check(loss_settings(config), config.train.global_batch_size, 0)
