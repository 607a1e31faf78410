"""The plateau of a constant-rate study's settings: what each reaches, not how fast
(`negatives_vs_noise`'s plateau stage: the plain loss against fixed K over the same N).

Under a constant rate a run does not settle: the plain loss at N = 512, at its tuned rate,
still rose from validation R@1 0.882 (epochs 4-6) to 0.901 (epochs 32-40), one seed
(`experiments/results/negatives_vs_noise/plateau/constant_rate_n512.txt`), so a stop on
patience never came. The plateau is therefore measured as the field measures final quality:
each setting trains for the same budget of `EPOCHS` epochs with its tuned rate
(`tuned_steps`: the committed constant-rate runs' best at the highest target; where none
ran, the square-root rule's first step) as the peak of a cosine decay to 0 after the
protocol's warmup, validated every `EVAL_SPACING` x the constant-rate cadence, a checkpoint
every `SEGMENT_EVALS` evaluations. The test split is read at two checkpoints of each run
(`checkpoint_steps`): the best (the checkpointed evaluation with the highest validation
R@1: early stopping on validation) and the last. Whether the budget is past every N's
plateau is checked by `CHECK_FACTOR` x the budget at the smallest and the largest N
(the reference arm, the first seed): what the longer run adds.

The report (`summary`): per arm and setting the runs, the epochs to the best checkpoint,
and the best validation and the test R@1 at the best and the last checkpoint (the mean of
both directions; mean ± 95% t over the seeds); the arms' difference at each setting and
each arm's largest setting less its smallest, with a 95% interval over the seeds and the
test queries together (`query_hits.seeds_and_queries`); the budget check's differences
over the test queries (`intervals.paired_bootstrap`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments.lib import constant_rate, intervals, query_hits, sweep, target_steps
from experiments.lib.rate_grid import rate_step_of

EPOCHS = 48.0  # the budget of every run, in epochs of the training split (24 fell short at N = 512: the page)
CHECK_FACTOR = 2  # the budget check's runs train this many times longer
EVAL_SPACING = 2  # validation this many times further apart than the constant-rate runs'
SEGMENT_EVALS = 2  # a checkpoint every this many evaluations: the best's test is read there
CHECKPOINTS = ("best", "final")


def tuned_steps(
    records: Sequence[Mapping[str, Any]], settings: Sequence[int], target: float, first_step: Callable[[int], int]
) -> dict[int, tuple[int, bool]]:
    """`{setting: (rate step, tuned)}`: each setting's best rate at `target` among the
    committed `records` of its arm (`constant_rate.best_by_n`; tuned True), else
    `first_step(setting)` (tuned False: no run reached it)."""
    best = constant_rate.best_by_n(records, target)
    return {s: (rate_step_of(best[s]["lr_factor"]), True) if s in best else (first_step(s), False) for s in settings}


def checkpoint_steps(record: Mapping[str, Any]) -> dict[str, int]:
    """`{"best": step, "final": step}` of a plateau run's `record`: the checkpointed
    evaluation (a multiple of its tag `checkpoint_every`, or the last) with the highest
    validation R@1 (`target_steps.validation_curve`; the earliest on a tie), and the last."""
    curve = target_steps.validation_curve(record)
    last = int(curve[-1, 0])
    saved = [i for i, step in enumerate(curve[:, 0]) if step % record["checkpoint_every"] == 0 or step == last]
    best = max(saved, key=lambda i: (curve[i, 1], -i))
    return {"best": int(curve[best, 0]), "final": last}


def hit_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """`query_hits.cached_hits`' names of every record's `checkpoint_steps`: `<run>@<step>`."""
    return [f"{r['name']}@{step}" for r in records for step in checkpoint_steps(r).values()]


def _scores(record: Mapping[str, Any], hits: Mapping[str, Mapping], which: str) -> np.ndarray:
    """[Q] the run's per-query test score (`query_hits.query_scores`) at checkpoint `which`."""
    return query_hits.query_scores(hits[f"{record['name']}@{checkpoint_steps(record)[which]}"])


def _row(label: str, setting: int, runs, hits, train_size: int) -> list:
    """One table row: `runs` (one arm's records at `setting`, every one with hits; their
    rate step, marked where no run of the arm had tuned it: tag `tuned`)."""
    n = runs[0]["batch_size"]
    rate = ", ".join(str(k) for k in sorted({r["rate_step"] for r in runs}))
    tests = {w: [float(_scores(r, hits, w).mean()) for r in runs] for w in CHECKPOINTS}
    return [
        label, f"{setting:,}", rate + ("" if all(r["tuned"] for r in runs) else " (untuned)"), len(runs),
        f"{np.mean([checkpoint_steps(r)['best'] * n / train_size for r in runs]):.1f}",
        intervals.mean_and_interval([float(target_steps.validation_curve(r)[:, 1].max()) for r in runs], decimals=3),
        intervals.mean_and_interval(tests["best"], decimals=3), intervals.mean_and_interval(tests["final"], decimals=3),
    ]  # fmt: skip


def _difference(x, y, hits, which: str) -> str:
    """`x` less `y` (records, one per seed) in test R@1 at checkpoint `which`, 95% over the
    seeds and the queries, with its verdict."""
    difference = query_hits.seeds_and_queries(
        [_scores(r, hits, which) for r in x], [_scores(r, hits, which) for r in y]
    )
    return f"{intervals.difference_cell(*difference)}, {intervals.verdict(*difference[1:])}"


def _has_hits(record: Mapping[str, Any], hits: Mapping[str, Mapping]) -> bool:
    """Whether both of the run's `checkpoint_steps` have test hits."""
    return all(f"{record['name']}@{step}" in hits for step in checkpoint_steps(record).values())


def budget_check(
    checks: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]], hits: Mapping[str, Mapping]
) -> str:
    """The budget check's table: each longer run of `checks` less the budget's run of the
    same arm, N and seed among `runs`, in test R@1 at the best and the last checkpoint
    (95% paired bootstrap over the test queries; one seed)."""
    budget = {(r["arm"], r["batch_size"], r["seed"]): r for r in runs if _has_hits(r, hits)}
    rows = []
    for check in sorted((c for c in checks if _has_hits(c, hits)), key=lambda c: c["batch_size"]):
        against = budget.get((check["arm"], check["batch_size"], check["seed"]))
        if against is None:
            continue
        cells = []
        for which in CHECKPOINTS:
            difference = intervals.paired_bootstrap(_scores(check, hits, which), _scores(against, hits, which))
            cells.append(f"{intervals.difference_cell(*difference)}, {intervals.verdict(*difference[1:])}")
        label = f"{check['arm']}, N = {check['batch_size']:,}, seed {check['seed']}"
        rows.append([label, f"{check['epochs']:g} − {against['epochs']:g}", *cells])
    if not rows:
        return ""
    return (
        "\nThe budget check: a longer run less the budget's, same arm, N and seed (95% paired bootstrap over the "
        "test queries); resolved and positive: the budget stopped short of that N's plateau.\n\n"
        + sweep.markdown_table(rows, ["run", "epochs", "test R@1 at best", "test R@1 final"])
    )


def summary(
    by_arm: Mapping[str, Sequence[Mapping[str, Any]]],
    checks: Sequence[Mapping[str, Any]],
    hits: Mapping[str, Mapping],
    train_size: int,
    *,
    shared: Sequence[int],
    epochs: float,
) -> str:
    """The plateau's report (the module docstring): `by_arm` `{arm: records}` at the budget
    of `epochs` (two arms, the first the reference, whose records at the settings `shared`
    stand for both: there the second arm's loss is the first's; tags `arm`, `rate_step`,
    `tuned`, `epochs`, `checkpoint_every`), the budget check's longer runs `checks`, and
    the test `hits` (`query_hits.cached_hits` of `hit_names`)."""
    ready = {arm: [r for r in records if _has_hits(r, hits)] for arm, records in by_arm.items()}
    text = f"\n## The plateau: each N at its tuned rate, decayed over {epochs:g} epochs\n\n"
    if not any(ready.values()):
        return text + "No run finished yet.\n"
    groups = {arm: _by_setting(records) for arm, records in ready.items()}
    reference, other = groups
    shared = [s for s in shared if s in groups[reference]]
    rows = [_row(arm, s, runs, hits, train_size) for arm, by in groups.items() for s, runs in by.items()]
    header = ["arm", "N", "rate step k", "runs", "epochs to best", "best validation R@1", "test R@1 at best",
              "test R@1 final"]  # fmt: skip
    text += (
        "Test R@1: the mean of both directions, mean ± 95% t over the seeds; at best: the checkpoint with the "
        "highest validation R@1.\n\n" + sweep.markdown_table(rows, header)
    )
    if shared:
        text += f"\nAt N = {', '.join(f'{s:,}' for s in shared)} the {reference} runs stand for both arms.\n"
    rows = []
    for setting in sorted(set(groups[reference]) & set(groups[other])):
        x, y = groups[reference][setting], groups[other][setting]
        rows.append([f"{reference} − {other}, N = {setting:,}", *(_difference(x, y, hits, w) for w in CHECKPOINTS)])
    for arm, by in groups.items():
        whole = {**{s: groups[reference][s] for s in shared}, **by}
        if len(whole) > 1:
            small, large = min(whole), max(whole)
            rows.append([f"{arm}: N = {large:,} − {small:,}",
                         *(_difference(whole[large], whole[small], hits, w) for w in CHECKPOINTS)])  # fmt: skip
    if rows:
        text += (
            "\nDifferences of test R@1, 95% over the seeds (Welch) and the test queries (paired bootstrap) "
            "together:\n\n" + sweep.markdown_table(rows, ["comparison", "at best", "final"])
        )
    return text + budget_check(checks, [r for records in ready.values() for r in records], hits)


def _by_setting(records: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    """`{N: records}` in increasing N, each list by seed."""
    by: dict[int, list] = {}
    for record in sorted(records, key=lambda r: (r["batch_size"], r["seed"])):
        by.setdefault(record["batch_size"], []).append(record)
    return by
