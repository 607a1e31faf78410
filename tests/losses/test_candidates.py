"""Whom each row is compared with (`losses.Candidates`), every field with every other:
`clip_loss`, `infonce_loss` and `siglip_loss` against one float64 reference written from
the definitions on the global arrays (module `losses.candidates`), value and gradient (a,
b, the extra and shared columns, the temperature; SigLIP's bias), on one device dense and
on 8 devices tiled, all-gathered and around the ring.

The reference builds each query row's candidate columns and positives by hand: the N b's,
each pair's M hard negatives (in its pair's group), the bank's E columns (in every
group), groups of K consecutive rows, pairs sharing a false-negative key left out, pairs
sharing a positive id counted in the form asked; CLIP's columns against every a. A mask
applied in one mode only, a hard negative in the wrong group, a positive id not carried
with its column, or a query row's count taken from the wrong rows gives another loss.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loss_cases import MODES, assert_matches, enable_x64

from contrastive_jax import losses, sharding

N, D, M, E = 32, 8, 2, 16
TEMPERATURE, BIAS = 0.1, -3.0
KERNELS = {"clip": losses.clip_loss, "infonce": losses.infonce_loss, "siglip": losses.siglip_loss}


def arrays(seed=0):
    """``(a, b, hard [N, M, D], bank [E, D], ids [N, 2], keys [N, 2])``: unit rows, b near
    a, the hard negatives near their own a; positive id sets meeting in twos and threes
    (-1 padding), false-negative keys shared by some pairs."""
    k_a, k_b, k_h, k_e = jax.random.split(jax.random.key(seed), 4)
    a = losses.l2_normalize(jax.random.normal(k_a, (N, D)))
    b = losses.l2_normalize(a + 0.8 * jax.random.normal(k_b, (N, D)))
    hard = losses.l2_normalize(a[:, None, :] + 0.5 * jax.random.normal(k_h, (N, M, D)))
    bank = losses.l2_normalize(jax.random.normal(k_e, (E, D)))
    rows = np.arange(N)
    ids = np.stack([rows // 2, np.where(rows % 5 == 0, 100 + rows // 10, -1)], axis=1).astype(np.int32)
    keys = np.stack([rows // 3, rows % 7 + 50], axis=1).astype(np.int32)
    return a, b, hard, bank, jnp.asarray(ids), jnp.asarray(keys)


def reference(name, fields, query, a, b, hard, bank, ids, keys, temperature, bias):
    """The loss of ``name`` with the candidates ``fields`` names, over the query rows
    (``query`` [N] bool), from the definitions, on the global arrays."""
    n = len(a)
    cols = [b]
    owner = list(range(n))  # a column's group row; -1: every group
    if "extra_columns" in fields:
        cols.append(hard.reshape(-1, a.shape[1]))
        owner += list(np.repeat(np.arange(n), hard.shape[1]))
    if "shared_columns" in fields:
        cols.append(bank)
        owner += [-1] * len(bank)
    y, owner = jnp.concatenate(cols), np.array(owner)
    num_cols = len(y)
    is_pair = np.arange(num_cols) < n
    k = fields.get("group_size", 0)
    in_group = np.ones((n, num_cols), bool)
    if k:
        in_group = (np.arange(n)[:, None] // k == owner[None, :] // k) | (owner[None, :] < 0)
    positive = np.zeros((n, num_cols), bool)
    positive[np.arange(n), np.arange(n)] = True
    if "positive_ids" in fields:
        ids = np.asarray(ids)
        meet = (ids[:, None, :, None] == ids[None, :, None, :]) & (ids[:, None, :, None] >= 0)
        positive[:, :n] |= meet.any(axis=(2, 3))
    positive &= in_group
    left_out = np.zeros((n, num_cols), bool)
    if "false_negative_ids" in fields:
        keys = np.asarray(keys)
        left_out[:, :n] = (keys[:, None, :] == keys[None, :, :]).any(-1) & ~np.eye(n, dtype=bool)
    candidate = in_group & ~left_out
    logits = a @ y.T / temperature
    if name == "siglip":
        terms = jax.nn.log_sigmoid(jnp.where(positive, 1.0, -1.0) * (logits + bias))
        return -jnp.sum(jnp.where(candidate, terms, 0.0)) / n
    form = fields.get("positives", "mean_log_prob") if "positive_ids" in fields else None

    def softmax_loss(s, cand, pos):  # [n, c]: each row's loss
        lse = jax.nn.logsumexp(jnp.where(cand, s, -jnp.inf), axis=1)
        if form == "log_sum":
            return lse - jax.nn.logsumexp(jnp.where(pos, s, -jnp.inf), axis=1)
        return lse - jnp.sum(jnp.where(pos, s, 0.0), axis=1) / pos.sum(1)

    rows = softmax_loss(logits, candidate, positive)
    if name == "clip":  # b_j against every a (no extra column is a row of this softmax)
        columns = softmax_loss(logits[:, :n].T, candidate[:, :n].T, positive[:, :n].T)
        rows = 0.5 * (rows + columns)
    del is_pair
    return jnp.sum(jnp.where(query, rows, 0.0)) / query.sum()


def candidates_of(fields, hard, bank, ids, keys, query_rows):
    values = {"extra_columns": hard, "shared_columns": bank, "positive_ids": ids, "false_negative_ids": keys}
    chosen = {k: v for k, v in values.items() if k in fields}
    static = {k: fields[k] for k in ("group_size", "positives") if k in fields}
    return losses.Candidates(**chosen, **static, query_rows=query_rows)


def kernel_value_and_grads(name, fields, mode):
    num_devices, options = MODES[mode]
    streaming = losses.Streaming(**options)
    a, b, hard, bank, ids, keys = arrays()
    local = N // (num_devices or 1)
    query_rows = local // 2 if "query_rows" in fields else None
    kernel = KERNELS[name]
    if num_devices is not None:
        kernel = sharding.shard_loss(kernel, sharding.make_mesh(num_devices))
    extra = {"bias": jnp.float32(BIAS)} if name == "siglip" else {}

    def loss(a, b, hard, bank, temperature):
        candidates = candidates_of(fields, hard, bank, ids, keys, query_rows)
        return kernel(a, b, temperature=temperature, candidates=candidates, streaming=streaming, **extra)

    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))(a, b, hard, bank, jnp.float32(TEMPERATURE))
    query = np.arange(N) % local < (local if query_rows is None else query_rows)
    return got, query


def reference_value_and_grads(name, fields, query):
    a, b, hard, bank, ids, keys = arrays()
    widened = [np.asarray(x, np.float64) for x in (a, b, hard, bank)]
    with enable_x64():

        def loss(a, b, hard, bank, temperature):
            return reference(name, fields, query, a, b, hard, bank, ids, keys, temperature, BIAS)

        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4))(*widened, np.float64(TEMPERATURE))
        return float(value), jax.tree.map(np.asarray, grads)


# Each field with the others (groups and query rows, positive and false-negative ids exclude each other).
COMBINATIONS = {
    "hard+groups": {"extra_columns": 1, "group_size": 8},
    "hard+positives": {"extra_columns": 1, "positive_ids": 1},
    "hard+positives_log_sum+groups": {"extra_columns": 1, "positive_ids": 1, "positives": "log_sum", "group_size": 8},
    "hard+false_negatives": {"extra_columns": 1, "false_negative_ids": 1},
    "hard+query_rows": {"extra_columns": 1, "query_rows": 1},
    "positives+groups": {"positive_ids": 1, "group_size": 16},
    "positives+query_rows": {"positive_ids": 1, "query_rows": 1},
    "false_negatives+groups": {"false_negative_ids": 1, "group_size": 8},
    "bank+groups": {"shared_columns": 1, "group_size": 8},
    "bank+hard+positives+query_rows": {
        "shared_columns": 1,
        "extra_columns": 1,
        "positive_ids": 1,
        "positives": "log_sum",
        "query_rows": 1,
    },
}
SIGLIP_TAKES = ("hard+groups", "hard+positives", "positives+groups", "bank+groups")
CASES = [(name, combo) for combo in COMBINATIONS for name in ("clip", "infonce")] + [
    ("siglip", combo) for combo in SIGLIP_TAKES
]


@pytest.mark.parametrize("mode", ["dense", "8-ring-tiled", "8-all_gather-tiled"])
@pytest.mark.parametrize(("name", "combination"), CASES)
def test_every_combination_equals_the_float64_reference(name, combination, mode):
    fields = COMBINATIONS[combination]
    got, query = kernel_value_and_grads(name, fields, mode)
    assert_matches(got, reference_value_and_grads(name, fields, query))


@pytest.mark.parametrize("name", KERNELS)
def test_no_candidates_is_the_plain_loss_bit_for_bit(name):
    """`Candidates()` and None give the plain loss, value and gradients, bit for bit."""
    a, b, *_ = arrays()
    extra = {"bias": BIAS} if name == "siglip" else {}
    results = [
        jax.jit(jax.value_and_grad(lambda a, c=c: KERNELS[name](a, b, temperature=0.1, candidates=c, **extra)))(a)
        for c in (None, losses.Candidates())
    ]
    for got, want in zip(*(jax.tree.leaves(r) for r in results), strict=True):
        np.testing.assert_array_equal(got, want)


def test_the_old_keywords_warn_and_give_the_same_loss():
    """`hard_negatives=`, `group_size=`, `chunk_size=` (the last release's) warn once and
    equal `candidates=` and `streaming=`; both at once is a TypeError."""
    a, b, hard, *_ = arrays()
    new = losses.clip_loss(
        a,
        b,
        temperature=0.1,
        candidates=losses.Candidates(extra_columns=hard, group_size=8),
        streaming=losses.Streaming(chunk_size=8),
    )
    with pytest.warns(DeprecationWarning, match=r"clip_loss\(chunk_size=, group_size=, hard_negatives=\)"):
        old = losses.clip_loss(a, b, temperature=0.1, hard_negatives=hard, group_size=8, chunk_size=8)
    assert float(old) == float(new)
    with pytest.raises(TypeError, match="not both"):
        losses.clip_loss(a, b, temperature=0.1, candidates=losses.Candidates(), group_size=8)
    with pytest.raises(TypeError, match="unexpected keyword"):
        losses.clip_loss(a, b, temperature=0.1, groups=8)


@pytest.mark.parametrize(
    ("name", "candidates", "message"),
    [
        ("clip", {"extra_columns": jnp.zeros((N, D))}, r"extra_columns must have shape \[B, M, D\] = \[32, M, 8\]"),
        ("clip", {"shared_columns": jnp.zeros((4, D + 1))}, r"shared_columns must have shape \[E, D\]"),
        ("clip", {"group_size": 8, "query_rows": 4}, "groups fix the negatives, query rows add to them"),
        ("clip", {"group_size": 5}, "must divide the global batch N = 32"),
        ("clip", {"positive_ids": jnp.arange(N), "false_negative_ids": jnp.arange(N)}, "not both"),
        ("infonce", {"positives": "mean"}, "positives must be one of"),
        ("siglip", {"query_rows": 4}, "no query_rows"),
    ],
)
def test_a_bad_candidate_set_is_one_line(name, candidates, message):
    a, b, *_ = arrays()
    extra = {"bias": BIAS} if name == "siglip" else {}
    with pytest.raises(ValueError, match=message):
        KERNELS[name](a, b, temperature=0.1, candidates=losses.Candidates(**candidates), **extra)


def test_clip_has_at_most_eight_parameters():
    import inspect

    assert len(inspect.signature(losses.clip_loss).parameters) <= 8
