"""Per-query test hits of trained runs, for intervals over the test queries.

A study's runs are scored on one test split: for each query, whether the trained model
ranks a right answer first (R@1), both directions. The hits of run `name` are computed
once from its last checkpoint (`out/runs/<name>`; `<name>@<step>`: its checkpoint at
that step) and cached, bit-packed, in `out/final.json`, so a fresh clone (no checkpoints)
still has them. Two groups of runs on the same queries are compared by the difference of
their seed-mean hits, with `intervals.paired_bootstrap` over the queries, or over the
seeds and the queries together (`seeds_and_queries`; any weighted sum of groups: `contrast`).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.lib import intervals

DIRECTIONS = ("a_to_b", "b_to_a")  # cmudict: spelling -> pronunciation and back


def test_hits(model, arrays: Mapping[str, np.ndarray], match_keys: tuple[str, str] | None) -> dict[str, Any]:
    """Per query of `arrays` (`input_pipeline.eval_arrays` of the test split), whether the
    trained `model` (`trained.TrainedModel`) ranks a right answer first (R@1), both
    directions (`{"a_to_b": [n] bool, "b_to_a": [n] bool}`), and each direction's ceiling
    (`"a_to_b/ceiling"`: `metrics.paired_ceilings`); `match_keys`: the data's."""
    from contrastive_jax.evaluation import metrics

    z = {side: model.embed(arrays[side], side, batch_size=1024) for side in ("a", "b")}
    match_a, match_b = match_keys or (None, None)
    hits = {f"{direction}/ceiling": c for direction, c in metrics.paired_ceilings(arrays, match_keys).items()}
    for direction, query, gallery, match in (("a_to_b", "a", "b", match_a), ("b_to_a", "b", "a", match_b)):
        groups = arrays[match] if match else None
        hits[direction] = metrics.cross_view_ranks(z[query], z[gallery], groups=groups) == 0
    return hits


def cached_hits(names: Iterable[str], out: Path, split: str) -> dict[str, dict[str, Any]]:
    """`test_hits` on `split` of each run in `names` whose checkpoint is in
    `out/runs/<name>` (a name `<run>@<step>`: run `<run>`'s checkpoint `step`, else its
    last) and whose hits are not in `out/final.json` yet (computed, then cached); returns
    every cached run's hits: `{name: {"a_to_b": [n] bool, "b_to_a": [n]
    bool, "a_to_b/ceiling", "b_to_a/ceiling", "queries": n}}`. The runs with neither are
    left out, named in one line."""
    from contrastive_jax import trained
    from contrastive_jax.data import input_pipeline, settings

    cache_file = out / "final.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    arrays = match_keys = None
    missing = []
    for name in names:
        run, _, step = name.partition("@")
        workdir = out / "runs" / run
        if name in cache:
            continue
        if not (workdir / "checkpoints").is_dir():
            missing.append(name)
            continue
        print(f"[hits] {name}: R@1 of each {split} query", flush=True)
        model = trained.load(str(workdir), int(step) if step else None)
        if arrays is None:  # every run of a study reads the same data: the split once
            arrays = input_pipeline.eval_arrays(model.data, split)
            match_keys = settings.open_metadata(model.data).match_keys
        hits = test_hits(model, arrays, match_keys)
        packed = {d: base64.b64encode(np.packbits(hits[d])).decode() for d in DIRECTIONS}
        cache[name] = {"queries": len(hits["a_to_b"]), **hits, **packed}
        cache_file.write_text(json.dumps(cache, indent=1))
    if missing:
        print(
            f"[hits] no checkpoint in {out / 'runs'} for {len(missing)} runs, so no per-query hits: "
            f"{', '.join(missing)} (delete a run's record to retrain it)",
            flush=True,
        )
    return {
        name: {
            k: np.unpackbits(np.frombuffer(base64.b64decode(v), np.uint8), count=entry["queries"]).astype(bool)
            if k in DIRECTIONS
            else v
            for k, v in entry.items()
        }
        for name, entry in cache.items()
    }


def seed_mean_difference(
    hits: Mapping[str, Mapping[str, Any]], names: Sequence[str], against: Sequence[str], direction: str
) -> tuple[float, float, float]:
    """The R@1 difference of runs `names` (one per seed) against runs `against` on the same
    queries: their seed-mean hits in `direction` differenced query by query, with the 95%
    paired bootstrap over the queries (`intervals.paired_bootstrap`): `(difference, low,
    high)`."""
    x = np.mean([hits[name][direction] for name in names], axis=0)
    y = np.mean([hits[name][direction] for name in against], axis=0)
    return intervals.paired_bootstrap(x, y)


def query_scores(entry: Mapping[str, Any], direction: str | None = None) -> np.ndarray:
    """[Q] one run's per-query test score: its R@1 hit in `direction`, or (None) the mean
    of both directions' hits (query i is pair i, asked both ways)."""
    directions = DIRECTIONS if direction is None else (direction,)
    return np.mean([np.asarray(entry[d], np.float64) for d in directions], axis=0)


def combine(seeds: Sequence[float], queries: Sequence[float]) -> tuple[float, float, float]:
    """`(difference, low, high)`: the seeds' 95% interval `seeds` (`(difference, low, high)`,
    Welch's) widened by the queries' `queries` (the paired bootstrap's): two independent
    errors, the half-widths added in quadrature around the seeds' difference; NaN bounds
    when the seeds' are (one seed). Each part keeps its own critical value (t for the
    seeds, the bootstrap's percentiles for the queries), and the queries' spread of the
    seed-mean hits holds a little of the seeds' noise again: a slightly conservative
    interval, never narrower than either part."""
    difference, low, high = seeds
    if math.isnan(low):
        return difference, math.nan, math.nan
    half = math.hypot((high - low) / 2, (queries[2] - queries[1]) / 2)
    return difference, difference - half, difference + half


def seeds_and_queries(x: Sequence[np.ndarray], y: Sequence[np.ndarray]) -> tuple[float, float, float]:
    """The mean test score of runs `x` less runs `y` (independent seeds, the same queries)
    with a 95% interval over both the seeds and the test queries: `contrast([x, y], [1, -1])`.

    Args:
      x: one [Q] array of per-query scores (`query_scores`) per seed of one method.
      y: the other method's, on the same Q queries.
    """
    return contrast([x, y], [1.0, -1.0])


def contrast(groups: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> tuple[float, float, float]:
    """A weighted sum of groups' mean test scores (independent seeds, the same queries;
    e.g. weights `[1, -1, -1, 1]`: how much a gap grows from one budget to the next) with
    a 95% interval over both the seeds and the test queries (`combine`): Welch's over the
    runs' means (`intervals.welch_contrast`; NaN bounds where a group has one run), and
    the paired bootstrap over the queries (`queries_contrast`).

    Args:
      groups: G groups, each one [Q] array of per-query scores (`query_scores`) per seed.
      weights: [G] the contrast's weights, summing to 0.
    """
    seeds = intervals.welch_contrast([[float(s.mean()) for s in group] for group in groups], weights)
    return combine(seeds, queries_contrast(groups, weights))


def queries_contrast(groups: Sequence[Sequence[np.ndarray]], weights: Sequence[float]) -> tuple[float, float, float]:
    """`contrast`'s sum with the 95% paired bootstrap over the test queries alone: the
    groups' seed-mean scores weighted, the positive weights' sum against the negative's,
    query by query (the only interval where every group has one run)."""
    means = [w * np.mean(group, axis=0) for w, group in zip(weights, groups, strict=True)]
    plus = np.sum([m for w, m in zip(weights, means) if w > 0], axis=0)
    minus = -np.sum([m for w, m in zip(weights, means) if w < 0], axis=0)
    return intervals.paired_bootstrap(plus, minus)
