"""contrastive_jax.training.noise_scale: McCandlish et al.'s estimator against a closed form, each
device's share of the gradient with global negatives, the train step's option, and a
quick run of experiments/studies/gradient_noise_scale.py."""

import functools
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from loss_cases import enable_x64

from contrastive_jax import losses, sharding
from contrastive_jax.sharding import DATA_AXIS
from contrastive_jax.training import noise_scale
from contrastive_jax.training.run_plan import data_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # experiments/ and configs/ are imported from the root
    sys.path.insert(0, str(ROOT))


@functools.cache
def sharded_norms(loss_of_rows, num_devices=8):
    """`per_device_value_and_grad` on `num_devices` devices, jitted: `(params, rows) ->
    (loss, grads, small, big)`, `loss_of_rows(params, local rows)` the device's loss."""
    mesh = sharding.make_mesh(num_devices)

    def per_device(params, local_rows):
        (loss, _), grads, small, big = noise_scale.per_device_value_and_grad(
            lambda p: (loss_of_rows(p, local_rows), None), params, DATA_AXIS
        )
        return loss, grads, small, big

    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(DATA_AXIS)), out_specs=P()))


@pytest.mark.compat
def test_least_squares_noise_scale_matches_the_closed_form():
    """Least squares, x ~ N(0, I_d), y = x . w* + noise (std s), at w = w* + delta:
    per-example gradient g = x (x . delta - e), so G = delta, |G|^2 = |delta|^2 and
    E|g|^2 = (d + 2)|delta|^2 + d s^2, hence tr(Sigma) = (d + 1)|delta|^2 + d s^2."""
    d, noise, b_small, devices, draws = 8, 0.5, 16, 8, 300
    delta = jnp.full((d,), 0.25)
    want_trace = (d + 1) * float(delta @ delta) + d * noise**2
    want = noise_scale.NoiseScale(float(delta @ delta), want_trace, want_trace / float(delta @ delta))

    def mean_loss(w, rows):  # the global mean over all devices' rows
        x, e = rows[:, :-1], rows[:, -1]
        return jax.lax.pmean(jnp.mean(0.5 * jnp.square(x @ w - e)), DATA_AXIS)

    def draw(key):
        kx, ke = jax.random.split(key)
        x = jax.random.normal(kx, (b_small * devices, d))
        e = noise * jax.random.normal(ke, (b_small * devices, 1))
        _, grads, small, big = sharded_norms(mean_loss, devices)(delta, jnp.concatenate([x, e], axis=1))
        np.testing.assert_allclose(grads, x.T @ (x @ delta - e[:, 0]) / len(x), rtol=1e-4, atol=1e-6)
        return float(small), float(big)

    norms = np.array([draw(k) for k in jax.random.split(jax.random.key(0), draws)])
    got = noise_scale.estimate(*norms.mean(axis=0), b_small, b_small * devices)
    assert got.g_squared == pytest.approx(want.g_squared, rel=0.05)
    assert got.trace_sigma == pytest.approx(want.trace_sigma, rel=0.05)
    assert got.b_simple == pytest.approx(want.b_simple, rel=0.1)


def test_estimate_inverts_the_model_of_the_norms():
    """E|G_B|^2 = |G|^2 + tr(Sigma) / B: the estimator recovers both exactly."""
    g2, trace = 3.0, 120.0
    got = noise_scale.estimate(g2 + trace / 16, g2 + trace / 256, 16, 256)
    np.testing.assert_allclose(got, (g2, trace, trace / g2))
    with pytest.raises(ValueError, match="b_small < b_big"):
        noise_scale.estimate(1.0, 1.0, 256, 16)
    windows = [{noise_scale.SMALL_KEY: g2 + trace / 16, noise_scale.BIG_KEY: g2 + trace / 256}] * 3
    assert noise_scale.window_b_simple(windows, 256, 16) == pytest.approx(trace / g2)


@pytest.mark.compat
def test_device_shares_use_the_global_negatives():
    """A linear encoder z = normalize(x W) under the sharded CLIP loss: device d's share is
    dL/dW_d, W_d the copy of W that embeds its rows, with every row scored against all N
    columns (a float64 reference with one copy of W per device); not the gradient of a
    CLIP loss over the device's rows alone."""
    devices, rows, d_in, d_out = 4, 8, 6, 5
    kx, ky, kw = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(kx, (devices * rows, d_in))
    y = jax.random.normal(ky, (devices * rows, d_in))
    w = 0.5 * jax.random.normal(kw, (d_in, d_out))

    def embed(w, inputs):
        return losses.l2_normalize(inputs @ w)

    def sharded_loss(w, local):
        return losses.clip_loss(embed(w, local[:, 0]), embed(w, local[:, 1]), temperature=0.1, axis_name=DATA_AXIS)

    loss, grads, small, big = sharded_norms(sharded_loss, devices)(w, jnp.stack([x, y], axis=1))

    with enable_x64():
        x64, y64, w64 = (np.asarray(v, np.float64) for v in (x, y, w))

        def dense_loss(copies):  # copies [devices, d_in, d_out]: rows of device d use copies[d]
            za = jnp.concatenate([embed(copies[k], x64[k * rows : (k + 1) * rows]) for k in range(devices)])
            zb = jnp.concatenate([embed(copies[k], y64[k * rows : (k + 1) * rows]) for k in range(devices)])
            return losses.clip_loss(za, zb, temperature=0.1)

        copies = jnp.broadcast_to(w64, (devices, *w64.shape))
        want_loss, shares = jax.jit(jax.value_and_grad(dense_loss))(copies)
        want_loss, shares = float(want_loss), np.asarray(shares)
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(grads, shares.sum(0), rtol=1e-4, atol=1e-6)
    want_small = np.mean([np.sum((devices * s) ** 2) for s in shares])
    assert float(small) == pytest.approx(want_small, rel=1e-4)
    assert float(big) == pytest.approx(np.sum(shares.sum(0) ** 2), rel=1e-4)
    local_loss = lambda w: losses.clip_loss(embed(w, x[:rows]), embed(w, y[:rows]), temperature=0.1)  # noqa: E731
    local_only = jax.jit(jax.grad(local_loss))(w)
    assert not np.allclose(devices * shares[0], local_only, atol=1e-3)  # the in-device loss differs


def test_the_noise_scale_step_is_the_plain_step(tiny_config):
    """With the option on the step's update is the plain step's (one forward and backward
    per device, summed), and its metrics add the two norms, small > big."""
    from contrastive_jax.config_lib import override
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training.run_plan import build

    plain_sgd = {
        "model.dropout_rate": 0.0,
        "train.num_train_steps": 1000,
        "optim.name": "sgd",
        "optim.momentum": 0.0,
        "optim.warmup_steps": 0,
        "optim.grad_clip_norm": 0.0,
    }
    config = override(tiny_config, plain_sgd)
    mesh = sharding.make_mesh(8)
    ds = input_pipeline.train_dataset(data_settings(config))
    batch = next(iter(ds))
    results = []
    for on in (False, True):
        trainer = build(override(config, {"train.log_noise_scale": on}), mesh).trainer
        init, abstract = trainer.init_state(ds.element_spec)
        state, metrics = trainer.jit_train_step(abstract)(init(), batch)
        results.append((jax.device_get(state.params), jax.device_get(metrics)))
    (plain_params, plain), (params, metrics) = results
    np.testing.assert_allclose(metrics["loss"], plain["loss"], rtol=1e-5)
    np.testing.assert_allclose(metrics["grad_norm"], plain["grad_norm"], rtol=1e-4)
    np.testing.assert_allclose(metrics["temperature"], plain["temperature"], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params, plain_params)
    assert metrics[noise_scale.BIG_KEY] == pytest.approx(float(metrics["grad_norm"]) ** 2, rel=1e-4)
    assert metrics[noise_scale.SMALL_KEY] > metrics[noise_scale.BIG_KEY] > 0
    assert noise_scale.SMALL_KEY not in plain


def test_the_loop_logs_b_simple_of_its_window_at_one_device_s_share(tiny_config, tmp_path):
    """The logged `train/noise_scale` is B_simple of the window's mean norms with the small
    batch one device's share of the global batch (64 / 8 devices), not another split."""
    from contrastive_jax import run_dir
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import run_plan

    fields = {"train.log_noise_scale": True, "train.num_train_steps": 4, "train.log_every_steps": 2}
    run_plan.train_and_evaluate(override(tiny_config, fields), str(tmp_path))
    logged = [row for row in run_dir.read_metrics(tmp_path) if "train/noise_scale" in row]
    assert [row["step"] for row in logged] == [2, 4]
    for row in logged:
        small, big = row[f"train/{noise_scale.SMALL_KEY}"], row[f"train/{noise_scale.BIG_KEY}"]
        assert row["train/noise_scale"] == pytest.approx(noise_scale.estimate(small, big, 8, 64).b_simple, rel=1e-6)


@pytest.mark.slow  # 20 s: a training run; the estimator's properties are tested above
def test_quick_run_writes_the_noise_scale(digits_data_dir, tmp_path):
    from experiments.studies import gradient_noise_scale as gns

    gns.main(["--quick", "--out", str(tmp_path), "--data-dir", digits_data_dir, "--steps", "4", "--every", "2"])
    result = json.loads((tmp_path / "noise_scale.json").read_text())
    assert (result["global_batch_size"], result["small_batch_size"], result["devices"]) == (64, 8, 8)
    assert [r["step"] for r in result["records"]] == [2, 4]
    for record in result["records"]:
        assert record["small_sq_norm"] > record["big_sq_norm"] > 0  # smaller batches: noisier
        assert np.isfinite(record["b_simple_running"])
    assert (tmp_path / "noise_scale.png").is_file()


@pytest.mark.parametrize(
    "fields, devices, message",
    [
        ({}, 1, "needs 2 or more devices"),
        ({"train.micro_batch_size": 32}, 8, "micro_batch_size=0 and a loss without state"),
        ({"loss.name": "sogclr"}, 8, "micro_batch_size=0 and a loss without state"),
    ],
)
def test_the_option_refuses_what_it_cannot_measure(load_config, fields, devices, message):
    from contrastive_jax.config_lib import override
    from contrastive_jax.errors import ConfigError
    from contrastive_jax.training.run_plan import build

    config = override(load_config("default"), {"train.log_noise_scale": True, **fields})
    with pytest.raises(ConfigError, match=message):
        build(config, sharding.make_mesh(devices))


def _least_squares_gradients(batch, count, rng, d=8, noise=0.5, delta=0.25):
    """`count` gradients of independent batches of least squares (the closed form above)."""
    grads = []
    for _ in range(count):
        x = rng.normal(size=(batch, d))
        e = noise * rng.normal(size=batch)
        grads.append({"w": x.T @ (x @ np.full(d, delta) - e) / batch})
    return grads


def test_replicates_recover_the_least_squares_closed_form():
    """R = 400 independent batches at N = 64 and N / 4: |G|^2, tr(Sigma) and B_simple as
    the closed form says, the variance 4x at a quarter of the batch, no bias."""
    d, noise, delta = 8, 0.5, 0.25
    g_squared = d * delta**2
    trace_sigma = (d + 1) * g_squared + d * noise**2
    rng = np.random.default_rng(0)
    got = noise_scale.compare(_least_squares_gradients(64, 400, rng), _least_squares_gradients(16, 400, rng), n=64)
    assert got["g_squared"] == pytest.approx(g_squared, rel=0.05)
    assert got["trace_sigma"] == pytest.approx(trace_sigma, rel=0.1)
    assert got["b_simple"] == pytest.approx(trace_sigma / g_squared, rel=0.1)
    assert got["variance_ratio"] == pytest.approx(4, rel=0.1)
    assert abs(got["bias_squared"]) < 0.02 * g_squared


def test_replicates_separate_the_objectives_change_from_the_noise():
    """Gradients whose mean moves by delta at the smaller batch (as a contrastive
    objective's does with its negatives): the bias is |delta|^2, not counted as noise."""
    rng = np.random.default_rng(1)
    mean, shift = np.ones(50), np.full(50, 0.2)
    at_n = [{"g": mean + rng.normal(size=50) / 8} for _ in range(200)]
    at_quarter = [{"g": mean + shift + rng.normal(size=50) / 4} for _ in range(200)]
    got = noise_scale.compare(at_n, at_quarter, n=64)
    assert got["bias_squared"] == pytest.approx(float(shift @ shift), rel=0.1)
    assert got["g_squared"] == pytest.approx(50, rel=0.02)
    assert got["variance_ratio"] == pytest.approx(4, rel=0.1)
    assert got["trace_sigma"] == pytest.approx(64 * 50 / 64, rel=0.1)  # n * d / 8^2
    with pytest.raises(ValueError, match="need 2 or more independent gradients"):
        noise_scale.replicates(at_n[:1])


def test_the_replicate_moments_are_unbiased_with_few_replicates():
    """R = 3 gradients, |E g|^2 = 1 beside tr Cov = 10: |mean|^2 would be 1 + 10/3; the
    pair mean and the spread are right on average over 4,000 draws."""
    rng = np.random.default_rng(2)
    mean = np.full(10, np.sqrt(0.1))
    draws = [noise_scale.replicates([mean + rng.normal(size=10) for _ in range(3)])[0] for _ in range(4000)]
    assert np.mean([d.mean_sq_norm for d in draws]) == pytest.approx(1.0, abs=0.1)
    assert np.mean([d.trace_cov for d in draws]) == pytest.approx(10.0, rel=0.03)


def _gaussian_gradients(g, sigma, batch, count, rng):
    """`count` batch-mean gradients of per-example gradients ``g + sigma * e`` (e standard
    normal per coordinate): B_simple is ``sum(sigma^2) / |g|^2``."""
    return [{"g": g + sigma * rng.normal(size=(batch, len(g))).mean(axis=0)} for _ in range(count)]


def test_replicate_bootstrap_intervals_cover_the_known_noise_scale():
    """64 disjoint replicates at N = 64 and N / 4 of least squares: each interval holds
    the closed form (B_simple, a variance ratio of 4, no bias) and is no wider than
    needed."""
    d, noise, delta = 8, 0.5, 0.25
    b_simple = ((d + 1) * d * delta**2 + d * noise**2) / (d * delta**2)
    rng = np.random.default_rng(3)
    got = noise_scale.compare(
        _least_squares_gradients(64, 64, rng), _least_squares_gradients(16, 64, rng), n=64, resamples=2000
    )
    low, high = got["b_simple_interval"]
    assert low < b_simple < high and high / low < 2.5
    assert got["variance_ratio_interval"][0] < 4 < got["variance_ratio_interval"][1]
    assert got["bias_over_g_interval"][0] < 0 < got["bias_over_g_interval"][1]
    assert (
        got["b_simple"]
        == noise_scale.compare(
            _least_squares_gradients(64, 64, np.random.default_rng(3)),
            _least_squares_gradients(16, 64, rng),
            n=64,
        )["b_simple"]
    )  # the point estimate does not depend on the bootstrap


def test_replicates_that_share_examples_fake_a_negative_bias():
    """The quarter batches cut from the big batches (as the cosine study's streams did):
    the estimator's independence fails and the 'bias' comes out well below 0; disjoint
    quarter batches of the same problem hold 0."""
    d, n, count = 256, 64, 32  # B_simple 400: a shared example moves the bias by -2 B / (n R) = -0.39 |G|^2
    g, sigma = np.full(d, 0.05), np.ones(d)
    rng = np.random.default_rng(4)
    examples = g + sigma * rng.normal(size=(count, n, d))  # [R, n, D] per-example gradients
    at_n = [{"g": batch.mean(axis=0)} for batch in examples]
    shared = [{"g": q.mean(axis=0)} for batch in examples[: count // 4] for q in np.split(batch, 4)]
    disjoint = _gaussian_gradients(g, sigma, n // 4, count, rng)
    faked = noise_scale.compare(at_n, shared, n, resamples=1000)
    assert faked["bias_over_g"] == pytest.approx(-0.39, abs=0.15) and faked["bias_over_g_interval"][1] < 0
    low, high = noise_scale.compare(at_n, disjoint, n, resamples=1000)["bias_over_g_interval"]
    assert low < 0 < high


def test_adam_preconditioning_divides_by_the_bias_corrected_second_moment():
    import optax

    params = {"w": np.zeros(3, np.float32)}
    first = {"w": np.array([0.5, -2.0, 4.0], np.float32)}
    tx = optax.chain(optax.clip_by_global_norm(100.0), optax.adamw(1e-3))  # as make_optimizer chains it
    _, state = tx.update(first, tx.init(params), params)
    # after one step v_hat = g^2: the first gradient preconditioned is its sign
    np.testing.assert_allclose(noise_scale.adam_preconditioned(first, state)["w"], [1, -1, 1], rtol=1e-6)
    np.testing.assert_allclose(
        noise_scale.adam_preconditioned({"w": np.array([1.0, 1.0, 8.0])}, state)["w"], [2, 0.5, 2], rtol=1e-6
    )


def test_the_preconditioned_noise_scale_is_a_different_number_each_named():
    """Coordinates with large noise and small signal beside the reverse: the SGD B_simple
    and the one under Adam's diagonal scale differ by 10x; each interval holds its own
    closed form and not the other's."""
    g, sigma, scale = np.array([0.1, 1.0]), np.array([3.0, 0.3]), np.array([3.0, 0.3])
    sgd = np.sum(sigma**2) / np.sum(g**2)  # 9.09 / 1.01 = 9.0
    adam = np.sum((sigma / scale) ** 2) / np.sum((g / scale) ** 2)  # 2 / 11.11 = 0.18
    rng = np.random.default_rng(0)  # intervals held the SGD truth in 36 of 40 seeds by hand
    at_n, at_quarter = _gaussian_gradients(g, sigma, 64, 64, rng), _gaussian_gradients(g, sigma, 16, 64, rng)
    plain = noise_scale.compare(at_n, at_quarter, 64, resamples=1000)["b_simple_interval"]
    scaled = [jax.tree.map(lambda x: x / scale, grads) for grads in (at_n, at_quarter)]
    preconditioned = noise_scale.compare(*scaled, 64, resamples=1000)["b_simple_interval"]
    assert plain[0] < sgd < plain[1] and not plain[0] < adam < plain[1]
    assert preconditioned[0] < adam < preconditioned[1] and not preconditioned[0] < sgd < preconditioned[1]
