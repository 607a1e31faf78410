"""The plateau of a constant-rate study's settings: what each reaches, not how fast
(`negatives_vs_noise`'s plateau stage: the plain loss against fixed K over the same N).

Under a constant rate a run does not settle: the plain loss at N = 512, at its tuned rate,
still rose from validation R@1 0.882 (epochs 4-6) to 0.901 (epochs 32-40), one seed
(`experiments/results/negatives_vs_noise/plateau/constant_rate_n512.txt`), so a stop on
patience never came. So each setting trains, as the field measures final quality, for a
budget of epochs with its tuned rate (`tuned_steps`: the committed constant-rate runs'
best at the highest target; where none ran, the square-root rule's first step) as the
peak of a cosine decay to 0 after the protocol's warmup, validated every `EVAL_SPACING` x
the constant-rate cadence, a checkpoint every `SEGMENT_EVALS` evaluations. The test split
is read at two checkpoints of each run (`checkpoint_steps`): the best (the checkpointed
evaluation with the highest validation R@1: early stopping on validation) and the last.

No budget this machine affords is past every N's plateau: at N = 512 each doubling from
24 to 96 epochs still added about 0.005 test R@1 (`plateau/budget_24_epochs.md`,
`budget_48_epochs.md`). So every N trains at each of `EPOCHS`, each budget twice the one
before, and the question is read from how the gaps move as the budget doubles: a gap
between N that closes means more negatives reach the plateau sooner; one that holds or
grows, that they raise it.

The report (`summary`): per budget, arm and setting the runs, the epochs to the best
checkpoint, and the best validation and the test R@1 at the best and the last checkpoint
(the mean of both directions; mean ± 95% t over the seeds); at each budget the arms'
difference at each setting and each arm's largest setting less its smallest; as the
budget doubles, each of those differences' change and each setting's gain. Every
difference with a 95% interval over the seeds and the test queries together
(`query_hits.contrast`), over the queries alone where a group has one seed
(`query_hits.queries_contrast`, marked).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from experiments.lib import constant_rate, intervals, query_hits, sweep, target_steps
from experiments.lib.rate_grid import rate_step_of

EPOCHS = (24.0, 48.0)  # the budgets, each twice the one before, in epochs of the training split
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


def _has_hits(record: Mapping[str, Any], hits: Mapping[str, Mapping]) -> bool:
    """Whether both of the run's `checkpoint_steps` have test hits."""
    return all(f"{record['name']}@{step}" in hits for step in checkpoint_steps(record).values())


Group = tuple[float, str, int]  # (budget in epochs, arm, N): the runs of one table row


def _row(group: Group, runs, hits, train_size: int) -> list:
    """One table row: `runs` (the records of `group`, every one with hits; their rate step,
    marked where no run of the arm had tuned it: tag `tuned`)."""
    epochs, arm, setting = group
    rate = ", ".join(str(k) for k in sorted({r["rate_step"] for r in runs}))
    tests = {w: [float(_scores(r, hits, w).mean()) for r in runs] for w in CHECKPOINTS}
    return [
        arm, f"{epochs:g}", f"{setting:,}", rate + ("" if all(r["tuned"] for r in runs) else " (untuned)"), len(runs),
        f"{np.mean([checkpoint_steps(r)['best'] * setting / train_size for r in runs]):.1f}",
        intervals.mean_and_interval([float(target_steps.validation_curve(r)[:, 1].max()) for r in runs], decimals=3),
        intervals.mean_and_interval(tests["best"], decimals=3), intervals.mean_and_interval(tests["final"], decimals=3),
    ]  # fmt: skip


def _cell(terms: Mapping[Group, float], groups: Mapping[Group, Sequence], hits, which: str) -> str:
    """The weighted sum `terms` (`{group: weight}`) of the groups' test R@1 at checkpoint
    `which`, 95% over the seeds and the queries (`query_hits.contrast`), or over the
    queries alone where a group has one run (`query_hits.queries_contrast`, marked), with
    its verdict."""
    scores = [[_scores(r, hits, which) for r in groups[group]] for group in terms]
    weights = list(terms.values())
    one_seed = min(len(s) for s in scores) == 1
    value = (query_hits.queries_contrast if one_seed else query_hits.contrast)(scores, weights)
    return f"{intervals.difference_cell(*value)}, {intervals.verdict(*value[1:])}" + (" (queries)" if one_seed else "")


def comparisons(arms: Sequence[str], settings: Mapping[str, Sequence[int]], shared: Sequence[int]) -> dict[str, dict]:
    """`{label: {(arm, N): weight}}`, the differences read at one budget: the reference arm
    (`arms[0]`) less the other at each N both ran (`settings`: each arm's N), and each
    arm's largest N less its smallest, the reference's runs standing for the other's at
    the N in `shared`."""
    reference, other = arms
    found = {}
    for setting in sorted(set(settings[reference]) & set(settings[other])):
        found[f"{reference} − {other}, N = {setting:,}"] = {(reference, setting): 1.0, (other, setting): -1.0}
    for arm in arms:
        whole = {s: reference for s in shared if s in settings[reference]} | {s: arm for s in settings[arm]}
        if len(whole) > 1:
            small, large = min(whole), max(whole)
            found[f"{arm}: N = {large:,} − {small:,}"] = {(whole[large], large): 1.0, (whole[small], small): -1.0}
    return found


def _differences(groups: Mapping[Group, Sequence], arms: Sequence[str], shared, hits) -> tuple[list, list]:
    """The rows of the differences at each budget (`comparisons`) and of their change as
    the budget doubles: each comparison, and each arm and N alone, at a budget less at the
    budget before."""
    budgets = sorted({epochs for epochs, _, _ in groups})
    at = {}
    for b in budgets:
        ran = {arm: [n for epochs, a, n in groups if (epochs, a) == (b, arm)] for arm in arms}
        at[b] = comparisons(arms, ran, shared)
    rows = [[label, f"{b:g}", *(_cell({(b, *k): w for k, w in terms.items()}, groups, hits, c) for c in CHECKPOINTS)]
            for b in budgets for label, terms in at[b].items()]  # fmt: skip
    grown = []
    for before, budget in zip(budgets, budgets[1:]):
        both = {label: terms for label, terms in at[budget].items() if label in at[before]}
        both |= {
            f"{a}, N = {n:,}": {(a, n): 1.0} for e, a, n in sorted(groups) if e == budget and (before, a, n) in groups
        }
        for label, terms in both.items():
            doubled = {(budget, *k): w for k, w in terms.items()} | {(before, *k): -w for k, w in terms.items()}
            grown.append([label, f"{budget:g} vs {before:g}", *(_cell(doubled, groups, hits, c) for c in CHECKPOINTS)])
    return rows, grown


def _grouped(by_arm: Mapping[str, Sequence[Mapping[str, Any]]], hits: Mapping[str, Mapping]) -> dict[Group, list]:
    """`{(epochs, arm, N): records}` of the runs with test hits, in the table's order
    (budget, arm as in `by_arm`, N), each list by seed."""
    groups: dict[Group, list] = {}
    for arm, records in by_arm.items():
        for r in sorted(records, key=lambda r: (r["batch_size"], r["seed"])):
            if _has_hits(r, hits):
                groups.setdefault((r["epochs"], arm, r["batch_size"]), []).append(r)
    return dict(sorted(groups.items(), key=lambda item: (item[0][0], list(by_arm).index(item[0][1]), item[0][2])))


SEEDS_AND_QUERIES = (
    "95% over the seeds (Welch) and the test queries (paired bootstrap) together; (queries): a group has one "
    "seed, the queries' interval alone"
)


def summary(
    by_arm: Mapping[str, Sequence[Mapping[str, Any]]],
    hits: Mapping[str, Mapping],
    train_size: int,
    *,
    shared: Sequence[int],
    budgets: Sequence[float],
) -> str:
    """The plateau's report (the module docstring): `by_arm` `{arm: records}` (two arms,
    the first the reference, whose records at the settings `shared` stand for both: there
    the second arm's loss is the first's; tags `arm`, `rate_step`, `tuned`, `epochs`,
    `checkpoint_every`), the test `hits` (`query_hits.cached_hits` of `hit_names`) and the
    design's `budgets` (epochs)."""
    groups = _grouped(by_arm, hits)
    text = (
        f"\n## The plateau: each N at its tuned rate, decayed over {' and '.join(f'{b:g}' for b in budgets)} epochs\n\n"
    )
    if not groups:
        return text + "No run finished yet.\n"
    header = ["arm", "epochs", "N", "rate step k", "runs", "epochs to best", "best validation R@1",
              "test R@1 at best", "test R@1 final"]  # fmt: skip
    rows = [_row(group, runs, hits, train_size) for group, runs in groups.items()]
    text += "Test R@1: the mean of both directions, mean ± 95% t over the seeds; at best: the checkpoint with "
    text += "the highest validation R@1.\n\n" + sweep.markdown_table(rows, header)
    reference = next(iter(by_arm))
    shared = [s for s in shared if any(group[1:] == (reference, s) for group in groups)]
    if shared:
        text += f"\nAt N = {', '.join(f'{s:,}' for s in shared)} the {reference} runs stand for both arms.\n"
    rows, grown = _differences(groups, list(by_arm), shared, hits)
    header = ["comparison", "epochs", "at best", "final"]
    if rows:
        text += f"\nDifferences of test R@1 at each budget, {SEEDS_AND_QUERIES}:\n\n" + sweep.markdown_table(
            rows, header
        )
    if grown:
        text += (
            "\nAs the budget doubles: each difference above, and each arm and N alone, at a budget less at the one "
            "before (a gap between N that shrinks, resolved: more negatives reach the plateau sooner; one that holds "
            f"or grows: they raise it), {SEEDS_AND_QUERIES}:\n\n" + sweep.markdown_table(grown, header)
        )
    return text
