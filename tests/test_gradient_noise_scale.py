"""experiments/gradient_noise_scale.py: McCandlish et al.'s estimator against a closed form,
the per-device gradient with global negatives, and a quick run of the tool."""

import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # experiments/ and configs/ are imported from the root
    sys.path.insert(0, str(ROOT))

from contrastive_jax import losses  # noqa: E402
from experiments import gradient_noise_scale as gns  # noqa: E402


def test_least_squares_noise_scale_matches_the_closed_form():
    """Least squares, x ~ N(0, I_d), y = x . w* + noise (std s), at w = w* + delta:
    per-example gradient g = x (x . delta - e), so G = delta, |G|^2 = |delta|^2 and
    E|g|^2 = (d + 2)|delta|^2 + d s^2, hence tr(Sigma) = (d + 1)|delta|^2 + d s^2."""
    d, noise, b_small, groups, draws = 8, 0.5, 16, 8, 400
    delta = jnp.full((d,), 0.25)
    want_trace = (d + 1) * float(delta @ delta) + d * noise**2
    want = gns.NoiseScale(float(delta @ delta), want_trace, want_trace / float(delta @ delta))

    def draw(key):
        kx, ke = jax.random.split(key)
        x = jax.random.normal(kx, (b_small * groups, d))
        e = noise * jax.random.normal(ke, (b_small * groups,))
        return gns.squared_gradient_norms(lambda w: 0.5 * jnp.square(x @ w - e), delta, groups)

    norms = np.array([draw(k) for k in jax.random.split(jax.random.key(0), draws)])
    got = gns.estimate(*norms.mean(axis=0), b_small, b_small * groups)
    assert got.g_squared == pytest.approx(want.g_squared, rel=0.05)
    assert got.trace_sigma == pytest.approx(want.trace_sigma, rel=0.05)
    assert got.b_simple == pytest.approx(want.b_simple, rel=0.1)


def test_estimate_inverts_the_model_of_the_norms():
    """E|G_B|^2 = |G|^2 + tr(Sigma) / B: the estimator recovers both exactly."""
    g2, trace = 3.0, 120.0
    got = gns.estimate(g2 + trace / 16, g2 + trace / 256, 16, 256)
    np.testing.assert_allclose(got, (g2, trace, trace / g2))
    with pytest.raises(ValueError, match="b_small < b_big"):
        gns.estimate(1.0, 1.0, 256, 16)


def test_groups_use_the_global_negatives():
    """The per-row CLIP terms average to clip_loss; a group's gradient is that of its own
    rows' terms, each scored against all N columns (not a loss over the group alone)."""
    za, zb = (losses.l2_normalize(jax.random.normal(k, (16, 4))) for k in jax.random.split(jax.random.key(1)))
    per_row = lambda z: gns.clip_per_row_loss(z, zb, 0.1)  # noqa: E731
    assert float(per_row(za).mean()) == pytest.approx(float(losses.clip_loss(za, zb, temperature=0.1)), rel=1e-5)
    small, big = gns.squared_gradient_norms(per_row, za, 2)
    first_half = jax.grad(lambda z: per_row(z)[:8].mean())(za)
    second_half = jax.grad(lambda z: per_row(z)[8:].mean())(za)
    want_small = (float(jnp.sum(first_half**2)) + float(jnp.sum(second_half**2))) / 2
    assert small == pytest.approx(want_small, rel=1e-5)
    assert big == pytest.approx(float(jnp.sum(jax.grad(lambda z: per_row(z).mean())(za) ** 2)), rel=1e-5)
    local_only = jax.grad(lambda z: losses.clip_loss(z[:8], zb[:8], temperature=0.1))(za)
    assert not np.allclose(first_half, local_only, atol=1e-4)  # the in-group loss differs


@pytest.mark.slow  # 20 s: a training run; the estimator's properties are tested above
def test_quick_run_writes_the_noise_scale(digits_data_dir, tmp_path):
    gns.main(["--quick", "--out", str(tmp_path), "--data-dir", digits_data_dir, "--steps", "4", "--every", "2"])
    result = json.loads((tmp_path / "noise_scale.json").read_text())
    assert (result["global_batch_size"], result["small_batch_size"], result["devices"]) == (64, 8, 8)
    assert [r["step"] for r in result["records"]] == [0, 2]
    for record in result["records"]:
        assert record["small_sq_norm"] > record["big_sq_norm"] > 0  # smaller batches: noisier
        assert np.isfinite(record["b_simple_running"])
    assert (tmp_path / "noise_scale.png").is_file()
