"""What the sweep drivers share: the run grid, resume/skip, result files, plot helpers.

A sweep is a list of `Run`s (a name, the config fields it overrides, the tags that
identify it in the results), trained one after another in this process with
`run_plan.train_and_evaluate`, each in its own workdir `<out>/runs/<name>/`:

* a run whose `eval_results.json` is there (for its number of steps) is skipped;
* an interrupted run resumes from its newest checkpoint (the trainer does this);
* a workdir holding a different run (other tags or overrides) is an error, not reused.

`run_sweep` runs the grid, then writes to `<out>`: `results.json` (every run's tags,
final metrics and curves from `metrics.jsonl`), `results.csv` (one row per run, no
curves), the driver's figures (PNG) and its markdown `summary.md`. `<out>/runs/` holds
the checkpoints and is git-ignored. Runs override fields with `config_lib.override`.

Run the drivers from the repository root, e.g. `python -m experiments.studies.batch_size_sweep`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.figure
import ml_collections
import numpy as np

from contrastive_jax import run_dir
from contrastive_jax.config_lib import override
from contrastive_jax.simulated_devices import simulate_cpu_devices
from experiments import REPO, RESULTS  # RESULTS: committed results, <sweep>/{*.csv,*.json,*.png}

QUICK_RESULTS = REPO / "runs" / "experiments"  # --quick results (git-ignored)
COMPILATION_CACHE = REPO / "runs" / "jax_cache"  # the runs' compiled programs (git-ignored)
LOG_POINTS = 40  # training scalars logged about this many times per run
CHECKPOINTS_PER_RUN = 4  # an interrupted run loses at most a quarter of its steps


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a sweep.

    Attributes:
      name: the workdir's name under `<out>/runs/` (unique within the sweep).
      tags: what identifies the run in the results (e.g. `{"batch_size": 64, "seed": 1}`).
      overrides: config fields to set, dotted name -> value (`"train.global_batch_size"`).
    """

    name: str
    tags: Mapping[str, Any]
    overrides: Mapping[str, Any]


def run_overrides(*, num_steps: int, seed: int, warmup_steps: int, evals: int = 1) -> dict[str, Any]:
    """The fields every sweep run sets: length, seeds, logging, evaluation, checkpoints.

    The warmup is capped at a fifth of the run; the model and the data order both use
    `seed`; evaluation runs `evals` times (the last at the end); checkpoints are written
    `CHECKPOINTS_PER_RUN` times, keeping only the newest.
    """
    return {
        "seed": seed,
        "data.seed": seed,
        "train.num_train_steps": num_steps,
        "train.log_every_steps": max(1, num_steps // LOG_POINTS),
        "optim.warmup_steps": min(warmup_steps, num_steps // 5),
        "eval.every_steps": 0 if evals <= 1 else max(1, num_steps // evals),
        "checkpoint.every_steps": max(1, num_steps // CHECKPOINTS_PER_RUN),
        "checkpoint.max_to_keep": 1,
    }


def is_complete(workdir: Path, config: ml_collections.ConfigDict) -> bool:
    """Whether `workdir` holds the final evaluation of a run of `config`'s length."""
    results = run_dir.read_eval_results(workdir)
    return results is not None and results["step"] == config.train.num_train_steps


def _run_spec(run: Run) -> str:
    """`run.json`'s text: the run's tags and overrides."""
    return json.dumps({"tags": dict(run.tags), "overrides": dict(run.overrides)}, indent=1, sort_keys=True)


def _check_run(workdir: Path, run: Run) -> None:
    """Raises if `workdir` holds a different run than `run` (writes nothing).

    `run.json` (its tags and overrides) is compared, not the whole config, so a field
    added to the configs later does not invalidate finished runs.
    """
    path = workdir / "run.json"
    if path.exists() and path.read_text() != _run_spec(run):
        raise ValueError(
            f"{workdir} holds a different run (see {path}); pass another --out, or delete the workdir to retrain it."
        )


def _write_run(workdir: Path, run: Run, config: ml_collections.ConfigDict) -> None:
    """Records the run in its workdir as it starts: `run.json` (`_check_run` compares it)
    and `config.json`, the full config the run started with."""
    path = workdir / "run.json"
    if not path.exists():
        workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(_run_spec(run))
        (workdir / "config.json").write_text(config.to_json_best_effort(sort_keys=True, indent=1))


def run_grid(
    base: ml_collections.ConfigDict,
    runs: Sequence[Run],
    out: Path,
    *,
    curve_keys: Iterable[str] = ("train/loss", "train/temperature"),
    log: Callable[[str], None] = print,
    deadline: float | None = None,
    stop_when: Callable[[Path], bool] | None = None,
) -> list[dict[str, Any]]:
    """Trains every run not finished yet, then collects all of them.

    A run is finished when its workdir holds its final evaluation, or when it trained
    nothing in its workdir (none there, or only its spec) and `out/results.json` (the
    committed results of an earlier invocation) holds a record of the same name and tags:
    a fresh clone resumes a sweep from its committed results (an interrupted run's
    workdir resumes from its checkpoint). A run the deadline leaves unstarted leaves no
    workdir.

    Args:
      base: the config the runs override.
      runs: the grid; run `r` trains in `out/runs/<r.name>`.
      curve_keys: `metrics.jsonl` scalars kept as curves (`[[step, value], ...]`).
      log: where progress lines go.
      deadline: a `time.monotonic()` after which no run starts (None: no limit); the
        runs not started have no record (the next invocation trains them).
      stop_when: `workdir -> bool`, e.g. "the validation target is reached": each run
        then trains in segments of its `checkpoint.every_steps` and stops after the first
        segment where it holds, its `train.num_train_steps` a cap (`train_until`).

    Returns:
      One record per finished run: `name`, its tags, the final evaluation's metrics, the
      last logged `train/loss` and `train/temperature`, and `curves`.
    """
    simulate_cpu_devices(base.num_simulated_devices)  # before `train_until` starts JAX
    curve_keys = tuple(curve_keys)
    committed = committed_records(out)
    records, durations = [], []
    for i, run in enumerate(runs, 1):
        config = override(base, run.overrides)
        workdir = out / "runs" / run.name
        label = f"[{i}/{len(runs)}] {run.name}"
        earlier = _committed_record(run, workdir, committed)
        if earlier is not None:
            log(f"{label}: finished earlier, read from {out / 'results.json'}")
            records.append(earlier)
            continue
        _check_run(workdir, run)
        if is_complete(workdir, config) or (stop_when and run_dir.read_eval_results(workdir) and stop_when(workdir)):
            log(f"{label}: finished earlier, skipped")
        elif deadline is not None and time.monotonic() > deadline:
            log(f"{label}: not started (the time budget is spent; run the command again to go on)")
            continue
        else:
            _write_run(workdir, run, config)
            resuming = " (resuming from its checkpoint)" if (workdir / "checkpoints").exists() else ""
            log(f"{label}: training {config.train.num_train_steps} steps{resuming}")
            start = time.perf_counter()
            train_until(config, workdir, stop_when)
            durations.append(time.perf_counter() - start)
            remaining = sum(
                _committed_record(r, out / "runs" / r.name, committed) is None
                and run_dir.read_eval_results(out / "runs" / r.name) is None
                for r in runs[i:]
            )
            log(
                f"{label}: done in {durations[-1]:.0f} s; about "
                f"{np.mean(durations) * remaining / 60:.1f} min left for {remaining} runs"
            )
        records.append(collect(run, workdir, curve_keys))
    return records


def use_compilation_cache(directory: Path = COMPILATION_CACHE) -> None:
    """JAX's persistent compilation cache in `directory`, every program kept, unless one
    is set already: a run stopped on a target trains in segments (`train_until`), each
    compiling the run's programs again (`negatives_vs_noise --quick`'s three plateau runs:
    62 -> 38 s). Not for --quick runs, which tests call: in a test process it would hold
    for every later test, and writing every program made the default test suite 1.5x
    slower (545 against 361 s, beside a study). Takes effect before the process's first
    compile."""
    import jax

    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(directory))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def train_until(config: ml_collections.ConfigDict, workdir: Path, stop_when: Callable[[Path], bool] | None) -> None:
    """`run_plan.train_and_evaluate(config, workdir)`; with `stop_when`, in segments of
    `config.checkpoint.every_steps` (each resumes the last; the final one ends at
    `config.train.num_train_steps`), stopping after the first segment where
    `stop_when(workdir)` holds.

    Raises:
      ValueError: `stop_when` with a schedule that depends on the run's length (a run
        stopped early must be the same run as one trained on).
    """
    from contrastive_jax.training import run_plan

    if stop_when is None:
        run_plan.train_and_evaluate(config, str(workdir))
        return
    if config.optim.schedule != "constant":
        raise ValueError(f"stop_when needs config.optim.schedule='constant', not {config.optim.schedule!r}.")
    results = run_dir.read_eval_results(workdir)
    done, cap = (results or {}).get("step", 0), config.train.num_train_steps
    while done < cap:
        done = min(cap, done + config.checkpoint.every_steps)
        run_plan.train_and_evaluate(override(config, {"train.num_train_steps": done}), str(workdir))
        if stop_when(workdir):
            return


def run_sweep(
    base: ml_collections.ConfigDict,
    runs: Sequence[Run],
    out: Path,
    *,
    figures: Callable[[list[dict[str, Any]]], Mapping[str, matplotlib.figure.Figure]],
    summary: Callable[[list[dict[str, Any]]], str],
    curve_keys: Iterable[str] = ("train/loss", "train/temperature"),
) -> list[dict[str, Any]]:
    """`run_grid`, then writes `results.{csv,json}`, the `figures` (PNG) and `summary.md` to `out`."""
    records = run_grid(base, runs, out, curve_keys=curve_keys)
    write_results(records, out)
    save(figures(records), out)
    (out / "summary.md").write_text(summary(records))
    return records


def collect(run: Run, workdir: Path, curve_keys: Sequence[str]) -> dict[str, Any]:
    """The record of a finished run (see `run_grid`)."""
    final = run_dir.read_eval_results(workdir)
    final.pop("step")
    history = run_dir.metrics_by_step(workdir)
    last_train = next((values for values in reversed(history.values()) if "train/loss" in values), {})
    return {
        "name": run.name,
        **run.tags,
        **final,
        **{k: last_train[k] for k in ("train/loss", "train/temperature") if k in last_train},
        "curves": {
            key: [[step, values[key]] for step, values in history.items() if key in values] for key in curve_keys
        },
    }


def committed_records(out: Path) -> dict[str, dict[str, Any]]:
    """The records in `out/results.json` by run name (none when it does not exist)."""
    path = out / "results.json"
    return {record["name"]: record for record in json.loads(path.read_text())} if path.exists() else {}


def _committed_record(run: Run, workdir: Path, committed: Mapping[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The committed record that stands in for `run`: one of its name and tags, when the
    run trained nothing in `workdir` (`_trained`: an interrupted workdir resumes
    instead); else None."""
    earlier = committed.get(run.name)
    if _trained(workdir) or earlier is None or any(earlier.get(k) != v for k, v in run.tags.items()):
        return None
    return earlier


def _trained(workdir: Path) -> bool:
    """Whether a run trained in `workdir`: it holds a checkpoint, a logged step or an
    evaluation (a workdir with only the run's spec trained nothing: a run killed before
    its first step, or one an earlier version of `run_grid` recorded and then left
    unstarted at its deadline)."""
    return any((workdir / name).exists() for name in (run_dir.CHECKPOINTS, run_dir.METRICS, run_dir.EVAL_RESULTS))


def write_merged(records: Iterable[Mapping[str, Any]], out: Path) -> list[dict[str, Any]]:
    """`write_results` of `records` over the committed records of the same names in `out`
    (`committed_records`; those of runs not visited kept), between a study's stages or
    at its end (a kill loses no finished run's record); nothing written when both are
    empty. Returns the records written."""
    merged = list((committed_records(out) | {r["name"]: r for r in records}).values())
    if merged:
        write_results(merged, out)
    return merged


def write_results(records: Sequence[Mapping[str, Any]], out: Path) -> None:
    """`out/results.json` (everything) and `out/results.csv` (one row per run, no curves)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(list(records), indent=1, sort_keys=False))
    columns = list(dict.fromkeys(k for r in records for k in r if k != "curves"))
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({k: r.get(k) for k in columns} for r in records)


def summarize(
    records: Sequence[Mapping[str, Any]], by: str, metric: str, where: Callable[[Mapping], bool] = lambda r: True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(x, mean, std)` of `metric` over the records (seeds) sharing each value of `by`.

    `std` is the sample standard deviation (0 for a single seed); `x` is sorted.
    """
    groups: dict[Any, list[float]] = {}
    for r in records:
        if where(r):
            groups.setdefault(r[by], []).append(r[metric])
    xs = sorted(groups)
    values = [np.asarray(groups[x], dtype=float) for x in xs]
    return (
        np.asarray(xs),
        np.asarray([v.mean() for v in values]),
        np.asarray([v.std(ddof=1) if len(v) > 1 else 0.0 for v in values]),
    )


def mean_curve(records: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    """`(steps, mean over the records)` of curve `key`, on the steps all records logged."""
    curves = [dict(map(tuple, r["curves"][key])) for r in records]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return np.asarray(steps), np.asarray([np.mean([c[s] for c in curves]) for s in steps])


def new_figure(title: str, *, ncols: int = 1, width: float = 5.0) -> tuple[matplotlib.figure.Figure, Any]:
    """A figure (no pyplot, so no display is needed) with `ncols` axes and a title."""
    fig = matplotlib.figure.Figure(figsize=(width * ncols, 3.8), layout="constrained")
    axes = fig.subplots(1, ncols)
    fig.suptitle(title)
    return fig, axes


def errorbar(ax, records: Sequence[Mapping[str, Any]], by: str, metric: str, **kwargs) -> None:
    """Plots the mean of `metric` against `by` with seed standard-deviation error bars."""
    x, mean, std = summarize(records, by, metric, kwargs.pop("where", lambda r: True))
    ax.errorbar(x, mean, yerr=std, capsize=3, **{"marker": "o", **kwargs})


def colors(n: int, name: str = "viridis") -> list:
    """`n` colours spread over the matplotlib colormap `name`."""
    return [matplotlib.colormaps[name](i / max(n - 1, 1)) for i in range(n)]


def save(figures: Mapping[str, matplotlib.figure.Figure], out: Path) -> list[Path]:
    """Writes each figure to `out/<name>.png` (dpi 110); returns the paths."""
    paths = []
    for name, fig in figures.items():
        paths.append(out / f"{name}.png")
        fig.savefig(paths[-1], dpi=110)
    return paths


def markdown_table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A GitHub markdown table; floats with 3 decimals."""
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def mean_std(records: Sequence[Mapping[str, Any]], metric: str) -> str:
    """`"mean ± std"` of `metric` over `records` (3 decimals)."""
    values = np.asarray([r[metric] for r in records], dtype=float)
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.3f} ± {std:.3f}"


def argument_parser(description: str) -> argparse.ArgumentParser:
    """The options every driver has: --quick, --out, --seeds, --steps, --data-dir."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="tiny grid and a few steps (CI); results under runs/experiments/"
    )
    parser.add_argument("--out", type=Path, help="results folder (default: experiments/results/<sweep>)")
    parser.add_argument("--seeds", type=int_list, help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--steps", type=int, help="optimizer steps per run")
    parser.add_argument("--data-dir", help="TFDS data directory (default: TFDS's)")
    return parser


def add_hours_option(parser: argparse.ArgumentParser) -> None:
    """--hours, for a driver that passes `deadline(args.hours)` to `run_grid`."""
    parser.add_argument(
        "--hours", type=float, help="start no run after this many hours; report what finished (rerun to go on)"
    )


def deadline(hours: float | None) -> float | None:
    """`run_grid`'s `deadline` for a budget of `hours` from now (None: no limit)."""
    return None if hours is None else time.monotonic() + 3600 * hours


def int_list(text: str) -> list[int]:
    """Parses `"16,32,64"` (`""`: none)."""
    return [int(v) for v in text.split(",") if v]


def float_list(text: str) -> list[float]:
    """Parses `"0.05,0.1,1"`."""
    return [float(v) for v in text.split(",")]


def resolve(
    args: argparse.Namespace, sweep_name: str, full: Mapping[str, Any], quick: Mapping[str, Any]
) -> argparse.Namespace:
    """Fills the options left unset from the driver's `full` or `quick` preset, and --out."""
    preset = quick if args.quick else full
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = (QUICK_RESULTS if args.quick else RESULTS) / sweep_name
    if not args.quick:  # a study's long runs (--quick's compile each program once or twice: writing costs more)
        use_compilation_cache()
    return args


def log_spaced_ticks(ax, values: Sequence[float]) -> None:
    """Log-2 x axis labelled with the swept values themselves."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(values), [f"{v:g}" for v in values])
    ax.minorticks_off()
