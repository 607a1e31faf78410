"""Non-neural baselines for the paired-retrieval tasks: linear CCA, scored like the trainer.

Run (from the repository root):
  python -m experiments.studies.baselines            # both baselines, results committed
  python -m experiments.studies.baselines --quick    # CI: a subset of each training split

* `cmudict` (spelling <-> pronunciation, `configs/cmudict_clip.py`): TF-IDF of character
  1-3-grams of the spelling and of phoneme 1-3-grams of the pronunciation, each reduced
  to `TFIDF_SVD_DIM` dimensions by truncated SVD, then a linear CCA fit on the 121,490
  training pairs; the 13,676 test pairs are retrieved both ways with
  `metrics.cross_view_recall`, a retrieval being right when it is the query's own
  pronunciation (or spelling) string, as in training.
* `sklearn_digits` (top half <-> bottom half, `configs/default.py`): a linear CCA on the
  raw pixels of the 1,437 training images, retrieval among the 360 test images.

The same `linear_cca` fits both. Embeddings are the canonical variates, L2-normalised,
compared by cosine. The CCA is regularised (`cov + reg * mean variance * I`); its
dimension and regulariser are fixed below, not tuned on the test split.
Writes `results.json` and `results.md` to `--out` (default
`experiments/results/baselines/`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contrastive_jax.evaluation import metrics
from experiments import REPO, RESULTS

OUT = RESULTS / "baselines"
KS = (1, 5, 10)
TFIDF_SVD_DIM = 256  # TF-IDF features kept per view (truncated SVD)
CMUDICT_CCA_DIM = 128  # canonical variates used as the cmudict embedding
DIGITS_CCA_DIM = 16  # canonical variates used as the digits embedding (of 32 pixels)
CCA_REG = 1e-3  # ridge on each view's covariance, relative to its mean variance
QUICK_TRAIN_SIZE = 5_000  # --quick: training pairs used per dataset


def _inverse_sqrt(cov: np.ndarray, reg: float) -> np.ndarray:
    """`(cov + reg * mean(diag(cov)) * I)^(-1/2)` of a symmetric [F, F] matrix."""
    ridge = reg * np.mean(np.diag(cov))
    values, vectors = np.linalg.eigh(cov + ridge * np.eye(len(cov)))
    return (vectors / np.sqrt(values)) @ vectors.T


def linear_cca(x: np.ndarray, y: np.ndarray, *, dim: int, reg: float = CCA_REG):
    """Regularised linear CCA of paired views.

    Args:
      x: [n, Fx] and y: [n, Fy] training pairs (row i of each is one pair).
      dim: canonical directions kept (at most min(Fx, Fy)).
      reg: ridge added to each view's covariance, relative to its mean variance.

    Returns:
      `(project_x, project_y, correlations)`: functions mapping [m, Fx] / [m, Fy] to the
      [m, dim] canonical variates, and the [dim] canonical correlations (descending).
    """
    mean_x, mean_y = x.mean(axis=0), y.mean(axis=0)
    xc, yc = x - mean_x, y - mean_y
    n = len(x)
    whiten_x = _inverse_sqrt(xc.T @ xc / n, reg)
    whiten_y = _inverse_sqrt(yc.T @ yc / n, reg)
    u, s, vt = np.linalg.svd(whiten_x @ (xc.T @ yc / n) @ whiten_y)
    wx, wy = whiten_x @ u[:, :dim], whiten_y @ vt[:dim].T
    return (lambda a: (a - mean_x) @ wx), (lambda b: (b - mean_y) @ wy), s[:dim]


def _unit(z: np.ndarray) -> np.ndarray:
    return z / np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)


def cca_retrieval(train_a, train_b, test_a, test_b, *, dim, groups=(None, None)) -> dict[str, float]:
    """Fits `linear_cca` on the training pairs; R@K both ways on the test pairs.

    Args:
      train_a, train_b: [n, Fa], [n, Fb]; test_a, test_b: [m, Fa], [m, Fb].
      groups: the `cross_view_recall` groups of a -> b and b -> a ([m] ints or None).
    """
    project_a, project_b, correlations = linear_cca(train_a, train_b, dim=dim)
    za, zb = _unit(project_a(test_a)), _unit(project_b(test_b))
    out = {"cca_dim": dim, "top_correlation": float(correlations[0])}
    for name, query, gallery, group in (("a_to_b", za, zb, groups[0]), ("b_to_a", zb, za, groups[1])):
        recall = metrics.cross_view_recall(query, gallery, KS, groups=group)
        out |= {f"{name}/{k}": v for k, v in recall.items()}
    return out


def cmudict_baseline(train_size: int | None = None) -> dict:
    """TF-IDF n-grams + linear CCA on cmudict; `train_size` pairs of train (None: all)."""
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    from contrastive_jax.data.builtin import cmudict

    entries = cmudict.entries()
    train = [e for e in entries if cmudict.split_of(e.word) == "train"][:train_size]
    test = [e for e in entries if cmudict.split_of(e.word) == "test"]
    views = {
        "a": (TfidfVectorizer(analyzer="char_wb", ngram_range=(1, 3), sublinear_tf=True), lambda e: e.word),
        "b": (
            TfidfVectorizer(analyzer=lambda s: _ngrams(s.split(), 3), sublinear_tf=True),
            lambda e: " ".join(e.phonemes),
        ),
    }
    features = {}
    for side, (vectorizer, text) in views.items():
        svd = TruncatedSVD(TFIDF_SVD_DIM, random_state=0)
        features[f"train_{side}"] = svd.fit_transform(vectorizer.fit_transform([text(e) for e in train]))
        features[f"test_{side}"] = svd.transform(vectorizer.transform([text(e) for e in test]))
    groups = (np.array([e.pronunciation_id for e in test]), np.array([e.word_id for e in test]))
    out = cca_retrieval(
        features["train_a"],
        features["train_b"],
        features["test_a"],
        features["test_b"],
        dim=CMUDICT_CCA_DIM,
        groups=groups,
    )
    return {"train_pairs": len(train), "test_pairs": len(test), "tfidf_svd_dim": TFIDF_SVD_DIM, **out}


def _ngrams(tokens: Sequence[str], max_n: int) -> list[str]:
    """All 1..max_n-grams of a token list, each joined by spaces."""
    return [" ".join(tokens[i : i + n]) for n in range(1, max_n + 1) for i in range(len(tokens) - n + 1)]


def digits_baseline(train_size: int | None = None) -> dict:
    """Linear CCA on the raw pixels of the digits' top and bottom halves (default task)."""
    from sklearn import datasets

    from contrastive_jax.data.builtin import sklearn_digits

    # The pipeline's pixels: round(v * 255 / 16) / 255, rows 0-3 (a) and 4-7 (b).
    pixels = np.round(datasets.load_digits().images * (255 / 16)) / 255
    rows = sklearn_digits.split_indices()
    train, test = rows["train"][:train_size], rows["test"]
    top, bottom = pixels[:, :4].reshape(len(pixels), -1), pixels[:, 4:].reshape(len(pixels), -1)
    out = cca_retrieval(top[train], bottom[train], top[test], bottom[test], dim=DIGITS_CCA_DIM)
    return {"train_pairs": len(train), "test_pairs": len(test), **out}


def markdown(results: dict) -> str:
    """The results as a markdown table, one row per dataset."""
    header = ["dataset", "baseline", "train pairs", "test pairs", "CCA dim"] + [
        f"{d}/R@{k}" for d in ("a_to_b", "b_to_a") for k in KS
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, r in results["datasets"].items():
        cells = [name, r["baseline"], f"{r['train_pairs']:,}", f"{r['test_pairs']:,}", str(r["cca_dim"])]
        cells += [f"{r[f'{d}/R@{k}']:.3f}" for d in ("a_to_b", "b_to_a") for k in KS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(out: Path, *, quick: bool = False) -> dict:
    """Computes both baselines and writes `results.json` and `results.md` to `out`."""
    train_size = QUICK_TRAIN_SIZE if quick else None
    datasets = {}
    for name, baseline, fn in (
        ("cmudict", "TF-IDF char / phoneme 1-3-grams + linear CCA", cmudict_baseline),
        ("sklearn_digits", "linear CCA on raw pixels", digits_baseline),
    ):
        start = time.time()
        datasets[name] = {"baseline": baseline, **fn(train_size), "seconds": round(time.time() - start, 1)}
        print(name, json.dumps(datasets[name]))
    results = {"quick": quick, "datasets": datasets}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    return results


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"fit on {QUICK_TRAIN_SIZE} pairs per dataset")
    parser.add_argument("--out", type=Path, help="output folder (default: experiments/results/baselines)")
    args = parser.parse_args(argv)
    out = args.out or (REPO / "runs" / "experiments" / "baselines" if args.quick else OUT)
    run(out, quick=args.quick)
    print(f"results in {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
