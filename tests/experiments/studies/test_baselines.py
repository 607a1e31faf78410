"""experiments/studies/baselines.py: the linear CCA, and the committed digits number it reproduces."""

import json

import numpy as np
import pytest

from experiments.studies import baselines


def test_linear_cca_recovers_the_canonical_correlations():
    # Views sharing two latent signals with correlations 0.9 and 0.5, plus independent noise
    # dimensions, each view mixed by a random linear map (CCA is invariant to it).
    rng = np.random.default_rng(0)
    n = 50_000
    z = rng.normal(size=(n, 2))
    x_latent = np.concatenate([z, rng.normal(size=(n, 3))], axis=1)
    rho = np.array([0.9, 0.5])
    y_signal = rho * z + np.sqrt(1 - rho**2) * rng.normal(size=(n, 2))
    y_latent = np.concatenate([y_signal, rng.normal(size=(n, 2))], axis=1)
    x, y = x_latent @ rng.normal(size=(5, 5)), y_latent @ rng.normal(size=(4, 4))
    project_x, project_y, correlations = baselines.linear_cca(x, y, dim=3, reg=1e-6)
    np.testing.assert_allclose(correlations[:2], rho, atol=0.01)
    assert correlations[2] < 0.02
    # The variates are uncorrelated within a view, with the correlations between views.
    u, v = project_x(x), project_y(y)
    np.testing.assert_allclose(np.corrcoef(u.T), np.eye(3), atol=0.01)
    np.testing.assert_allclose(np.diag(np.corrcoef(u.T, v.T)[:3, 3:]), correlations, atol=0.01)


def test_digits_baseline_reproduces_the_committed_result():
    committed = json.loads((baselines.OUT / "results.json").read_text())["datasets"]["sklearn_digits"]
    result = baselines.digits_baseline()
    for key in ("a_to_b/R@1", "a_to_b/R@10", "b_to_a/R@1", "train_pairs", "test_pairs"):
        assert result[key] == committed[key], key


@pytest.mark.slow
def test_quick_run_writes_both_baselines(tmp_path):
    baselines.main(["--quick", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["datasets"]["cmudict"]["train_pairs"] == baselines.QUICK_TRAIN_SIZE
    assert 0 < results["datasets"]["cmudict"]["a_to_b/R@1"] <= 1
    assert "| cmudict |" in (tmp_path / "results.md").read_text()
