"""How the global batch (the number of negatives) changes what a contrastive model learns.

Run (from the repository root):
  python -m experiments.batch_size_sweep                 # digits: full sweep, results committed
  python -m experiments.batch_size_sweep --quick         # CI: 2 batch sizes, a few steps
  python -m experiments.batch_size_sweep --epochs 50     # fixed epochs instead of steps
  python -m experiments.batch_size_sweep --study cmudict           # the cmudict study (below)
  python -m experiments.batch_size_sweep --study cmudict --quick   # CI

The cmudict study (`configs/cmudict_clip.py`, 121,490 training pairs; `study_runs`):
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
  `log N` (at most `log N`: a batch of N can certify at most log N nats).

Resumable: rerun the same command; finished runs are skipped (see `experiments/sweep.py`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from contrastive_jax.config_lib import override
from experiments import sweep

FULL = dict(
    config="default", batch_sizes=[16, 32, 64, 128, 256, 512, 1024], seeds=[0, 1, 2], steps=500, metric="a_to_b/R@1"
)
QUICK = dict(config="default", batch_sizes=[16, 64], seeds=[0], steps=4, metric="a_to_b/R@1")
# The cmudict study: 5 batch sizes x 2 seeds x (3 LR rules at fixed epochs + 1 at fixed steps),
# only fixed epochs with sqrt at N = 65,536 (see ALL_SERIES_UP_TO): 34 runs; and the
# false-negative-masking series (fixed epochs, sqrt) at N <= MASKED_UP_TO: 8 more.
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

REFERENCE_BATCH = 256  # the learning-rate rules scale from N = 256
BASE_LEARNING_RATE = 1e-3  # AdamW's peak learning rate at N = 256
# learning rate at N = BASE_LEARNING_RATE * LR_SCALING[rule](N)
LR_SCALING = {
    "none": lambda n: 1.0,
    "linear": lambda n: n / REFERENCE_BATCH,
    "sqrt": lambda n: math.sqrt(n / REFERENCE_BATCH),
}
FIXED_STEPS_SCALING = "sqrt"  # the rule of the fixed-step runs
LAMB_FROM = 16384  # "linear" at N >= this trains with LAMB instead of AdamW
WARMUP_EPOCHS = 0.25  # linear warmup length in epochs, at every N
STREAM_ABOVE = 4096  # N above this: the loss streamed in tiles (chunk_size "auto")
# N above this: gradient caching in micro-batches of MICRO_BATCH. A whole step at
# N = 65,536 holds 10.5 GB here (36 s), so no N of the study needs it.
GRAD_CACHE_ABOVE = 65536
MICRO_BATCH = 8192
MASKED_UP_TO = 16384  # the false-negative-masking series stops here (time: see ALL_SERIES_UP_TO)
# A step at N = 65,536 takes 36 s on the 2-core machine (the N^2 loss; 214 s a 4-step run),
# so above ALL_SERIES_UP_TO only these (budget, rule) series run, to stay within 90 min.
ALL_SERIES_UP_TO = 16384
LARGEST_N_SERIES = (("epochs", "sqrt"),)


def make_runs(
    base,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    *,
    steps: int | None = None,
    epochs: float | None = None,
    train_size: int | None = None,
) -> list[sweep.Run]:
    """One run per (batch size, seed): `steps` steps, or `ceil(epochs * train_size / N)`."""
    runs = []
    for n in batch_sizes:
        num_steps = steps if epochs is None else math.ceil(epochs * train_size / n)
        for seed in seeds:
            runs.append(
                sweep.Run(
                    name=f"batch{n:05d}_seed{seed}",
                    tags={"batch_size": n, "seed": seed, "steps": num_steps},
                    overrides={
                        **sweep.run_overrides(num_steps=num_steps, seed=seed, warmup_steps=base.optim.warmup_steps),
                        "train.global_batch_size": n,
                    },
                )
            )
    return runs


def study_runs(
    base,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    *,
    epochs: float,
    steps: int,
    train_size: int,
    scalings: Sequence[str] = tuple(LR_SCALING),
    masked_loss: str | None = None,
) -> list[sweep.Run]:
    """The cmudict study's runs (see the module docstring), fixed epochs first.

    Args:
      masked_loss: a loss name in the trainer's registry that masks in-batch false
        negatives out of the softmax (`MASKED_LOSS`), or None: adds the series "fixed
        epochs, sqrt, false negatives masked" at N <= `MASKED_UP_TO`.

    Each run's tags: `series` (`"fixed epochs, sqrt"`, ...), `budget`, `scaling`,
    `optimizer`, `loss`, `batch_size`, `seed`, `steps`, `epochs` (examples seen /
    train_size) and `learning_rate`.
    """
    grid = [("epochs", rule, None) for rule in scalings] + [("steps", FIXED_STEPS_SCALING, None)]
    if masked_loss:
        grid.append(("epochs", FIXED_STEPS_SCALING, masked_loss))
    runs = []
    for budget, rule, loss in grid:
        for n in batch_sizes:
            if (loss and n > MASKED_UP_TO) or (n > ALL_SERIES_UP_TO and (budget, rule) not in LARGEST_N_SERIES):
                continue
            steps_per_epoch = train_size / n
            num_steps = math.ceil(epochs * steps_per_epoch) if budget == "epochs" else steps
            optimizer = "lamb" if rule == "linear" and n >= LAMB_FROM else base.optim.name
            learning_rate = BASE_LEARNING_RATE * LR_SCALING[rule](n)
            series = f"fixed {budget}, {rule}" + (" (LAMB)" if optimizer == "lamb" else "")
            series += ", false negatives masked" if loss else ""
            overrides = {
                **sweep.run_overrides(
                    num_steps=num_steps, seed=0, warmup_steps=max(1, round(WARMUP_EPOCHS * steps_per_epoch))
                ),
                "train.global_batch_size": n,
                "optim.learning_rate": learning_rate,
                "optim.name": optimizer,
                "loss.name": loss or base.loss.name,
            }
            if n > STREAM_ABOVE:
                overrides["loss.chunk_size"] = "auto"
            if n > GRAD_CACHE_ABOVE:
                overrides["train.micro_batch_size"] = MICRO_BATCH
            for seed in seeds:
                runs.append(
                    sweep.Run(
                        name=f"{budget}_{rule}_{optimizer}_{loss or base.loss.name}_batch{n:05d}_seed{seed}",
                        tags={
                            "series": series,
                            "budget": budget,
                            "scaling": rule,
                            "optimizer": optimizer,
                            "loss": loss or base.loss.name,
                            "batch_size": n,
                            "seed": seed,
                            "steps": num_steps,
                            "epochs": round(num_steps * n / train_size, 3),
                            "learning_rate": learning_rate,
                        },
                        overrides={**overrides, "seed": seed, "data.seed": seed},
                    )
                )
    return runs


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


def _series(records: Sequence[dict]) -> list:
    """The records' series, in first-seen order ([None] for a sweep without series)."""
    return list(dict.fromkeys(r.get("series") for r in records))


def plot(records: Sequence[dict], metric: str) -> dict:
    """The four figures (see the module docstring), by file name."""
    sizes = sorted({r["batch_size"] for r in records})
    figures = {}

    steps = sorted({r["steps"] for r in records})
    length = f"{steps[0]} steps" if len(steps) == 1 else f"fixed epochs: {steps[-1]} … {steps[0]} steps"
    series = _series(records)
    if series != [None]:
        length = "per series"
    fig, ax = sweep.new_figure(f"Final {metric} vs global batch size ({length})")
    for name in series:
        sweep.errorbar(ax, records, "batch_size", metric, where=lambda r, s=name: r.get("series") == s, label=name)
    sweep.log_spaced_ticks(ax, sizes)
    ax.set(xlabel="global batch size N", ylabel=metric)
    if series != [None]:
        ax.legend(fontsize=7)
    figures["metric_vs_batch"] = fig

    first = [r for r in records if r.get("series") == series[0]]
    title = "Training loss per batch size (mean over seeds)" + (f": {series[0]}" if series[0] else "")
    fig, ax = sweep.new_figure(title, width=6)
    first_sizes = sorted({r["batch_size"] for r in first})  # a series may skip the largest N
    for n, color in zip(first_sizes, sweep.colors(len(first_sizes))):
        steps, loss = sweep.mean_curve([r for r in first if r["batch_size"] == n], "train/loss")
        ax.plot(steps, loss, color=color, label=f"N={n}")
        ax.axhline(math.log(n), color=color, linestyle=":", linewidth=0.8)
    ax.set(xlabel="step", ylabel="CLIP loss (nats); dotted: log N", yscale="log")
    ax.legend(fontsize=7, ncol=2)
    figures["loss_curves"] = fig

    if all("train/temperature" in r for r in records):
        fig, ax = sweep.new_figure("Final learned temperature vs batch size")
        for name in series:
            sweep.errorbar(
                ax, records, "batch_size", "train/temperature", where=lambda r, s=name: r.get("series") == s, label=name
            )
        sweep.log_spaced_ticks(ax, sizes)
        if series != [None]:
            ax.legend(fontsize=7)
        ax.set(xlabel="global batch size N", ylabel="temperature T")
        figures["temperature_vs_batch"] = fig

    fig, ax = sweep.new_figure("InfoNCE mutual-information lower bound")
    bound = [
        dict(r, log_n=math.log(r["batch_size"]), bound=math.log(r["batch_size"]) - r["train/loss"]) for r in records
    ]
    for name in series:
        label = "log N − L (final training loss)" + (f": {name}" if name else "")
        sweep.errorbar(ax, bound, "log_n", "bound", where=lambda r, s=name: r.get("series") == s, label=label)
    log_n = np.log(sizes)
    ax.plot(log_n, log_n, "k--", linewidth=1, label="log N (the bound's ceiling)")
    ax.set(xlabel="log N (nats)", ylabel="I(a; b) ≥ (nats)")
    ax.legend(fontsize=7)
    figures["mi_bound"] = fig

    if all("false_negative_fraction" in r for r in records):
        fig, ax = sweep.new_figure("In-batch false negatives vs batch size")
        sweep.errorbar(ax, records, "batch_size", "false_negative_fraction")
        sweep.log_spaced_ticks(ax, sizes)
        ax.set(xlabel="global batch size N", ylabel="rows with a same-spelling / -pronunciation row")
        figures["false_negatives_vs_batch"] = fig
    return figures


def summary(records: Sequence[dict], metric: str) -> str:
    """A markdown table: per series and batch size, the metric, loss, temperature and MI
    bound (and the false-negative fraction and the other direction's R@1 when recorded)."""
    series = _series(records)
    extra = [k for k in ("b_to_a/R@1", "false_negative_fraction") if k != metric and all(k in r for r in records)]
    rows = []
    for name in series:
        for n in sorted({r["batch_size"] for r in records if r.get("series") == name}):
            group = [r for r in records if r["batch_size"] == n and r.get("series") == name]
            bound = [dict(r, bound=math.log(n) - r["train/loss"]) for r in group]
            rows.append(
                ([name] if name else [])
                + [
                    n,
                    group[0]["steps"],
                    len(group),
                    sweep.mean_std(group, metric),
                    *[sweep.mean_std(group, k) for k in extra],
                    sweep.mean_std(group, "train/loss"),
                    sweep.mean_std(group, "train/temperature"),
                    f"{math.log(n):.3f}",
                    sweep.mean_std(bound, "bound"),
                ]
            )
    header = (["series"] if series != [None] else []) + [
        "N",
        "steps",
        "seeds",
        metric,
        *extra,
        "final loss L",
        "temperature",
        "log N",
        "log N − L",
    ]
    return sweep.markdown_table(rows, header)


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
    base = override(sweep.load_config(config), {"data.data_dir": data_dir, **(overrides or {})})
    train_size = None
    if epochs is not None:
        from contrastive_jax import input_pipeline

        train_size = input_pipeline.num_examples(input_pipeline.load_split(base.data, base.data.train_split))
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
    from contrastive_jax import data_sources, input_pipeline

    base = override(sweep.load_config(config), {"data.data_dir": data_dir, **(overrides or {})})
    train = input_pipeline.load_split(base.data, base.data.train_split)
    groups = {key: train[key] for key in data_sources.SOURCES[base.data.name].id_keys}
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
