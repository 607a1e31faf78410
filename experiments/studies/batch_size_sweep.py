"""How the global batch (the number of negatives) changes what a contrastive model learns.

Run (from the repository root):
  python -m experiments.studies.batch_size_sweep                 # digits: full sweep, results committed
  python -m experiments.studies.batch_size_sweep --quick         # CI: 2 batch sizes, a few steps
  python -m experiments.studies.batch_size_sweep --epochs 50     # fixed epochs instead of steps
  python -m experiments.studies.batch_size_sweep --study cmudict           # the cmudict study (below)
  python -m experiments.studies.batch_size_sweep --study cmudict --quick   # CI

The cmudict study (`configs/cmudict_clip.py`, 121,490 training pairs; `study_runs` and
the constants named below are in `experiments/studies/batch_size_sweep_grid.py`):
N = 256 ... 65,536 (the loss streamed in tiles above `STREAM_ABOVE`; gradient caching
in micro-batches of `MICRO_BATCH` only above `GRAD_CACHE_ABOVE`), each seed, two budgets:

* fixed epochs (`--epochs`), with each learning-rate rule of `LR_SCALING`: `none`
  (`BASE_LEARNING_RATE` at every N), `linear` (x N / 256), `sqrt` (x sqrt(N / 256));
  `linear` at N >= `LAMB_FROM` uses LAMB (You et al. 2020) instead of AdamW, the
  large-batch recipe (SimCLR uses LARS with linear scaling);
* fixed steps (`--steps`), with `sqrt` scaling;

above N = `ALL_SERIES_UP_TO` (16,384) only the fixed-epoch `sqrt` runs (a step at
N = 65,536 takes 36 s on 2 CPU cores); the false-negative-masking series (`MASKED_LOSS`,
fixed epochs, `sqrt`) runs up to `MASKED_UP_TO`; the warmup is `WARMUP_EPOCHS` of an
epoch at every N (at most a fifth of the run). It
also reports the in-batch false-negative fraction per N (`false_negative_fraction`: rows
whose batch holds another pair with the same spelling or pronunciation). Its records and
figures are grouped in series (`"fixed epochs, sqrt"`, ...), one line each.

Trains `--config` (default: CLIP on the digits' top / bottom halves, learned temperature)
at each global batch size N, for a fixed number of steps (or epochs) and several seeds,
data parallel over all devices (8 simulated CPU devices on a CPU-only machine: the loss
all-gathers the embeddings, so every row sees all N - 1 negatives). The learning rate is
the config's at every N. Writes to `--out`: `results.{csv,json}`, `summary.md` and

* `metric_vs_batch.png`: the final retrieval metric (`--metric`) vs N, seed error bars;
* `loss_curves.png`: the training loss per N (mean over seeds), with `log N` for scale;
* `temperature_vs_batch.png`: the final learned temperature vs N;
* `mi_bound.png`: the InfoNCE bound on the mutual information, `I >= log N - L`, against
  `log N` (at most `log N`: a batch of N can certify at most log N nats);
* `false_negatives_vs_batch.png` (the cmudict study): the in-batch false-negative fraction vs N.

The figures and `summary.md` are drawn by `experiments/studies/batch_size_sweep_report.py`.
Resumable: rerun the same command; finished runs are skipped (see `experiments/lib/sweep.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from contrastive_jax.config_lib import load_config, override
from experiments.lib import sweep
from experiments.studies.batch_size_sweep_grid import make_runs, study_runs
from experiments.studies.batch_size_sweep_report import plot, summary

FULL = dict(
    config="default", batch_sizes=[16, 32, 64, 128, 256, 512, 1024], seeds=[0, 1, 2], steps=500, metric="a_to_b/R@1"
)
QUICK = dict(config="default", batch_sizes=[16, 64], seeds=[0], steps=4, metric="a_to_b/R@1")
# The cmudict study: 5 batch sizes x 2 seeds x (3 LR rules at fixed epochs + 1 at fixed steps),
# only fixed epochs with sqrt at N = 65,536 (see batch_size_sweep_grid.ALL_SERIES_UP_TO): 34
# runs; and the false-negative-masking series (fixed epochs, sqrt) at N <= MASKED_UP_TO: 8 more.
MASKED_LOSS = "clip_masking_false_negatives"  # the registry's CLIP loss masking them
CMUDICT = dict(
    config="cmudict_clip",
    batch_sizes=[256, 1024, 4096, 16384, 65536],
    seeds=[0, 1],
    steps=30,
    epochs=2.0,
    metric="a_to_b/R@1",
    masked_loss=MASKED_LOSS,
)
CMUDICT_QUICK = dict(
    config="cmudict_clip",
    batch_sizes=[256, 512],
    seeds=[0],
    steps=2,
    epochs=0.25,
    metric="a_to_b/R@1",
    masked_loss=MASKED_LOSS,
)
# --quick on cmudict: small slices of the splits, so CI loads and evaluates fast.
CMUDICT_QUICK_OVERRIDES = {"data.train_split": "train[:2048]", "eval.split": "test[:1024]"}


def false_negative_fraction(
    groups: Mapping[str, np.ndarray], batch_size: int, *, num_batches: int = 8, seed: int = 0
) -> float:
    """The mean fraction of rows whose batch holds another row sharing one of its ids.

    Args:
      groups: id arrays [n] (e.g. `word_id`, `pronunciation_id`): rows i and j are false
        negatives of each other when any id is equal.
      batch_size: N <= n; each batch is N distinct rows drawn uniformly, as the pipeline
        draws them (a uniform permutation per epoch).
      num_batches: batches averaged.
    """
    rng = np.random.default_rng(seed)
    n = len(next(iter(groups.values())))
    fractions = []
    for _ in range(num_batches):
        rows = rng.choice(n, size=batch_size, replace=False)
        shared = np.zeros(batch_size, bool)
        for ids in groups.values():
            _, inverse, counts = np.unique(ids[rows], return_inverse=True, return_counts=True)
            shared |= counts[inverse] > 1
        fractions.append(shared.mean())
    return float(np.mean(fractions))


def run(
    config: str,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    out: Path,
    *,
    steps: int | None = None,
    epochs: float | None = None,
    metric: str = "a_to_b/R@1",
    data_dir: str | None = None,
    overrides: dict | None = None,
) -> list[dict]:
    """Runs (or resumes) the sweep and writes its results, figures and summary to `out`.

    Args:
      config: a name in `configs/`.
      steps / epochs: exactly one: the length of every run.
      overrides: extra config fields for every run (e.g. `{"eval.linear_probe": False}`).

    Returns:
      The run records (see `sweep.run_grid`).
    """
    if (steps is None) == (epochs is None):
        raise ValueError("give exactly one of steps and epochs")
    base = override(load_config(config), {"data.data_dir": data_dir, **(overrides or {})})
    train_size = None
    if epochs is not None:
        from contrastive_jax.data import input_pipeline
        from contrastive_jax.training.run_plan import data_settings

        data = data_settings(base)
        train_size = input_pipeline.train_split_size(data)
    runs = make_runs(base, batch_sizes, seeds, steps=steps, epochs=epochs, train_size=train_size)
    return sweep.run_sweep(base, runs, out, figures=lambda r: plot(r, metric), summary=lambda r: summary(r, metric))


def run_study(
    config: str,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    out: Path,
    *,
    steps: int,
    epochs: float,
    metric: str = "a_to_b/R@1",
    data_dir: str | None = None,
    overrides: dict | None = None,
    masked_loss: str | None = None,
) -> list[dict]:
    """Runs (or resumes) the cmudict study (`study_runs`) and writes its results to `out`.

    Every record also gets its N's `false_negative_fraction` (`false_negative_fraction`
    over the training split's `word_id` and `pronunciation_id`).
    """
    from contrastive_jax.data import input_pipeline, settings
    from contrastive_jax.training.run_plan import data_settings

    base = override(load_config(config), {"data.data_dir": data_dir, **(overrides or {})})
    data = data_settings(base)
    train = input_pipeline.eval_arrays(data, data.train_split)
    groups = {key: train[key] for key in settings.open_metadata(data).id_keys}
    runs = study_runs(
        base,
        batch_sizes,
        seeds,
        epochs=epochs,
        steps=steps,
        train_size=input_pipeline.num_examples(train),
        masked_loss=masked_loss,
    )
    fractions = {n: false_negative_fraction(groups, n) for n in batch_sizes}

    def with_fractions(records):
        return [dict(r, false_negative_fraction=fractions[r["batch_size"]]) for r in records]

    records = sweep.run_sweep(
        base,
        runs,
        out,
        figures=lambda r: plot(with_fractions(r), metric),
        summary=lambda r: summary(with_fractions(r), metric),
    )
    records = with_fractions(records)
    sweep.write_results(records, out)
    return records


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring and `--help`."""
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    parser.add_argument("--config", help="a name in configs/ (default: default)")
    parser.add_argument("--batch-sizes", type=sweep.int_list, help="comma-separated global batch sizes")
    parser.add_argument("--epochs", type=float, help="fixed epochs per run instead of fixed --steps")
    parser.add_argument("--metric", help="the evaluation metric plotted against N")
    parser.add_argument(
        "--study",
        choices=("digits", "cmudict"),
        default="digits",
        help="digits: one budget (--steps or --epochs); cmudict: the study above",
    )
    parser.add_argument(
        "--masked-loss",
        help="cmudict: the trainer's loss name that masks in-batch false "
        f"negatives, for the series with it (default {MASKED_LOSS}; 'none': no such series)",
    )
    args = parser.parse_args(argv)
    if args.study == "cmudict":
        args = sweep.resolve(args, "batch_size_sweep_cmudict", CMUDICT, CMUDICT_QUICK)
        run_study(
            args.config,
            args.batch_sizes,
            args.seeds,
            args.out,
            steps=args.steps,
            epochs=args.epochs,
            metric=args.metric,
            data_dir=args.data_dir,
            overrides=CMUDICT_QUICK_OVERRIDES if args.quick else None,
            masked_loss=None if args.masked_loss == "none" else args.masked_loss,
        )
    else:
        args = sweep.resolve(args, "batch_size_sweep", FULL, QUICK)
        quick = {"eval.linear_probe": False} if args.quick else {}
        run(
            args.config,
            args.batch_sizes,
            args.seeds,
            args.out,
            steps=None if args.epochs else args.steps,
            epochs=args.epochs,
            metric=args.metric,
            data_dir=args.data_dir,
            overrides=quick,
        )
    print(f"results in {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
