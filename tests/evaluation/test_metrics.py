"""Evaluation metrics on small hand-checkable inputs."""

import math

import numpy as np
import pytest

from contrastive_jax.evaluation import metrics


def unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_cross_view_recall_golden():
    za = unit([[1, 0], [0, 1], [1, 1]])
    # Query 0's and 2's matches rank 1st, query 1's 3rd (behind items 2 and 0).
    zb = unit([[1, 0.1], [-1, -0.2], [0.3, 1]])
    sim = za @ zb.T
    assert [np.argsort(-row).tolist() for row in sim] == [[0, 2, 1], [2, 0, 1], [2, 0, 1]]
    assert metrics.cross_view_recall(za, zb, (1, 2, 3)) == {
        "R@1": pytest.approx(2 / 3),
        "R@2": pytest.approx(2 / 3),
        "R@3": 1.0,
    }


def test_cross_view_recall_counts_ties_against_the_query():
    z = unit([[1, 0], [1, 0]])
    assert metrics.cross_view_recall(z, z, (1, 2)) == {"R@1": 0.0, "R@2": 1.0}


def test_cross_view_recall_with_groups_homophones_and_alternates():
    # Four dictionary lines: 0 "knight" and 1 "night" are homophones (one pronunciation
    # string, so tower b embeds them identically); 2 "read" /R EH1 D/ and 3 "read"
    # /R IY1 D/ are alternates (one spelling, so tower a embeds them identically).
    pronunciation_id = np.array([0, 0, 1, 2])
    word_id = np.array([0, 1, 2, 2])
    za = unit([[1, 0.2], [1, -0.2], [0, 1], [0, 1]])  # spellings
    zb = unit([[1, 0], [1, 0], [0.1, 1], [-0.3, 1]])  # pronunciations
    # Spelling -> pronunciation: "knight" and "night" tie on items 0 and 1, both the right
    # string; the two "read" queries both retrieve item 2 first: right for line 2 only.
    spelling = metrics.cross_view_recall(za, zb, (1, 2), groups=pronunciation_id)
    assert spelling == {"R@1": 0.75, "R@2": 1.0}
    # Pronunciation -> spelling: /R IY1 D/ retrieves "read" (line 2 or 3, tied): right;
    # /N AY1 T/ ties "knight" and "night" (0.98 each): query 0's answer is line 0, but
    # line 1 ties it and counts against it; likewise query 1.
    pronunciation = metrics.cross_view_recall(zb, za, (1, 2), groups=word_id)
    assert pronunciation == {"R@1": 0.5, "R@2": 1.0}
    # Without groups only the line's own partner counts: ties and alternates are errors.
    assert metrics.cross_view_recall(za, zb, (1, 2)) == {"R@1": 0.25, "R@2": 1.0}


def test_cross_view_ranks_are_the_golden_ranks_recall_counts():
    za = unit([[1, 0], [0, 1], [1, 1]])
    zb = unit([[1, 0.1], [-1, -0.2], [0.3, 1]])  # as in the golden recall test
    np.testing.assert_array_equal(metrics.cross_view_ranks(za, zb), [0, 2, 0])
    np.testing.assert_array_equal(metrics.cross_view_ranks(za, zb, groups=np.array([0, 1, 1])), [0, 0, 0])


def test_recall_ceiling_counts_one_right_answer_per_set_of_identical_queries():
    # The dictionary lines of the homophones test: "read" has two pronunciations (lines
    # 2, 3: one spelling), "knight" and "night" one (lines 0, 1: one pronunciation).
    pronunciation_id = np.array([0, 0, 1, 2])
    word_id = np.array([0, 1, 2, 2])
    assert metrics.recall_ceiling(word_id, pronunciation_id) == 0.75  # spelling -> pronunciation
    assert metrics.recall_ceiling(pronunciation_id, word_id) == 0.75  # and back
    assert metrics.recall_ceiling(np.arange(4), np.arange(4)) == 1.0
    # Identical queries with the same answer group are all right: ceiling 1.
    assert metrics.recall_ceiling(np.array([0, 0, 1]), np.array([5, 5, 6])) == 1.0


def test_paired_ceilings_take_each_directions_queries_from_the_other_directions_key():
    # "read"-like: one spelling, three pronunciations (rows 0-2); "knight"/"night" (3, 4):
    # two spellings, one pronunciation. cmudict's match keys: (pronunciation, word).
    ids = {"pronunciation_id": np.array([0, 1, 2, 3, 3]), "word_id": np.array([0, 0, 0, 1, 2])}
    ceilings = metrics.paired_ceilings(ids, ("pronunciation_id", "word_id"))
    assert ceilings == {"a_to_b": 3 / 5, "b_to_a": 4 / 5}
    assert metrics.paired_ceilings(ids, None) == {"a_to_b": 1.0, "b_to_a": 1.0}


def test_no_embedding_beats_the_recall_ceiling():
    rng = np.random.default_rng(1)
    query_ids = rng.integers(0, 12, size=40)
    groups = rng.integers(0, 25, size=40)
    ceiling = metrics.recall_ceiling(query_ids, groups)
    assert ceiling < 1
    best = 0.0
    for _ in range(200):  # identical queries embed identically; random galleries
        za = unit(rng.normal(size=(12, 3)))[query_ids]
        zb = unit(rng.normal(size=(40, 3)))
        best = max(best, metrics.cross_view_recall(za, zb, (1,), groups=groups)["R@1"])
    zb = unit(rng.normal(size=(25, 3)))[groups]  # each group one point ...
    za = np.zeros((40, 3))
    for query in np.unique(query_ids):  # ... and each query at its most frequent group's
        rows = np.flatnonzero(query_ids == query)
        values, counts = np.unique(groups[rows], return_counts=True)
        za[rows] = zb[np.flatnonzero(groups == values[np.argmax(counts)])[0]]
    reached = metrics.cross_view_recall(za, zb, (1,), groups=groups)["R@1"]
    assert best <= ceiling
    assert reached == pytest.approx(ceiling)


def test_cross_view_recall_blocks_do_not_change_the_result():
    rng = np.random.default_rng(0)
    za, zb = unit(rng.normal(size=(50, 4))), unit(rng.normal(size=(50, 4)))
    groups = rng.integers(0, 20, size=50)
    whole = metrics.cross_view_recall(za, zb, (1, 5, 10), groups=groups)
    assert metrics.cross_view_recall(za, zb, (1, 5, 10), groups=groups, block_size=7) == whole
    assert metrics.cross_view_recall(za, zb, (1, 5), groups=np.arange(50)) == (
        metrics.cross_view_recall(za, zb, (1, 5), block_size=3)
    )


def test_retrieval_metrics_golden():
    # On a line: labels a a b a b. Neighbours (nearest other first) by position.
    angles = np.array([0.0, 0.1, 0.25, 0.4, 0.55])
    z = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    labels = np.array([0, 0, 1, 0, 1])
    out = metrics.retrieval_metrics(z, labels, (1, 2))
    # Nearest others: 0 -> [1, 2, 3, 4]; 1 -> [0, 2, 3, 4] (tie 0/2: 0.1 vs 0.15, 0 first);
    # 2 -> [1, 3, 0, 4] (0.15, 0.15: tie, stable by index 1 before 3), 3 -> [2, 4, 1, 0],
    # 4 -> [3, 2, 1, 0].
    # R@1: query 0 hit (1), 1 hit (0), 2 miss (1 is a), 3 miss (2 is b), 4 miss (3 is a).
    assert out["R@1"] == pytest.approx(2 / 5)
    # R@2: 0 yes, 1 yes, 2 no (1, 3 are a), 3 no (2, 4 are b), 4 yes (2).
    assert out["R@2"] == pytest.approx(3 / 5)
    # R (relevant others): class a has 3 members -> R=2; class b has 2 -> R=1.
    # Query 0: top-2 [1, 2] -> hits [1, 0] -> AP@R = (1/1) / 2 = 0.5, R-prec = 1/2.
    # Query 1: top-2 [0, 2] -> [1, 0] -> 0.5, 1/2.
    # Query 2: top-1 [1] -> miss -> 0, 0.   Query 3: top-2 [2, 4] -> 0, 0.
    # Query 4: top-1 [3] -> miss -> 0, 0.
    assert out["MAP@R"] == pytest.approx((0.5 + 0.5) / 5)
    assert out["R-precision"] == pytest.approx((0.5 + 0.5) / 5)


def test_perfect_clusters_score_one():
    rng = np.random.default_rng(0)
    centers = unit(rng.normal(size=(4, 16)))
    labels = np.repeat(np.arange(4), 5)
    z = unit(centers[labels] + 0.01 * rng.normal(size=(20, 16)))
    out = metrics.retrieval_metrics(z, labels, (1, 5))
    assert out == {"R@1": 1.0, "R@5": 1.0, "MAP@R": 1.0, "R-precision": 1.0}
    assert metrics.knn_accuracy(z, labels, z[::-1], labels[::-1], k=3) == 1.0
    assert metrics.linear_probe_accuracy(z, labels, z, labels) == 1.0


def test_knn_majority_vote():
    train = unit([[1, 0], [1, 0.1], [1, -0.1], [0, 1]])
    train_labels = np.array([0, 1, 1, 2])
    query = unit([[1, 0.01]])
    assert metrics.knn_accuracy(train, train_labels, query, np.array([0]), k=1) == 1.0
    assert metrics.knn_accuracy(train, train_labels, query, np.array([1]), k=3) == 1.0


def test_alignment_and_uniformity_golden():
    z = unit([[1, 0], [-1, 0]])
    assert metrics.alignment(z, z) == 0.0
    assert metrics.alignment(z, -z) == pytest.approx(4.0)  # ||2 e||^2
    assert metrics.uniformity(z) == pytest.approx(-8.0)  # log exp(-2 * 4)
    square = unit([[1, 0], [0, 1], [-1, 0], [0, -1]])
    # 4 pairs at squared distance 2, 2 pairs at 4: log((4 e^-4 + 2 e^-8) / 6).
    assert metrics.uniformity(square) == pytest.approx(math.log((4 * math.exp(-4) + 2 * math.exp(-8)) / 6))


def test_uniformity_and_mean_cosine_in_blocks_match_the_dense_formulas():
    rng = np.random.default_rng(1)
    z = unit(rng.normal(size=(37, 5)))
    sq = np.sum((z[:, None] - z[None]) ** 2, axis=-1)
    i, j = np.triu_indices(37, k=1)
    dense = np.log(np.mean(np.exp(-2.0 * sq[i, j])))
    assert metrics.uniformity(z, block_size=8) == pytest.approx(dense, rel=1e-10)
    cosine = (z @ z.T)[i, j].mean()
    assert metrics.collapse_diagnostics(z)["mean_cosine"] == pytest.approx(cosine, rel=1e-10)


def test_collapse_diagnostics():
    collapsed = metrics.collapse_diagnostics(unit(np.ones((10, 8))))
    assert collapsed["std_mean"] == pytest.approx(0.0, abs=1e-12)
    assert collapsed["mean_cosine"] == pytest.approx(1.0)
    assert collapsed["effective_rank"] == pytest.approx(1.0)
    # The D basis vectors: centred, D - 1 equal singular values and one zero.
    basis = metrics.collapse_diagnostics(np.eye(8))
    assert basis["effective_rank"] == pytest.approx(7.0)
    assert basis["mean_cosine"] == pytest.approx(0.0)
    assert basis["std_min"] == pytest.approx(np.std([1] + [0] * 7))


def test_map_padded_chunks_pads_the_last_chunk_and_cuts_the_padding():
    from contrastive_jax.evaluation import padded_chunks

    a = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    widths = []

    def fn(a_rows, b_rows):
        widths.append(len(a_rows))
        assert b_rows is None
        return {"sum": a_rows.sum(axis=1), "first": a_rows[:, :1]}

    out = padded_chunks.map_padded_chunks(fn, (a, None), 4)
    assert widths == [4, 4, 4]  # 10 rows: the last chunk of 2 padded to 4
    np.testing.assert_array_equal(out["sum"], a.sum(axis=1))
    np.testing.assert_array_equal(out["first"], a[:, :1])
    assert padded_chunks.map_padded_chunks(fn, (a[:0], None), 4) is None


@pytest.mark.parametrize(("rows", "batch_size", "width"), [(10, 4096, 16), (20, 8, 8), (20, 12, 16)])
def test_the_evaluator_embeds_in_chunks_of_its_batch_or_of_a_smaller_split(rows, batch_size, width):
    """A split smaller than `eval.batch_size` is one chunk of its own rows (not padded to
    the batch: a study's 256 validation pairs against 4,096), each chunk a multiple of
    the 8 devices."""
    import flax.struct

    from contrastive_jax import sharding
    from contrastive_jax.evaluation import evaluator

    @flax.struct.dataclass
    class State:
        params: dict
        batch_stats: dict
        apply_fn: object = flax.struct.field(pytree_node=False)

    traced = []

    def apply_fn(variables, a, b, train):
        traced.append(a.shape)  # once per chunk width (jit traces each width once)
        return {"za": a * variables["params"]["scale"], "zb": b}

    arrays = {"a": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3), "b": np.ones((rows, 3), np.float32)}
    evaluate = evaluator.Evaluator(sharding.make_mesh(8), arrays, batch_size=batch_size, recall_ks=(1,))
    z = evaluate.embed(State({"scale": np.float32(2)}, {}, apply_fn), arrays)
    assert traced == [(width, 3)]
    np.testing.assert_array_equal(z["za"], 2 * arrays["a"])


def test_input_ceilings_count_repeated_answers_and_identical_queries_against_the_ceiling():
    """Five pictures, captions A A B C C' where C' == C: a picture whose caption repeats
    ties with the twin (ties count against it): 1 of 5 right image -> caption (B); of
    the identical caption queries one each is right, and B: 3 of 5 back."""
    pictures = np.arange(5 * 4, dtype=np.float32).reshape(5, 2, 2)  # all different
    captions = np.array([[1, 2], [1, 2], [3, 4], [5, 6], [5, 6]])
    assert metrics.input_ceilings(pictures, captions) == {"a_to_b": 0.2, "b_to_a": 0.6}
    assert metrics.input_ceilings(pictures, pictures) == {"a_to_b": 1.0, "b_to_a": 1.0}
    # a perfect model reaches it: each picture embeds as its caption, identical captions alike
    z = np.eye(5)[[0, 0, 1, 2, 2]]
    assert np.mean(metrics.cross_view_ranks(z, z) == 0) == 0.2
