"""experiments/lib/plateau.py: the rates the plateau trains at, the checkpoints whose test
it reads, and its report's table, differences over seeds and queries and budget check."""

import numpy as np
import pytest

from experiments.lib import intervals, plateau, query_hits, target_steps


def record(name, n, seed, values, *, every=10, checkpoint_every=20, rate_step=3, arm="plain", tuned=True, epochs=24):
    """A plateau run's record: validation R@1 `values` at steps every, 2 every, ..."""
    curve = [[every * (i + 1), v] for i, v in enumerate(values)]
    return {
        "name": name, "arm": arm, "batch_size": n, "seed": seed, "rate_step": rate_step, "tuned": tuned,
        "checkpoint_every": checkpoint_every, "max_steps": 1000, "epochs": epochs, "lr_factor": 2 ** (rate_step / 2),
        "curves": {f"eval/{m}": curve for m in target_steps.METRICS},
    }  # fmt: skip


def test_the_best_checkpoint_is_the_best_validation_among_those_saved():
    """Evaluations every 10 steps, checkpoints every 20: the peak at step 30 was not saved,
    so the best is step 40 (0.7 over 20's 0.6); the last, 50, is saved whatever the
    cadence; a tie keeps the earliest. (Mutation: every evaluation a candidate: 30, red.)"""
    assert plateau.checkpoint_steps(record("r", 64, 0, [0.5, 0.6, 0.9, 0.7, 0.65])) == {"best": 40, "final": 50}
    assert plateau.checkpoint_steps(record("r", 64, 0, [0.5, 0.6, 0.9, 0.6, 0.8])) == {"best": 50, "final": 50}
    assert plateau.checkpoint_steps(record("r", 64, 0, [0.1, 0.6, 0.2, 0.6])) == {"best": 20, "final": 40}
    assert plateau.hit_names([record("r", 64, 0, [0.5, 0.6, 0.9, 0.7, 0.65])]) == ["r@40", "r@50"]


def test_each_setting_trains_at_its_best_committed_rate_or_the_first_step():
    """N = 512's runs reach 0.86 fastest at rate step 3; N = 1,024 has none: the first step."""
    records = [
        {**record(f"n512_k{k}_s{s}", 512, s, [0.9], every=steps, rate_step=k)}
        for k, steps in ((2, 900), (3, 700), (4, 800))
        for s in (0, 1)
    ]
    assert plateau.tuned_steps(records, [512, 1024], 0.86, lambda n: n // 256) == {512: (3, True), 1024: (4, False)}


def hits(names_and_rows):
    """Cached hits: both directions' per-query R@1 arrays per `<run>@<step>`."""
    return {name: {d: np.asarray(row, bool) for d in query_hits.DIRECTIONS} for name, row in names_and_rows.items()}


def test_the_report_tables_each_arm_and_differences_the_arms_over_seeds_and_queries():
    """Plain at N = 64 (shared) and 128, fixed K at 128, two seeds each, 8 test queries:
    the test R@1 at the best checkpoint and at the last per arm and N, plain − fixed K at
    128 equal to `query_hits.seeds_and_queries` of the same hits, and the budget check's
    longer run less the budget's over the queries. (Mutations, each red: fixed K − plain;
    the final checkpoint's hits for the best; the check against another seed's run.)"""
    rows = {
        "p64_s0": ([1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]),
        "p64_s1": ([1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]),
        "p128_s0": ([1, 1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]),
        "p128_s1": ([1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]),
        "k128_s0": ([1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]),
        "k128_s1": ([1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0]),
    }
    values = [0.5, 0.8, 0.7]  # checkpoints every 20 steps: the best at 20, the last at 30
    plain = [record(f"p{n}_s{s}", n, s, values) for n in (64, 128) for s in (0, 1)]
    grouped = [record(f"k128_s{s}", 128, s, values, arm="fixed_k", tuned=False) for s in (0, 1)]
    cached = hits({f"{name}@{step}": row[i] for name, row in rows.items() for i, step in enumerate((20, 30))})
    checks = [record("p128_s0_long", 128, 0, values, epochs=48)]
    cached |= hits({"p128_s0_long@20": rows["k128_s0"][0], "p128_s0_long@30": rows["p128_s1"][1]})
    text = plateau.summary({"plain": plain, "fixed_k": grouped}, checks, cached, 1280, shared=[64], epochs=24)
    assert "## The plateau: each N at its tuned rate, decayed over 24 epochs" in text
    assert "| plain | 64 | 3 | 2 | 1.0 | 0.800 ± 0.000 | 0.312 ± 0.794 | 0.188 ± 0.794 |" in text
    assert "| fixed_k | 128 | 3 (untuned) | 2 |" in text and "| 0.438 ± 0.794 | 0.312 ± 0.794 |" in text
    assert "At N = 64 the plain runs stand for both arms." in text
    scores = {name: (np.asarray(best, float), np.asarray(last, float)) for name, (best, last) in rows.items()}
    cells = []
    for i in (0, 1):  # at best, final
        difference = query_hits.seeds_and_queries(
            [scores[f"p128_s{s}"][i] for s in (0, 1)], [scores[f"k128_s{s}"][i] for s in (0, 1)]
        )
        assert difference[0] == pytest.approx(0.25)
        cells.append(f"{intervals.difference_cell(*difference)}, {intervals.verdict(*difference[1:])}")
    assert f"| plain − fixed_k, N = 128 | {cells[0]} | {cells[1]} |" in text
    grown = query_hits.seeds_and_queries([scores[f"k128_s{s}"][0] for s in (0, 1)],
                                         [scores[f"p64_s{s}"][0] for s in (0, 1)])  # fmt: skip
    assert f"| fixed_k: N = 128 − 64 | {intervals.difference_cell(*grown)}" in text
    # the budget check: 48 epochs less 24 at N = 128, seed 0, over the queries: best 3/8 - 5/8, final 5/8 - 4/8
    long_best = intervals.paired_bootstrap(scores["k128_s0"][0], scores["p128_s0"][0])
    long_final = intervals.paired_bootstrap(scores["p128_s1"][1], scores["p128_s0"][1])
    assert (long_best[0], long_final[0]) == pytest.approx((-0.25, 0.125))
    cells = [f"{intervals.difference_cell(*d)}, {intervals.verdict(*d[1:])}" for d in (long_best, long_final)]
    assert f"| plain, N = 128, seed 0 | 48 − 24 | {cells[0]} | {cells[1]} |" in text
    assert plateau.summary({"plain": [], "fixed_k": []}, [], {}, 1280, shared=[], epochs=24).endswith(
        "No run finished yet.\n"
    )
    alone = plateau.summary({"plain": [], "fixed_k": grouped}, [], cached, 1280, shared=[64], epochs=24)
    assert "| fixed_k | 128 |" in alone and "Differences" not in alone  # one arm, one N: nothing to difference
