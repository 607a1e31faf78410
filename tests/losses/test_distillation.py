"""Distillation from a teacher (`losses.distillation`): the logit form against a float64
reference written from open_clip's `DistillClipLoss` on the global arrays (value and the
gradients of a, b and the student's temperature; the teacher's none), dense and in tiles
on one device, all-gathered and around the ring on 8, tiles equal to dense; the embedding
forms against their formulas.

The teacher's width differs from the student's (D_t = 12, D = 8), and its softmaxes
differ from the student's, so a statistic taken over the wrong rows (a column's teacher
softmax over the local rows only, the mutation the issue names) moves the loss.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from loss_cases import MODES, assert_matches, enable_x64

from contrastive_jax import losses, sharding
from contrastive_jax.losses import distillation

N, D, D_T = 32, 8, 12
TEMPERATURE, TEACHER_TEMPERATURE = 0.1, 0.05


def arrays(seed=0):
    """`(a, b, teacher_a, teacher_b)`: unit rows, b near a, the teacher's near its own a."""
    keys = jax.random.split(jax.random.key(seed), 4)
    a = losses.l2_normalize(jax.random.normal(keys[0], (N, D)))
    b = losses.l2_normalize(a + 0.8 * jax.random.normal(keys[1], (N, D)))
    ta = losses.l2_normalize(jax.random.normal(keys[2], (N, D_T)))
    tb = losses.l2_normalize(ta + 0.5 * jax.random.normal(keys[3], (N, D_T)))
    return a, b, ta, tb


def reference(a, b, ta, tb, temperature, teacher_temperature):
    """open_clip's `DistillClipLoss.dist_loss` of both directions, on the global arrays:
    `-(softmax(t) * log_softmax(s)).sum(1).mean(0)`, rows then columns, halved."""
    s, t = a @ b.T / temperature, ta @ tb.T / teacher_temperature

    def cross_entropy(t, s):
        return -jnp.mean(jnp.sum(jax.nn.softmax(t, axis=1) * jax.nn.log_softmax(s, axis=1), axis=1))

    return (cross_entropy(t, s) + cross_entropy(t.T, s.T)) / 2


def reference_value_and_grad(arrays):
    with enable_x64():
        wide = [np.asarray(x, np.float64) for x in arrays]

        def loss(a, b, temperature):
            return reference(a, b, *wide[2:], temperature, TEACHER_TEMPERATURE)

        value, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(wide[0], wide[1], np.float64(TEMPERATURE))
        return float(value), jax.tree.map(np.asarray, grads)


def value_and_grad(mode, a, b, ta, tb):
    devices, options = MODES[mode]
    streaming = losses.Streaming(**options)

    def loss(a, b, temperature):
        fn = functools_partial(streaming)
        if devices:
            fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices=devices))
        return fn(a, b, ta, tb, temperature=temperature, teacher_temperature=TEACHER_TEMPERATURE)

    return jax.value_and_grad(loss, argnums=(0, 1, 2))(a, b, jnp.float32(TEMPERATURE))


def functools_partial(streaming):
    def fn(a, b, ta, tb, *, temperature, teacher_temperature, axis_name=None):
        return losses.distill_clip_loss(
            a,
            b,
            ta,
            tb,
            temperature=temperature,
            teacher_temperature=teacher_temperature,
            streaming=streaming,
            axis_name=axis_name,
        )

    return fn


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_logit_form_equals_the_reference_in_every_mode(mode):
    data = arrays()
    value, grads = value_and_grad(mode, *data)
    assert_matches((value, grads), reference_value_and_grad(data))


def test_the_teacher_gets_no_gradient():
    a, b, ta, tb = arrays()
    streaming = losses.Streaming(chunk_size=8)

    def loss(ta, tb):
        return losses.distill_clip_loss(a, b, ta, tb, temperature=0.1, teacher_temperature=0.05, streaming=streaming)

    for g in jax.grad(loss, argnums=(0, 1))(ta, tb):
        assert not np.any(np.asarray(g))


def test_a_student_that_copies_its_teacher_is_at_the_minimum():
    """The cross-entropy is least where the student's softmaxes are the teacher's: its
    gradient vanishes there, and it is the teacher's entropy."""
    a, b, _, _ = arrays()
    grads = jax.grad(losses.distill_clip_loss, argnums=(0, 1))(
        a, b, a, b, temperature=0.1, teacher_temperature=0.1, streaming=losses.Streaming(chunk_size=8)
    )
    # Tangent to the unit sphere is what moves a normalised embedding; the radial part is free.
    for g, x in zip(grads, (a, b)):
        tangent = g - jnp.sum(g * x, axis=1, keepdims=True) * x
        np.testing.assert_allclose(tangent, 0.0, atol=1e-6)


def test_chunk_size_must_divide_the_columns():
    a, b, ta, tb = arrays()
    with pytest.raises(ValueError, match="chunk_size=5 must divide the candidate columns"):
        losses.distill_clip_loss(
            a, b, ta, tb, temperature=0.1, teacher_temperature=0.05, streaming=losses.Streaming(chunk_size=5)
        )


def test_teacher_rows_must_be_the_students():
    a, b, ta, tb = arrays()
    with pytest.raises(ValueError, match="the teacher embeds the same pairs"):
        losses.distill_clip_loss(a, b, ta[:8], tb[:8], temperature=0.1, teacher_temperature=0.05)


@pytest.mark.parametrize("form", distillation.EMBEDDING_FORMS)
@pytest.mark.parametrize("devices", [None, 8])
def test_embedding_form(form, devices):
    _, _, ta, tb = arrays()
    student = ta + 0.3 * jax.random.normal(jax.random.key(5), ta.shape)
    if form == "mse":
        want = np.mean((np.asarray(student) - np.asarray(tb)) ** 2)
        want_grad = 2 * (np.asarray(student) - np.asarray(tb)) / student.size
    else:
        s = np.asarray(student, np.float64)
        norms = np.linalg.norm(s, axis=1, keepdims=True)
        cos = np.sum(s / norms * np.asarray(tb), axis=1, keepdims=True)
        want = np.mean(1 - cos)
        want_grad = -(np.asarray(tb) - cos * s / norms) / norms / len(s)
    fn = functools_embedding(form)
    if devices:
        fn = sharding.shard_loss(fn, sharding.make_mesh(num_devices=devices))
    value, grad = jax.value_and_grad(fn)(student, tb)
    assert float(value) == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(grad, want_grad, atol=1e-6)


def functools_embedding(form):
    def fn(student, teacher, axis_name=None):
        return losses.embedding_distill_loss(student, teacher, form=form, axis_name=axis_name)

    return fn
