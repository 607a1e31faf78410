"""The gradient noise scale: the critical batch size of a contrastive run, measured.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", Appendix A): a
batch larger than about ``B_simple = tr(Sigma) / |G|^2`` buys few fewer steps, where
``G`` is the true gradient and ``Sigma`` the per-example gradient covariance. Both come
from gradient norms at two batch sizes, each averaged over steps before the ratio:

    |G|^2  ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

For a contrastive loss the small-batch gradient must still see the global negatives (Chen
et al., NeurIPS 2022), or the estimate mixes the gradient noise with the bias of fewer
negatives. Here the small batches are the rows of one device's share (``B_small = N /
groups``) and their gradient is that of their own per-row losses, each row scored against
all N columns: exactly the per-device gradient of the global loss, rescaled to a mean.

Run (from the repository root):
  .venv/bin/python -m experiments.gradient_noise_scale                 # digits, CLIP
  .venv/bin/python -m experiments.gradient_noise_scale --config cmudict_clip --steps 300
  .venv/bin/python -m experiments.gradient_noise_scale --quick         # CI: a few steps

It trains the config (``trainer.build``, the library's own train step) and, every
``--every`` steps, measures ``|G_big|^2`` and the mean ``|G_small|^2`` on that step's
batch; it writes ``noise_scale.json`` (the per-step norms and ``B_simple`` from the
running means) and ``noise_scale.png`` (``B_simple`` vs step) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from contrastive_jax.simulated_devices import simulate_cpu_devices
from experiments import sweep

QUICK = dict(config="default", steps=6, every=2, batch_size=64)
FULL = dict(config="default", steps=1000, every=25, batch_size=256)


class NoiseScale(NamedTuple):
    """McCandlish et al.'s unbiased estimates from averaged squared gradient norms."""

    g_squared: float  # |G|^2
    trace_sigma: float  # tr(Sigma), per example
    b_simple: float  # tr(Sigma) / |G|^2


def estimate(small_sq_norm: float, big_sq_norm: float, b_small: int, b_big: int) -> NoiseScale:
    """``B_simple`` from the mean squared gradient norms at batch sizes ``b_small < b_big``."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got {b_small}, {b_big}.")
    g_squared = (b_big * big_sq_norm - b_small * small_sq_norm) / (b_big - b_small)
    trace_sigma = (small_sq_norm - big_sq_norm) / (1 / b_small - 1 / b_big)
    return NoiseScale(g_squared, trace_sigma, trace_sigma / g_squared)


def squared_gradient_norms(per_row_loss: Callable, params, num_groups: int) -> tuple[float, float]:
    """``(mean_k |G_k|^2, |G|^2)``: the gradient of the mean of ``per_row_loss(params)``
    ``[N]`` over all N rows, and over each of ``num_groups`` equal groups of rows.

    One forward pass; one backward pass per group (a vmapped VJP). Each row's loss may
    depend on every row (global negatives): only the rows averaged differ.
    """
    import jax
    import jax.numpy as jnp

    losses, vjp = jax.vjp(per_row_loss, params)
    n = losses.shape[0]
    if n % num_groups:
        raise ValueError(f"{num_groups} groups do not divide the {n} rows.")
    group = jnp.arange(n) // (n // num_groups)
    weights = (group[None, :] == jnp.arange(num_groups)[:, None]) / (n // num_groups)  # [K, N]

    def squared_norm(row_weights):
        (grads,) = vjp(row_weights.astype(losses.dtype))
        return sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads))

    small = jax.vmap(squared_norm)(weights)
    big = squared_norm(jnp.full((n,), 1 / n))
    return float(jnp.mean(small)), float(big)


def clip_per_row_loss(za, zb, temperature):
    """CLIP's per-pair terms ``[N]``: their mean is ``losses.clip_loss`` (dense)."""
    import jax
    import jax.numpy as jnp

    logits = za @ zb.T / temperature
    own = jnp.diagonal(logits)
    return (jax.nn.logsumexp(logits, axis=1) + jax.nn.logsumexp(logits, axis=0)) / 2 - own


def running_estimates(records: Sequence[dict], b_small: int, b_big: int) -> list[float]:
    """``B_simple`` after each record, from the norms' running means (McCandlish: average
    the norms, then take the ratio)."""
    out = []
    for k in range(1, len(records) + 1):
        small = np.mean([r["small_sq_norm"] for r in records[:k]])
        big = np.mean([r["big_sq_norm"] for r in records[:k]])
        out.append(estimate(small, big, b_small, b_big).b_simple)
    return out


def measure(config, *, every: int, log=print) -> dict:
    """Trains ``config`` and measures the noise scale every ``every`` steps (CLIP pairs)."""
    simulate_cpu_devices(config.num_simulated_devices)
    import jax

    from contrastive_jax import input_pipeline, sharding, trainer

    mesh = sharding.make_mesh()
    run = trainer.build(config, mesh)
    if not run.loss.pairs:
        raise SystemExit(f"the noise scale here needs a pair loss, not {config.loss.name!r}.")
    devices, n = mesh.shape[sharding.DATA_AXIS], config.train.global_batch_size
    dataset = input_pipeline.train_dataset(config, start_step=0)
    init, abstract_state = run.init_state(dataset.element_spec)
    state, step_fn = init(), run.jit_train_step(abstract_state)
    data = sharding.data_sharding(mesh)
    records = []
    started = time.perf_counter()
    for step, batch in zip(range(config.train.num_train_steps), dataset.as_numpy_iterator()):
        batch = {k: jax.device_put(v, data) for k, v in batch.items()}
        if step % every == 0:

            def per_row_loss(params, batch=batch, state=state):
                out = state.apply_fn(
                    {"params": params, "batch_stats": state.batch_stats}, batch["a"], batch["b"], train=False
                )
                return clip_per_row_loss(out["za"], out["zb"], out["temperature"])

            small, big = squared_gradient_norms(per_row_loss, state.params, devices)
            records.append({"step": step, "small_sq_norm": small, "big_sq_norm": big})
            b_simple = running_estimates(records, n // devices, n)[-1]
            log(f"step {step}: |G_small|^2 {small:.4g} |G_big|^2 {big:.4g} -> B_simple {b_simple:,.0f}")
        state, _ = step_fn(state, batch)
    b_simple = running_estimates(records, n // devices, n)
    for record, value in zip(records, b_simple):
        record["b_simple_running"] = value
    return {
        "global_batch_size": n,
        "small_batch_size": n // devices,
        "devices": devices,
        "loss": config.loss.name,
        "records": records,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="a config under configs/ (default: default)")
    parser.add_argument("--steps", type=int, help="training steps")
    parser.add_argument("--every", type=int, help="measure every k steps")
    parser.add_argument("--batch-size", type=int, help="global batch N")
    parser.add_argument("--out", type=Path, help="output folder")
    parser.add_argument("--data-dir", help="TFDS data directory (default: TFDS's)")
    parser.add_argument("--quick", action="store_true", help="a few steps (CI)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    name = args.config or defaults["config"]
    out = args.out or (sweep.QUICK_RESULTS if args.quick else sweep.RESULTS) / "gradient_noise_scale" / name
    config = sweep.load_config(name)
    config.train.num_train_steps = args.steps or defaults["steps"]
    config.train.global_batch_size = args.batch_size or defaults["batch_size"]
    config.data.data_dir = args.data_dir
    result = measure(config, every=args.every or defaults["every"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "noise_scale.json").write_text(json.dumps(result, indent=2))
    figure, ax = sweep.new_figure(f"gradient noise scale, {name}, N = {result['global_batch_size']:,}")
    ax.plot([r["step"] for r in result["records"]], [r["b_simple_running"] for r in result["records"]], marker=".")
    ax.set(xlabel="step", ylabel="B_simple (running means)", yscale="log")
    sweep.save({"noise_scale": figure}, out)
    print(
        f"B_simple {result['records'][-1]['b_simple_running']:,.0f} at step {result['records'][-1]['step']}; "
        f"wrote {out}"
    )


if __name__ == "__main__":
    main()
