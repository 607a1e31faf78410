"""Loss kernels on one device: golden values, gradients, invariances, numerics, errors."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from loss_cases import enable_x64, loss_examples

from contrastive_jax import losses

E = jnp.eye(2)
LOG_1P_E_INV = math.log1p(math.exp(-1.0))  # log(1 + 1/e)
EXAMPLES = loss_examples(16, 8)


def value_and_grad(fn, x):
    """`fn(x)` and its gradient, compiled as one program (eager, each operation of the
    loss would compile on its own)."""
    return jax.jit(jax.value_and_grad(fn))(x)


def unit(key, shape):
    x = jax.random.normal(jax.random.key(key), shape)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


# ------------------------------------------------------------------ golden values


@pytest.mark.parametrize(
    "value, expected",
    [
        (lambda: losses.softmax_cross_entropy(jnp.zeros((1, 2)), jnp.array([0])), [math.log(2)]),
        (
            lambda: losses.softmax_cross_entropy(jnp.log(jnp.array([[1.0, 3.0]])), jnp.array([1])),
            [math.log(4 / 3)],
        ),
        (
            lambda: losses.softmax_cross_entropy(jnp.array([[5.0, 0, 0, 0]]), jnp.array([0]), label_smoothing=0.4),
            # target (0.7, 0.1, 0.1, 0.1); log Z = log(e^5 + 3)
            [math.log(math.exp(5) + 3) - 0.7 * 5],
        ),
        (lambda: losses.binary_cross_entropy(jnp.zeros(3), jnp.array([0.0, 1.0, 0.5])), [math.log(2)] * 3),
        (lambda: losses.focal_loss(jnp.zeros((1, 2)), jnp.array([1])), [0.25 * math.log(2)]),
        (
            lambda: losses.focal_loss(jnp.zeros((1, 2)), jnp.array([1]), alpha=jnp.array([1.0, 0.5])),
            [0.125 * math.log(2)],
        ),
        (lambda: losses.infonce_loss(E, E, temperature=1.0), LOG_1P_E_INV),
        (lambda: losses.clip_loss(E, E, temperature=1.0), LOG_1P_E_INV),
        # row i: -log sigmoid(1) for the positive, -log sigmoid(0) = log 2 for the negative
        (lambda: losses.siglip_loss(E, E, temperature=1.0, bias=0.0), LOG_1P_E_INV + math.log(2)),
        # anchor logits: self masked, positive 1, two negatives 0 -> log(e + 2) - 1
        (lambda: losses.ntxent_loss(E, E, temperature=1.0), math.log(math.e + 2) - 1),
        (lambda: losses.npairs_loss(2 * E, E), math.log1p(math.exp(-2.0))),
        (
            lambda: losses.supcon_loss(jnp.array([E[0], E[0], E[1], E[1]]), jnp.array([0, 0, 1, 1]), temperature=1.0),
            math.log(math.e + 2) - 1,
        ),
        (
            lambda: losses.contrastive_loss(jnp.array([[0.0, 0], [1, 0]]), jnp.array([0, 0]), margin=2.0),
            1.0,
        ),
        (
            lambda: losses.contrastive_loss(jnp.array([[0.0, 0], [1, 0]]), jnp.array([0, 1]), margin=2.0),
            1.0,
        ),
        (
            lambda: losses.contrastive_loss(jnp.array([[0.0, 0], [1, 0]]), jnp.array([0, 1]), margin=0.5),
            0.0,
        ),
        # a=0, p=1, n=2 on a line, margin 4: anchor a: 1 - 4 + 4 = 1; anchor p: 1 - 1 + 4 = 4
        (
            lambda: losses.triplet_loss(jnp.array([[0.0], [1.0], [2.0]]), jnp.array([0, 0, 1]), margin=4.0),
            2.5,
        ),
        (
            lambda: losses.triplet_loss(
                jnp.array([[0.0], [1.0], [2.0]]), jnp.array([0, 0, 1]), margin=4.0, mining="batch_hard"
            ),
            2.5,
        ),
        # semi-hard, unsquared: anchor a: p at 1, negatives farther than 1: n at 2 -> 1 - 2 + 4;
        # anchor p: p at 1, n at 1 is not farther -> farthest negative (1) -> 1 - 1 + 4
        (
            lambda: losses.triplet_loss(
                jnp.array([[0.0], [1.0], [2.0]]), jnp.array([0, 0, 1]), margin=4.0, mining="semi_hard", squared=False
            ),
            3.5,
        ),
        (
            lambda: losses.multi_similarity_loss(jnp.array([E[0], E[0], E[1]]), jnp.array([0, 0, 1])),
            (
                2 * (0.5 * math.log1p(math.exp(-1.0)) + math.log1p(math.exp(-25.0)) / 50)
                + math.log1p(2 * math.exp(-25.0)) / 50
            )
            / 3,
        ),
        (lambda: losses.proxy_nca_loss(E[:1], jnp.array([0]), E, temperature=1.0), [math.log1p(math.exp(-2.0))]),
        (lambda: losses.cosface_loss(E[:1], jnp.array([0]), E, scale=1.0, margin=0.5), [math.log1p(math.exp(-0.5))]),
        (
            lambda: losses.arcface_loss(E[:1], jnp.array([0]), E, scale=2.0, margin=0.5),
            [math.log1p(math.exp(-2 * math.cos(0.5)))],
        ),
    ],
)
def test_golden_value(value, expected):
    np.testing.assert_allclose(jax.jit(value)(), expected, rtol=1e-5, atol=1e-7)


def test_batch_prototype_cross_entropy_matches_its_pairwise_expansion():
    """Same-class pull plus log-sum-exp over classes, computed pair by pair in float64."""
    z = jax.random.normal(jax.random.key(0), (12, 5))
    labels = jnp.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 0, 1, 2])
    temperature, n, num_classes = 0.7, 12, 3
    gram = np.asarray(z @ z.T, np.float64)
    y = np.asarray(labels)
    pull = -sum(gram[i, j] for i in range(n) for j in range(n) if y[i] == y[j]) / (temperature * n**2)
    log_sum_exp = (
        sum(
            math.log(
                sum(
                    math.exp(sum(gram[i, j] for j in range(n) if y[j] == k) / (temperature * n))
                    for k in range(num_classes)
                )
            )
            for i in range(n)
        )
        / n
    )
    got = losses.batch_prototype_cross_entropy_loss(z, labels, num_classes=num_classes, temperature=temperature)
    np.testing.assert_allclose(got, pull + log_sum_exp, rtol=1e-5)


def test_infonce_loss_floor_value():
    assert losses.infonce_loss_floor(256) == pytest.approx(math.log1p(255 * math.exp(-2)))
    assert losses.infonce_loss_floor(256, temperature=0.05) < 1e-10


# ---------------------------------------------------------------------- gradients


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_softmax_cross_entropy_gradient_is_softmax_minus_target(smoothing):
    logits = jax.random.normal(jax.random.key(1), (6, 5))
    labels = jnp.array([0, 4, 2, 2, 1, 3])
    target = (1 - smoothing) * jax.nn.one_hot(labels, 5) + smoothing / 5
    grad = jax.grad(lambda x: losses.softmax_cross_entropy(x, labels, label_smoothing=smoothing).sum())(logits)
    np.testing.assert_allclose(grad, jax.nn.softmax(logits) - target, atol=1e-6)


def test_binary_cross_entropy_is_exact_at_large_logits_and_its_gradient_is_sigmoid_minus_label():
    logits = jnp.array([-100.0, -3.0, 0.0, 2.0, 100.0, 100.0])
    labels = jnp.array([1.0, 0.0, 0.25, 1.0, 0.0, 1.0])
    value, grad = jax.value_and_grad(lambda x: losses.binary_cross_entropy(x, labels).sum())(logits)
    expected = [100.0, math.log1p(math.exp(-3.0)), math.log(2.0), math.log1p(math.exp(-2.0)), 100.0, 0.0]
    np.testing.assert_allclose(losses.binary_cross_entropy(logits, labels), expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, jax.nn.sigmoid(logits) - labels, atol=1e-6)


def test_triplet_gradients_are_the_analytic_ones():
    """With one active triplet: d/da = 2(n - p), d/dp = 2(p - a), d/dn = 2(a - n)."""
    a, p, n = jnp.array([0.0, 0.3]), jnp.array([1.0, 0.2]), jnp.array([-0.5, 0.1])
    z = jnp.stack([a, p, n])
    labels = jnp.array([0, 0, 1])
    # (p, a, n) is inactive: |p-a|^2 - |p-n|^2 + 1 < 0, so only (a, p, n) counts.
    assert float(jnp.sum((p - a) ** 2) - jnp.sum((p - n) ** 2) + 1.0) < 0
    grad = jax.grad(lambda z: losses.triplet_loss(z, labels, margin=1.0))(z)
    np.testing.assert_allclose(grad, jnp.stack([2 * (n - p), 2 * (p - a), 2 * (a - n)]), atol=1e-6)


# DCLW's positive weight carries no gradient (as in the paper): its gradient is not the
# derivative of its value (test_beyond_batch.py checks it against jax.grad of the formula).
@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - {"dclw"}))
def test_check_grads_against_finite_differences(name):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]
    with enable_x64():
        arrays64 = [x.astype(jnp.float64) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in arrays]
        check_grads(
            jax.jit(lambda x: loss_fn(x, *arrays64[1:], **hyperparameters)),
            (arrays64[0],),
            order=1,
            modes=("rev",),
            eps=1e-6,
        )


def test_proxy_losses_check_grads():
    z = unit(2, (6, 4))
    labels = jnp.array([0, 1, 2, 0, 1, 2])
    weights = jax.random.normal(jax.random.key(3), (3, 4))
    with enable_x64():
        z, weights = z.astype(jnp.float64), weights.astype(jnp.float64)
        for fn, kw in [
            (losses.proxy_nca_loss, {"temperature": 0.2}),
            (losses.cosface_loss, {"scale": 8.0, "margin": 0.35}),
            (losses.arcface_loss, {"scale": 8.0, "margin": 0.5}),
        ]:
            loss = jax.jit(lambda z, w: fn(z, labels, w, **kw).mean())  # noqa: B023  (called in this iteration)
            check_grads(loss, (z, weights), order=1, modes=("rev",), eps=1e-6)


# ------------------------------------------------------------------- focal loss

FOCAL_GAMMAS = [0.0, 0.5, 1.0, 2.0]
MARGINS = [0.0, 5.0, 17.0, 20.0, 50.0, 100.0]


def confident_and_wrong_rows(margin):
    """``[4, 3]`` logits and labels: two rows right by ``margin``, two wrong by it."""
    logits = jnp.array([[margin, 0.0, 0.0], [0.0, margin, -1.0], [margin, 0.0, 0.0], [0.0, 0.0, margin]])
    return logits, jnp.array([0, 1, 1, 0])


def focal_reference(logits, labels, gamma):
    """The textbook ``-(1 - p_y)^gamma log p_y``, with ``1 - p_y = -expm1(log p_y)``."""
    log_p_true = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)[:, 0]
    return -((-jnp.expm1(log_p_true)) ** gamma) * log_p_true


@pytest.mark.parametrize("gamma", FOCAL_GAMMAS)
def test_focal_loss_gradient_is_finite_on_confident_rows(gamma):
    """Issue 13: one row with p_y rounding to 1 made the whole gradient NaN (gamma < 1)."""
    lg, y = jnp.array([[20.0, 0.0, 0.0]]), jnp.array([0])
    assert np.all(np.isfinite(value_and_grad(lambda x: losses.focal_loss(x, y, gamma=gamma).sum(), lg)[1]))
    for margin in MARGINS:
        logits, labels = confident_and_wrong_rows(margin)
        value, grad = value_and_grad(lambda x: losses.focal_loss(x, labels, gamma=gamma).sum(), logits)  # noqa: B023
        assert np.isfinite(value) and np.all(np.isfinite(grad)), margin


@pytest.mark.parametrize("margin", MARGINS)
def test_focal_loss_with_gamma_0_is_softmax_cross_entropy(margin):
    random_logits = 3.0 * jax.random.normal(jax.random.key(20), (6, 5))
    random_labels = jnp.array([0, 4, 2, 2, 1, 3])
    for logits, labels in [confident_and_wrong_rows(margin), (random_logits, random_labels)]:
        focal, focal_grad = value_and_grad(lambda x: losses.focal_loss(x, labels, gamma=0.0).sum(), logits)  # noqa: B023
        ce, ce_grad = value_and_grad(lambda x: losses.softmax_cross_entropy(x, labels).sum(), logits)  # noqa: B023
        np.testing.assert_allclose(focal, ce, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(focal_grad, ce_grad, atol=1e-6)


@pytest.mark.parametrize("gamma", FOCAL_GAMMAS)
def test_focal_loss_gradient_matches_a_float64_reference(gamma):
    """float32 values and gradients equal jax.grad of the float64 textbook formula.

    Margins stop at 30, where ``1 - p_y`` (about 1e-13) is still resolved in float64.
    """
    random_logits = 3.0 * jax.random.normal(jax.random.key(21), (6, 5))
    random_labels = jnp.array([0, 4, 2, 2, 1, 3])
    cases = [confident_and_wrong_rows(m) for m in (0.0, 5.0, 17.0, 30.0)] + [(random_logits, random_labels)]
    for logits, labels in cases:
        value, grad = value_and_grad(lambda x: losses.focal_loss(x, labels, gamma=gamma).sum(), logits)  # noqa: B023
        with enable_x64():
            logits64 = jnp.asarray(np.asarray(logits, np.float64))
            ref_value, ref_grad = value_and_grad(lambda x: focal_reference(x, labels, gamma).sum(), logits64)  # noqa: B023
            focal = jax.jit(lambda x: losses.focal_loss(x, labels, gamma=gamma))  # noqa: B023
            check_grads(focal, (logits64,), order=1, modes=("rev",), eps=1e-6)
        np.testing.assert_allclose(value, ref_value, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------- invariances


def test_permuting_pairs_leaves_clip_and_infonce_unchanged():
    a, b = unit(4, (10, 6)), unit(5, (10, 6))
    perm = jax.random.permutation(jax.random.key(6), 10)
    for fn in (losses.clip_loss, losses.infonce_loss):
        np.testing.assert_allclose(fn(a[perm], b[perm], temperature=0.1), fn(a, b, temperature=0.1), rtol=1e-6)


def test_swapping_sides_leaves_clip_unchanged_but_not_infonce():
    a, b = unit(7, (10, 6)), unit(8, (10, 6))
    np.testing.assert_allclose(
        losses.clip_loss(b, a, temperature=0.1), losses.clip_loss(a, b, temperature=0.1), rtol=1e-6
    )
    assert abs(float(losses.infonce_loss(b, a, temperature=0.1) - losses.infonce_loss(a, b, temperature=0.1))) > 1e-3


def test_infonce_tends_to_log_n_as_temperature_grows():
    a, b = unit(9, (32, 6)), unit(10, (32, 6))
    np.testing.assert_allclose(losses.infonce_loss(a, b, temperature=1e6), math.log(32), rtol=1e-5)


def test_no_temperature_bound_holds_and_a_temperature_breaks_it():
    """At temperature 1, even optimising the embeddings cannot pass log(1 + (N-1)e^-2).

    Gradient descent reaches the regular simplex (negatives at cosine -1/(N-1)), the
    best configuration of N <= D + 1 unit vectors, whose loss sits just above the bound.
    """
    n = 8
    floor = losses.infonce_loss_floor(n)
    simplex = math.log1p((n - 1) * math.exp(-n / (n - 1)))

    def train(temperature):
        def loss(params):
            a, b = params
            normalise = lambda x: x / jnp.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
            return losses.infonce_loss(normalise(a), normalise(b), temperature=temperature)

        params = (unit(11, (n, 16)), unit(12, (n, 16)))
        step = jax.jit(lambda p: jax.tree.map(lambda x, g: x - 0.5 * g, p, jax.grad(loss)(p)))
        for _ in range(300):
            params = step(params)
        return float(loss(params))

    at_one = train(1.0)
    assert floor < simplex
    np.testing.assert_allclose(at_one, simplex, rtol=1e-3)
    assert train(0.1) < floor / 10


# ------------------------------------------------------------------------ numerics


TEMPERATURE_LOSSES = ["infonce", "clip", "ntxent", "supcon", "siglip"]


@pytest.mark.parametrize("name", TEMPERATURE_LOSSES)
def test_finite_at_inverse_temperature_100(name):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]
    hyperparameters = {**hyperparameters, "temperature": 0.01}
    value, grad = value_and_grad(lambda x: loss_fn(x, *arrays[1:], **hyperparameters), arrays[0])
    assert np.isfinite(value) and np.all(np.isfinite(grad))


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_bfloat16_inputs_give_float32_losses(name):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]
    half = [x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x for x in arrays]
    value, grad = value_and_grad(lambda x: loss_fn(x, *half[1:], **hyperparameters), half[0])
    assert value.dtype == jnp.float32
    assert np.all(np.isfinite(np.asarray(grad, np.float32)))
    full = jax.jit(lambda *arrays: loss_fn(*arrays, **hyperparameters))(*arrays)
    np.testing.assert_allclose(value, full, rtol=0.05, atol=0.02)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_duplicate_embeddings_are_finite(name):
    loss_fn, arrays, hyperparameters = EXAMPLES[name]
    first = jnp.concatenate([arrays[0][:4]] * 4)  # every row appears 4 times
    value, grad = value_and_grad(lambda x: loss_fn(x, *arrays[1:], **hyperparameters), first)
    assert np.isfinite(value) and np.all(np.isfinite(grad))


@pytest.mark.parametrize(
    "loss_fn, hyperparameters",
    [
        (losses.supcon_loss, {"temperature": 0.1}),
        (losses.triplet_loss, {"margin": 0.2}),
        (losses.triplet_loss, {"margin": 0.2, "mining": "batch_hard"}),
        (losses.triplet_loss, {"margin": 0.2, "mining": "semi_hard"}),
        (losses.multi_similarity_loss, {"mining_margin": 0.1}),
    ],
)
def test_rows_with_every_candidate_masked(loss_fn, hyperparameters):
    """All labels distinct: no anchor has a positive. The loss is defined and finite."""
    z = unit(13, (6, 4))
    value, grad = value_and_grad(lambda z: loss_fn(z, jnp.arange(6), **hyperparameters), z)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    if loss_fn is not losses.multi_similarity_loss:  # MS keeps its negative term
        assert float(value) == 0.0


def test_loss_with_learnable_temperature_jits_and_differentiates():
    a, b = unit(14, (8, 4)), unit(15, (8, 4))
    log_inverse_temperature = jnp.log(1 / 0.07)
    grad = jax.jit(jax.grad(lambda s: losses.clip_loss(a, b, temperature=jnp.exp(-s))))(log_inverse_temperature)
    assert np.isfinite(grad) and grad != 0


# --------------------------------------------------------------------- bad input


def test_mismatched_shapes_name_the_arguments():
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        losses.clip_loss(jnp.zeros((4, 3)), jnp.zeros((5, 3)), temperature=0.1)
    with pytest.raises(ValueError, match=r"queries must have shape \[B, D\]"):
        losses.infonce_loss(jnp.zeros(4), jnp.zeros(4), temperature=0.1)
    with pytest.raises(ValueError, match="proxies must have shape"):
        losses.proxy_nca_loss(jnp.zeros((4, 3)), jnp.zeros(4, int), jnp.zeros((5, 2)), temperature=0.1)
    with pytest.raises(ValueError, match="logits and labels must have the same shape"):
        losses.binary_cross_entropy(jnp.zeros(3), jnp.zeros(4))


@pytest.mark.parametrize("temperature", [0.0, -0.1, None])
def test_non_positive_or_missing_temperature_is_rejected(temperature):
    with pytest.raises(ValueError, match="temperature"):
        losses.clip_loss(jnp.zeros((4, 3)), jnp.zeros((4, 3)), temperature=temperature)


def test_cosine_losses_have_no_default_temperature():
    for fn in (losses.infonce_loss, losses.clip_loss, losses.ntxent_loss, losses.siglip_loss, losses.supcon_loss):
        with pytest.raises(TypeError, match="temperature"):
            fn(jnp.zeros((4, 3)), jnp.zeros((4, 3)))


def test_labels_of_the_wrong_shape_or_type_are_rejected():
    z = jnp.zeros((4, 3))
    with pytest.raises(ValueError, match=r"labels must have shape \[4\]"):
        losses.supcon_loss(z, jnp.zeros((4, 1), int), temperature=0.1)
    with pytest.raises(ValueError, match="labels must be integers"):
        losses.triplet_loss(z, jnp.zeros(4), margin=0.1)
    with pytest.raises(ValueError, match=r"labels must have shape \(4,\)"):
        losses.softmax_cross_entropy(jnp.zeros((4, 3)), jnp.zeros(5, int))


def test_unknown_mining_and_bad_margins_are_rejected():
    z, labels = jnp.zeros((4, 3)), jnp.zeros(4, int)
    with pytest.raises(ValueError, match="mining must be one of"):
        losses.triplet_loss(z, labels, margin=0.1, mining="hardest")
    with pytest.raises(ValueError, match="margin must be > 0"):
        losses.contrastive_loss(z, labels, margin=0.0)


def test_unbound_axis_name_is_a_clear_error():
    with pytest.raises(ValueError, match="axis_name='data' is not bound"):
        losses.clip_loss(jnp.zeros((4, 3)), jnp.zeros((4, 3)), temperature=0.1, axis_name="data")
    with pytest.raises(ValueError, match="axis_name='data' is not bound"):
        jax.jit(lambda z: losses.supcon_loss(z, jnp.zeros(4, int), temperature=0.1, axis_name="data"))(
            jnp.zeros((4, 3))
        )


def test_infonce_is_cross_entropy_with_arange_labels():
    """The N x N problem's identity matrix, as integer labels, is arange(N)."""
    a, b = unit(16, (10, 6)), unit(17, (10, 6))
    ce = losses.softmax_cross_entropy(a @ b.T / 0.1, jnp.arange(10)).mean()
    np.testing.assert_allclose(losses.infonce_loss(a, b, temperature=0.1), ce, rtol=1e-6)
    column_ce = losses.softmax_cross_entropy((a @ b.T).T / 0.1, jnp.arange(10)).mean()
    np.testing.assert_allclose(losses.clip_loss(a, b, temperature=0.1), (ce + column_ce) / 2, rtol=1e-6)


def test_contrastive_metrics_golden_and_chunked():
    metrics = losses.contrastive_metrics(E, E, temperature=1.0)
    expected = {
        "accuracy_a_to_b": 1.0,
        "accuracy_b_to_a": 1.0,
        "positive_logit": 1.0,
        "negative_logit": 0.0,
        "logsumexp": math.log(math.e + 1),
    }
    for key, value in expected.items():
        assert float(metrics[key]) == pytest.approx(value, abs=1e-6), key
    _, (a, b), _ = EXAMPLES["clip"]
    dense = losses.contrastive_metrics(a, b, temperature=0.1)
    chunked = jax.jit(lambda a, b: losses.contrastive_metrics(a, b, temperature=0.1, chunk_size=8))(a, b)
    assert 0.0 < float(dense["accuracy_a_to_b"]) < 1.0
    for key in dense:
        np.testing.assert_allclose(chunked[key], dense[key], rtol=1e-6, err_msg=key)


def test_batch_prototype_cross_entropy_requires_a_positive_temperature():
    z, labels = jnp.zeros((4, 3)), jnp.zeros(4, int)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        losses.batch_prototype_cross_entropy_loss(z, labels, num_classes=2, temperature=0.0)
