"""Several positives (`positive_ids`): `clip_loss` and `infonce_loss` in both softmax forms
and `siglip_loss` labelling every positive +1, against float64 dense references written
from the papers' formulas (the positive sets built pair by pair in NumPy, the losses on
the whole [N, N] logits), value and gradient (a, b and the temperature; SigLIP's bias),
on one device dense and tiled and on 8 devices all-gathered, tiled and around the ring.

The rows are shuffled, so each device holds pairs whose positives live on other devices:
a gather that pairs a row with another row's ids, or a device that compares local ids
only, gives another loss. Some pairs have no id at all (all -1): their only positive is
the diagonal. The calling conventions (check_vma on and off, pmap, a 2 x 4 mesh) run on
`loss_cases`' positive cases in test_losses_sharded.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loss_cases import MODES, enable_x64, with_positive_ids

from contrastive_jax import losses, sharding

N, D = 32, 8
TEMPERATURE = 0.1
BIAS = -3.0


def _ids():
    """``[N, 2]``: 14 images with 1-5 captions each (column 0; -1 for 4 pairs without an
    image id), a class id on every third row (column 1, -1 elsewhere) drawn from the
    image ids' range, so an id is shared across the columns too; rows shuffled."""
    rng = np.random.default_rng(0)
    images = np.repeat(np.arange(14), [5, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1])
    images = np.concatenate([images, [-1, -1, -1, -1]])
    classes = np.where(np.arange(N) % 3 == 0, rng.integers(0, 6, N), -1)
    return np.stack([images, classes], axis=1)[rng.permutation(N)]


IDS = _ids()


def positive_mask(ids):
    """``[N, N]`` bool: pair i is a positive of pair j when i == j or their sets of
    non-negative ids meet."""
    sets = [set(row[row >= 0].tolist()) for row in np.asarray(ids).reshape(len(ids), -1)]
    return np.array([[i == j or bool(sets[i] & sets[j]) for j in range(len(sets))] for i in range(len(sets))])


def _one_direction(queries, keys, positives, form, temperature):
    """Row i's softmax over all N keys; SupCon's L_out (Khosla et al. 2020, eq. 2) or
    MIL-NCE's -log of the positives' summed probability (Miech et al. 2020)."""
    log_prob = jax.nn.log_softmax(queries @ keys.T / temperature, axis=1)
    if form == "mean_log_prob":
        per_row = -jnp.sum(jnp.where(positives, log_prob, 0.0), axis=1) / jnp.sum(positives, axis=1)
    else:
        per_row = -jax.nn.logsumexp(log_prob, axis=1, where=positives)
    return jnp.mean(per_row)


def clip_reference(a, b, positives, form, temperature):
    return 0.5 * (
        _one_direction(a, b, positives, form, temperature) + _one_direction(b, a, positives.T, form, temperature)
    )


def infonce_reference(a, b, positives, form, temperature):
    return _one_direction(a, b, positives, form, temperature)


def siglip_reference(a, b, positives, temperature, bias):
    """-1/N sum_ij log sigmoid(z_ij (a_i . b_j / T + bias)), z_ij = +1 on positives."""
    labels = jnp.where(positives, 1.0, -1.0)
    return -jnp.sum(jax.nn.log_sigmoid(labels * (a @ b.T / temperature + bias))) / len(a)


# name -> (kernel with ids positional, hyperparameters, float64 reference of (a, b, mask, *params))
CASES = {
    f"{name}-{form}": (
        with_positive_ids(kernel, positives=form),
        {},
        lambda a, b, p, t, reference=reference, form=form: reference(a, b, p, form, t),
    )
    for name, kernel, reference in (
        ("clip", losses.clip_loss, clip_reference),
        ("infonce", losses.infonce_loss, infonce_reference),
    )
    for form in ("mean_log_prob", "log_sum")
}
CASES["siglip"] = (with_positive_ids(losses.siglip_loss), {"bias": BIAS}, siglip_reference)


def embeddings(seed):
    return losses.l2_normalize(jax.random.normal(jax.random.key(seed), (N, D)))


def kernel_value_and_grads(case, num_devices, options, ids=IDS):
    """The kernel's value and gradients w.r.t. (a, b, temperature[, bias]) in float32."""
    kernel, extra, _ = CASES[case]
    if num_devices is not None:
        kernel = sharding.shard_loss(kernel, sharding.make_mesh(num_devices))
    params = (jnp.float32(TEMPERATURE), *(jnp.float32(v) for v in extra.values()))

    def loss(a, b, params):
        return kernel(a, b, jnp.asarray(ids), temperature=params[0], **dict(zip(extra, params[1:])), **options)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(embeddings(0), embeddings(1), params)


def reference_value_and_grads(case, ids=IDS):
    _, extra, reference = CASES[case]
    a, b = (np.asarray(embeddings(seed), np.float64) for seed in (0, 1))  # the kernel's, widened
    with enable_x64():
        params = (np.float64(TEMPERATURE), *(np.float64(v) for v in extra.values()))
        mask = jnp.asarray(positive_mask(ids))
        value, grads = jax.value_and_grad(lambda a, b, p: reference(a, b, mask, *p), argnums=(0, 1, 2))(a, b, params)
        return float(value), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES)
def test_equals_the_float64_reference(case, mode):
    value, grads = kernel_value_and_grads(case, *MODES[mode])
    want_value, want_grads = reference_value_and_grads(case)
    assert float(value) == pytest.approx(want_value, rel=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(np.max(np.abs(want)), 1.0))


def test_the_ids_make_positives_across_devices_and_columns():
    """The test's ids exercise what the kernel must get right: positives on other
    devices (8 devices of 4 rows), an id shared between the two columns, pairs with no
    id, and groups of up to 5."""
    mask = positive_mask(IDS)
    device = np.arange(N) // 4
    assert np.any(mask & (device[:, None] != device[None, :]))
    first, second = set(IDS[:, 0][IDS[:, 0] >= 0]), set(IDS[:, 1][IDS[:, 1] >= 0])
    assert first & second
    assert np.any(np.all(IDS < 0, axis=1))
    assert mask.sum(axis=1).max() >= 5
    assert not np.array_equal(positive_mask(IDS[:, :1]), mask)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("mode", ["dense", "8-ring"])
def test_distinct_ids_give_the_plain_loss(case, mode):
    """All ids distinct, one id per row (``[B]``) or with padding: the plain loss."""
    kernel, extra, _ = CASES[case]
    plain_kernel = {"clip": losses.clip_loss, "infonce": losses.infonce_loss, "siglip": losses.siglip_loss}
    plain = plain_kernel[case.split("-")[0]](embeddings(0), embeddings(1), temperature=TEMPERATURE, **extra)
    for ids in (np.arange(N), np.stack([np.arange(N), np.full(N, -1)], axis=1)):
        value, _ = kernel_value_and_grads(case, *MODES[mode], ids=ids)
        assert float(value) == pytest.approx(float(plain), rel=1e-5)


@pytest.mark.parametrize("case", ["clip-log_sum", "siglip"])
def test_one_id_per_row(case):
    """``[B]`` ids are one id per pair."""
    ids = IDS[:, 0]
    value, _ = kernel_value_and_grads(case, None, {"chunk_size": 8}, ids=ids)
    assert float(value) == pytest.approx(reference_value_and_grads(case, ids=ids)[0], rel=1e-5)


def test_the_two_forms_differ_and_log_sum_is_supcons_l_in_less_log_p():
    """With several positives the forms differ: -log of the mean positive probability
    (SupCon's L_in) is the log-sum form plus log |P(i)|, and by Jensen at most L_out."""
    a, b = embeddings(0), embeddings(1)
    mask = positive_mask(IDS)
    kw = {"temperature": TEMPERATURE, "positive_ids": jnp.asarray(IDS)}
    log_sum = losses.infonce_loss(a, b, positives="log_sum", **kw)
    mean = losses.infonce_loss(a, b, positives="mean_log_prob", **kw)
    l_in = float(log_sum) + float(np.mean(np.log(mask.sum(axis=1))))
    assert l_in < float(mean)
    assert float(log_sum) < l_in


def test_bad_arguments_are_rejected():
    a = embeddings(0)[:4]
    with pytest.raises(ValueError, match=r"positive_ids must be ints of shape \[B\] or \[B, K\] with B = 4"):
        losses.clip_loss(a, a, temperature=0.1, positive_ids=jnp.arange(5))
    with pytest.raises(ValueError, match="positive_ids must be ints"):
        losses.siglip_loss(a, a, temperature=0.1, bias=0.0, positive_ids=jnp.ones(4))
    with pytest.raises(ValueError, match="positives must be one of"):
        losses.infonce_loss(a, a, temperature=0.1, positive_ids=jnp.arange(4), positives="mean")
    with pytest.raises(ValueError, match="pass positive_ids or false_negative_ids, not both"):
        losses.clip_loss(a, a, temperature=0.1, positive_ids=jnp.arange(4), false_negative_ids=jnp.arange(4))


@pytest.mark.parametrize("case", ["clip-mean_log_prob", "clip-log_sum", "infonce-log_sum", "siglip"])
def test_streamed_memory_stays_linear(case):
    """Compiled temp memory of the value and gradient: tiles of 64 keep it far below the
    dense [N, N] logits, and doubling N about doubles it (the ids are no [N, N] mask)."""
    kernel, extra, _ = CASES[case]

    def temp(n, chunk_size):
        rows = jnp.arange(n)
        ids = jnp.stack([rows // 5, jnp.where(rows % 3 == 0, rows % 7, -1)], axis=1)
        shape = jax.ShapeDtypeStruct((n, 16), jnp.float32)
        loss = lambda a, b: kernel(a, b, ids, temperature=0.1, **extra, chunk_size=chunk_size)  # noqa: E731
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(shape, shape).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp(2048, 64) * 20 < temp(2048, None)
    assert temp(4096, 64) < 2.2 * temp(2048, 64)
