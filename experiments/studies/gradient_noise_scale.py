"""The gradient noise scale along a training run: ``B_simple`` vs step.

The estimator and the per-device measurement are `contrastive_jax.training.noise_scale` (McCandlish
et al. 2018, Appendix A; each device's share of the global loss's gradient, so the small
batches still see the global negatives). This tool trains a config with
``config.train.log_noise_scale`` on (the library's own train step, no extra pass) and
turns the logged squared norms into ``B_simple`` from their running means over the run
(McCandlish: average the norms over many steps, then take the ratio).

Run (from the repository root):
  .venv/bin/python -m experiments.studies.gradient_noise_scale                 # digits, CLIP
  .venv/bin/python -m experiments.studies.gradient_noise_scale --config cmudict_clip --steps 300
  .venv/bin/python -m experiments.studies.gradient_noise_scale --quick         # CI: a few steps

Writes ``noise_scale.json`` (the logged norms and the running ``B_simple``) and
``noise_scale.png`` (``B_simple`` vs step) to ``--out``; the training run's workdir is
``<out>/run``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contrastive_jax import run_dir
from contrastive_jax.config_lib import load_config
from contrastive_jax.simulated_devices import simulate_cpu_devices
from contrastive_jax.training import noise_scale
from experiments.lib import sweep

QUICK = dict(config="default", steps=6, every=2, batch_size=64)
FULL = dict(config="default", steps=1000, every=25, batch_size=256)


def running_estimates(records: Sequence[dict], b_small: int, b_big: int) -> list[float]:
    """``B_simple`` after each record, from the norms' running means."""
    out = []
    for k in range(1, len(records) + 1):
        small = np.mean([r["small_sq_norm"] for r in records[:k]])
        big = np.mean([r["big_sq_norm"] for r in records[:k]])
        out.append(noise_scale.estimate(small, big, b_small, b_big).b_simple)
    return out


def noise_records(workdir: Path) -> list[dict]:
    """The logged squared norms of a run with ``train.log_noise_scale``: one record per
    logging step (each the mean over its window)."""
    return [
        {
            "step": step,
            "small_sq_norm": values[f"train/{noise_scale.SMALL_KEY}"],
            "big_sq_norm": values[f"train/{noise_scale.BIG_KEY}"],
        }
        for step, values in run_dir.metrics_by_step(workdir).items()
        if f"train/{noise_scale.SMALL_KEY}" in values
    ]


def measure(config, workdir: Path, *, every: int) -> dict:
    """Trains ``config`` in ``workdir`` logging the norms every ``every`` steps."""
    simulate_cpu_devices(config.num_simulated_devices)
    import jax

    from contrastive_jax.training import run_plan

    config.train.log_noise_scale = True
    config.train.log_every_steps = every
    started = time.perf_counter()
    run_plan.train_and_evaluate(config, str(workdir))
    devices, n = jax.device_count(), config.train.global_batch_size
    records = noise_records(workdir)
    for record, value in zip(records, running_estimates(records, n // devices, n)):
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
    config = load_config(name)
    config.train.num_train_steps = args.steps or defaults["steps"]
    config.train.global_batch_size = args.batch_size or defaults["batch_size"]
    config.data.data_dir = args.data_dir
    out.mkdir(parents=True, exist_ok=True)
    result = measure(config, out / "run", every=args.every or defaults["every"])
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
