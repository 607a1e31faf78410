"""The metrics of learned embeddings: retrieval, classification probes, geometry.

Metric functions are pure NumPy on host arrays of L2-normalised embeddings (`z` [n, D],
similarity = dot product):

* `cross_view_recall`: paired retrieval, R@K: query i's answers are gallery item i, or
  every gallery item in query i's group (e.g. any pronunciation that is the same string
  as the query's own, so homophones are not errors); computed in blocks of queries, so
  memory is O(block * n), not n^2. `cross_view_ranks` gives each query's rank (for
  per-query statistics), `recall_ceiling` the best R@1 when some queries are identical
  (`paired_ceilings`: both directions).
* `retrieval_metrics`: metric-learning retrieval within one labelled set, the query left
  out: Recall@K, MAP@R and R-precision (Musgrave et al. 2020).
* `knn_accuracy`, `linear_probe_accuracy`: classification from frozen embeddings.
* `alignment`, `uniformity` (Wang & Isola 2020), `collapse_diagnostics`.

The in-loop `evaluator.Evaluator` embeds with the current model and computes these.
"""

from collections.abc import Mapping, Sequence

import numpy as np
from sklearn import linear_model


def cross_view_ranks(
    za: np.ndarray, zb: np.ndarray, *, groups: np.ndarray | None = None, block_size: int = 1024
) -> np.ndarray:
    """Each query's rank in paired retrieval: query `za[i]` against all of `zb`.

    Args:
      za: [n, D] queries.
      zb: [n, D] gallery, row i the pair of `za[i]`.
      groups: [n] ints or None. Gallery item j answers query i when `groups[j] ==
        groups[i]` (e.g. equal pronunciation strings); None: only item i does.
      block_size: queries scored at once ([block_size, n] similarities in memory).

    Returns:
      [n] int64: the number of non-answers scoring at least as high as query i's best
      answer (0: an answer is first; ties count against the query).
    """
    n = len(za)
    groups = np.arange(n) if groups is None else np.asarray(groups)
    ranks = []
    for start in range(0, n, block_size):
        similarity = za[start : start + block_size] @ zb.T  # [b, n]
        answer = groups[start : start + block_size, None] == groups[None, :]
        best = np.max(np.where(answer, similarity, -np.inf), axis=1, keepdims=True)
        ranks.append(np.sum((similarity >= best) & ~answer, axis=1))
    return np.concatenate(ranks)


def cross_view_recall(
    za: np.ndarray,
    zb: np.ndarray,
    ks: Sequence[int],
    *,
    groups: np.ndarray | None = None,
    block_size: int = 1024,
) -> dict[str, float]:
    """Recall@K of retrieving a match of query `za[i]` [n, D] among all of `zb` [n, D]
    (`groups`, `block_size`: as in `cross_view_ranks`).

    Returns:
      `{"R@K": fraction of queries with an answer in the top K}` (ties count against
      the query).
    """
    rank = cross_view_ranks(za, zb, groups=groups, block_size=block_size)
    return {f"R@{k}": float(np.mean(rank < k)) for k in ks}


def recall_ceiling(query_ids: np.ndarray, groups: np.ndarray) -> float:
    """The best R@1 any model can reach when some queries are identical.

    Identical queries (equal `query_ids`) get the same ranking, so their top item is
    right only for those whose answer group it is: of each set of identical queries, at
    most the largest subset sharing one group is right (e.g. cmudict's spelling ->
    pronunciation: a word with two pronunciations is right for one of its two rows).

    Args:
      query_ids: [n] ints, equal for identical queries (the other direction's match key).
      groups: [n] ints, the answer groups (`cross_view_ranks`'s `groups`).

    Returns:
      The fraction of the n queries that can be right at rank 1.
    """
    pairs, counts = np.unique(np.column_stack([query_ids, groups]), axis=0, return_counts=True)
    best = {}
    for (query, _), count in zip(pairs.tolist(), counts.tolist(), strict=True):
        best[query] = max(best.get(query, 0), count)
    return sum(best.values()) / len(query_ids)


def paired_ceilings(ids: Mapping[str, np.ndarray], match_keys: tuple[str, str] | None) -> dict[str, float]:
    """`recall_ceiling` of both directions of paired retrieval.

    Args:
      ids: the split's id keys, each [n] ints (e.g. `input_pipeline.eval_arrays`'s).
      match_keys: `(a -> b, b -> a)`: the keys whose equal values are right answers
        (`records.Metadata.match_keys`), or None: only the pair itself (ceilings 1).

    Returns:
      `{"a_to_b": ceiling, "b_to_a": ceiling}`: the a -> b queries are identical where
      the b -> a key is equal (the a side's own id), and the other way round.
    """
    if match_keys is None:
        return {"a_to_b": 1.0, "b_to_a": 1.0}
    match_a, match_b = match_keys
    return {
        "a_to_b": recall_ceiling(ids[match_b], ids[match_a]),
        "b_to_a": recall_ceiling(ids[match_a], ids[match_b]),
    }


def input_ceilings(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    """The best R@1 any model can reach in paired retrieval with only the pair itself
    right (no match keys), from the inputs: identical inputs embed identically, so an
    answer whose input another candidate repeats ties with it (ties count against the
    query, `cross_view_ranks`), and identical queries rank alike (of each set, at most one
    is right).

    Args:
      a: [n, ...] the a side's inputs (pixels, tokens), row i paired with `b[i]`.
      b: [n, ...] the b side's.

    Returns:
      `{"a_to_b": ceiling, "b_to_a": ceiling}`: per direction, the number of sets of
      identical queries holding a query whose answer's input is unique, over n.
    """

    def ids(x):
        return np.unique(np.reshape(x, (len(x), -1)), axis=0, return_inverse=True)[1].ravel()

    def ceiling(query_ids, answer_ids):
        unique_answer = np.bincount(answer_ids)[answer_ids] == 1
        return len(np.unique(query_ids[unique_answer])) / len(query_ids)

    a_ids, b_ids = ids(a), ids(b)
    return {"a_to_b": ceiling(a_ids, b_ids), "b_to_a": ceiling(b_ids, a_ids)}


def _neighbours(z: np.ndarray, num: int) -> np.ndarray:
    """[n, num] indices of each row's most similar other rows, most similar first."""
    similarity = z @ z.T
    np.fill_diagonal(similarity, -np.inf)
    return np.argsort(-similarity, axis=1, kind="stable")[:, :num]


def retrieval_metrics(z: np.ndarray, labels: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """Leave-one-out retrieval within a labelled set.

    Args:
      z: [n, D] embeddings.
      labels: [n] classes.
      ks: the K values of Recall@K.

    Returns:
      `R@K` (a same-class item among the K nearest others), `MAP@R` and
      `R-precision`, where R is the number of other items of the query's class.
    """
    same = labels[:, None] == labels[None, :]
    num_relevant = same.sum(axis=1) - 1
    max_r = int(num_relevant.max())
    order = _neighbours(z, max(max_r, max(ks)))
    hits = np.take_along_axis(same, order, axis=1).astype(np.float64)  # [n, max(R, K)]
    out = {f"R@{k}": float(np.mean(hits[:, :k].any(axis=1))) for k in ks}
    positions = np.arange(1, hits.shape[1] + 1)
    within_r = positions[None, :] <= num_relevant[:, None]
    hits_r = hits * within_r
    precision_at_i = np.cumsum(hits_r, axis=1) / positions
    r = np.maximum(num_relevant, 1)
    out["MAP@R"] = float(np.mean(np.sum(precision_at_i * hits_r, axis=1) / r))
    out["R-precision"] = float(np.mean(hits_r.sum(axis=1) / r))
    return out


def knn_accuracy(
    train_z: np.ndarray, train_labels: np.ndarray, test_z: np.ndarray, test_labels: np.ndarray, *, k: int
) -> float:
    """Top-1 accuracy of a k-nearest-neighbour vote (cosine) with `train_z` as memory.

    Args: train_z [m, D], train_labels [m], test_z [n, D], test_labels [n]. Ties in the
    vote go to the smallest class index.
    """
    nearest = np.argsort(-(test_z @ train_z.T), axis=1, kind="stable")[:, :k]
    votes = train_labels[nearest]  # [n, k]
    num_classes = int(max(train_labels.max(), test_labels.max())) + 1
    counts = np.stack([np.sum(votes == c, axis=1) for c in range(num_classes)], axis=1)
    return float(np.mean(np.argmax(counts, axis=1) == test_labels))


def linear_probe_accuracy(
    train_z: np.ndarray, train_labels: np.ndarray, test_z: np.ndarray, test_labels: np.ndarray
) -> float:
    """Test accuracy of a logistic regression fit on frozen train embeddings [m, D]."""
    probe = linear_model.LogisticRegression(max_iter=2000)
    probe.fit(train_z, train_labels)
    return float(probe.score(test_z, test_labels))


def alignment(za: np.ndarray, zb: np.ndarray, *, alpha: float = 2.0) -> float:
    """Mean `||za_i - zb_i||^alpha` over positive pairs [n, D] (lower: better aligned)."""
    return float(np.mean(np.linalg.norm(za - zb, axis=1) ** alpha))


def uniformity(z: np.ndarray, *, t: float = 2.0, block_size: int = 1024) -> float:
    """`log mean_{i<j} exp(-t ||z_i - z_j||^2)` over [n, D] (lower: more uniform).

    Computed over blocks of `block_size` rows (memory O(block * n)) as the mean over all
    i != j, which equals the mean over i < j by symmetry; the exponentials in `z`'s
    dtype (unit rows: -t ||z_i - z_j||^2 = 2t min(z_i . z_j, 1) - 2t), their sums in
    float64.
    """
    n = len(z)
    block_lse = []
    for start in range(0, n, block_size):
        x = (2.0 * t) * np.minimum(z[start : start + block_size] @ z.T, 1.0) - 2.0 * t  # [b, n]
        rows = np.arange(len(x))
        x[rows, start + rows] = -np.inf  # leave out i == j
        top = x.max()
        block_lse.append(np.log(np.sum(np.exp(x - top), dtype=np.float64)) + top)
    return float(np.logaddexp.reduce(block_lse) - np.log(n * (n - 1)))


def collapse_diagnostics(z: np.ndarray) -> dict[str, float]:
    """Signs of dimensional or complete collapse of embeddings [n, D].

    Returns:
      `std_mean`, `std_min`: per-dimension standard deviation (1/sqrt(D) each when the
      embeddings spread evenly over the sphere; 0 for a dead dimension);
      `effective_rank`: exp of the entropy of the normalised singular values of the
      centred embeddings (Roy & Vetterli 2007), in [1, D] (1 when they are one point);
      `mean_cosine`: mean off-diagonal cosine similarity (1 when collapsed to a point).
    """
    std = z.std(axis=0)
    singular = np.linalg.svd(z - z.mean(axis=0), compute_uv=False)
    singular = singular[singular > 1e-6 * np.sqrt(len(z))]  # drop round-off
    p = singular / singular.sum() if len(singular) else np.ones(1)
    n = len(z)
    total = z.sum(axis=0)
    cosine = (total @ total - np.sum(z * z)) / max(n * (n - 1), 1)  # sum_{i != j} z_i . z_j
    return {
        "std_mean": float(std.mean()),
        "std_min": float(std.min()),
        "effective_rank": float(np.exp(-np.sum(p * np.log(p)))),
        "mean_cosine": float(cosine),
    }
