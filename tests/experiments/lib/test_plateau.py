"""experiments/lib/plateau.py: the rates the plateau trains at, the checkpoints whose test
it reads, and its report's table, its differences at each budget over seeds and queries,
and their change as the budget doubles (`query_hits.contrast`)."""

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


def test_a_contrast_is_welchs_over_the_seeds_and_the_bootstrap_of_the_weighted_queries():
    """Four groups of two seeds, 50 queries: the gap's change A - B - (C - D) is Welch's
    contrast of the runs' means widened by the paired bootstrap of (A + D) against (B + C)
    query by query; two groups are `seeds_and_queries`. (Mutation: the queries' sum with
    the weights' signs dropped, red.)"""
    rng = np.random.default_rng(0)
    groups = [[rng.integers(0, 2, 50).astype(float) for _ in range(2)] for _ in range(4)]
    weights = [1.0, -1.0, -1.0, 1.0]
    seeds = intervals.welch_contrast([[float(s.mean()) for s in g] for g in groups], weights)
    mean = [np.mean(g, axis=0) for g in groups]
    queries = intervals.paired_bootstrap(mean[0] + mean[3], mean[1] + mean[2])
    assert query_hits.queries_contrast(groups, weights) == pytest.approx(queries)
    assert query_hits.contrast(groups, weights) == pytest.approx(query_hits.combine(seeds, queries))
    assert query_hits.seeds_and_queries(groups[0], groups[1]) == query_hits.contrast(groups[:2], [1.0, -1.0])


def test_the_report_tables_each_budget_and_arm_and_the_gaps_as_the_budget_doubles():
    """Plain at N = 64 (shared) and 128, fixed K at 128, at 24 and 48 epochs, two seeds
    each, 40 test queries: the table's rows by budget, arm and N; at each budget plain −
    fixed K at 128 and each arm's N = 128 − 64 (fixed K's 64 the plain runs) equal to
    `query_hits.contrast` of the same hits; as the budget doubles, each of those at 48 less
    at 24 and each arm and N alone. With seed 0 alone every interval is the queries' and
    marked. (Mutations, each red: fixed K − plain; the final checkpoint's hits for the
    best; the doubling's weights of the budget before not negated.)"""
    rng = np.random.default_rng(1)
    groups = {(e, a, n): [] for e in (24, 48) for a, n in (("plain", 64), ("plain", 128), ("fixed_k", 128))}
    cached, scores = {}, {}
    values = [0.5, 0.8, 0.7]  # checkpoints every 20 steps: the best at 20, the last at 30
    for (epochs, arm, n), runs in groups.items():
        for seed in (0, 1):
            name = f"{arm}{n}_e{epochs}_s{seed}"
            runs.append(record(name, n, seed, values, arm=arm, epochs=epochs, tuned=arm == "plain"))
            rows = [rng.integers(0, 2, 40).astype(bool) for _ in range(2)]  # at best (20), final (30)
            cached |= hits({f"{name}@20": rows[0], f"{name}@30": rows[1]})
            scores[name] = [np.asarray(row, float) for row in rows]
    by_arm = {arm: [r for (_, a, _), runs in groups.items() if a == arm for r in runs] for arm in ("plain", "fixed_k")}
    text = plateau.summary(by_arm, cached, 1280, shared=[64], budgets=[24, 48])
    assert "## The plateau: each N at its tuned rate, decayed over 24 and 48 epochs" in text
    table = [line.split(" | ")[:3] for line in text.splitlines() if line.startswith(("| plain |", "| fixed_k |"))]
    assert table == [["| plain", "24", "64"], ["| plain", "24", "128"], ["| fixed_k", "24", "128"],
                     ["| plain", "48", "64"], ["| plain", "48", "128"], ["| fixed_k", "48", "128"]]  # fmt: skip
    assert "| fixed_k | 24 | 128 | 3 (untuned) | 2 | 2.0 | 0.800 ± 0.000 |" in text
    assert "At N = 64 the plain runs stand for both arms." in text

    def cell(terms, which, seeds=(0, 1), contrast=query_hits.contrast):
        runs = [[scores[f"{a}{n}_e{e}_s{s}"][which] for s in seeds] for (e, a, n) in terms]
        value = contrast(runs, list(terms.values()))
        return f"{intervals.difference_cell(*value)}, {intervals.verdict(*value[1:])}"

    arms_at = {e: {(e, "plain", 128): 1.0, (e, "fixed_k", 128): -1.0} for e in (24, 48)}
    k_gap = {e: {(e, "fixed_k", 128): 1.0, (e, "plain", 64): -1.0} for e in (24, 48)}
    assert f"| plain − fixed_k, N = 128 | 24 | {cell(arms_at[24], 0)} | {cell(arms_at[24], 1)} |" in text
    assert f"| fixed_k: N = 128 − 64 | 48 | {cell(k_gap[48], 0)} | {cell(k_gap[48], 1)} |" in text
    doubled = arms_at[48] | {key: -w for key, w in arms_at[24].items()}
    assert f"| plain − fixed_k, N = 128 | 48 vs 24 | {cell(doubled, 0)} | {cell(doubled, 1)} |" in text
    alone = {(48, "plain", 64): 1.0, (24, "plain", 64): -1.0}
    assert f"| plain, N = 64 | 48 vs 24 | {cell(alone, 0)} | {cell(alone, 1)} |" in text
    first = {arm: [r for r in runs if r["seed"] == 0] for arm, runs in by_arm.items()}
    text = plateau.summary(first, cached, 1280, shared=[64], budgets=[24, 48])
    queries = cell(doubled, 0, seeds=(0,), contrast=query_hits.queries_contrast)
    assert f"| plain − fixed_k, N = 128 | 48 vs 24 | {queries} (queries) |" in text


def test_the_report_before_any_run_and_with_one_arm():
    """No run with hits: the heading and a line; one arm at one N: its row, no difference."""
    empty = plateau.summary({"plain": [], "fixed_k": []}, {}, 1280, shared=[], budgets=[24, 48])
    assert empty.endswith("decayed over 24 and 48 epochs\n\nNo run finished yet.\n")
    grouped = [record("k128_s0", 128, 0, [0.5, 0.8, 0.7], arm="fixed_k")]
    cached = hits({"k128_s0@20": [1, 0], "k128_s0@30": [1, 1]})
    alone = plateau.summary({"plain": [], "fixed_k": grouped}, cached, 1280, shared=[64], budgets=[24])
    assert "| fixed_k | 24 | 128 |" in alone and "Differences" not in alone and "doubles" not in alone
