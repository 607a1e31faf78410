"""experiments/lib/target_steps.py: steps to a validation target interpolated between
evaluations, each N's best rate over every seed it has, and the figure."""

import math

import numpy as np
import pytest

from experiments.lib import target_steps


def test_steps_to_target_interpolates_between_evaluations():
    curve = np.array([[10.0, 0.5], [20.0, 0.9], [30.0, 0.95]])
    assert target_steps.steps_to_target(curve, 0.7) == pytest.approx(15.0)
    assert target_steps.steps_to_target(curve, 0.25) == pytest.approx(5.0)  # from step 0 at R@1 0
    assert target_steps.steps_to_target(curve, 0.9) == pytest.approx(20.0)
    assert target_steps.steps_to_target(curve, 0.99) is None


def test_curves_panel_draws_every_seed_at_each_n_chosen_rate_even_one_that_misses(rising_record):
    # N = 1,024 reaches no target on the mean of its seeds: its seeds' curves are drawn all the same
    records = [rising_record(256, 2.0, seed, 300) for seed in (0, 1, 2)] + [
        rising_record(256, 4.0, 0, 200),
        rising_record(1024, 4.0, 0, 100, top=0.95),
        rising_record(1024, 4.0, 1, 100, top=0.1),
        {**rising_record(1024, 4.0, 0, 50), "loss": "dcl"},  # the control is not drawn
    ]
    axes = target_steps.plot(records, [0.9], train_size=25_600, floor=0.0, rates={256: 2.0, 1024: 4.0})[
        "steps_to_target"
    ].axes
    lines = axes[1].get_lines()
    assert [line.get_xdata()[-1] for line in lines] == pytest.approx([3, 3, 3, 4, 4])  # steps * N / train size
    labels = [line.get_label() for line in lines if not line.get_label().startswith("_")]
    assert labels == ["N=256, f=2 (3 seeds)", "N=1,024, f=4 (2 seeds)"]


def test_best_runs_take_the_fewest_mean_steps_over_every_seed_and_mark_the_grid_edge(rising_record):
    records = [
        rising_record(256, 1.0, 0, 200),  # fastest, but run with one seed of the three
        rising_record(256, 2.0, 0, 300),
        rising_record(256, 2.0, 1, 340),
        rising_record(256, 2.0, 2, 320),
        rising_record(256, 4.0, 0, 380),
        rising_record(256, 4.0, 1, 380),
        rising_record(256, 4.0, 2, 380),
        rising_record(1024, 1.0, 0, 200),
        rising_record(1024, 4.0, 0, 90),
        {
            **rising_record(1024, 4.0, 1, 90),
            "curves": {f"eval/{m}": [[45, 0.1], [90, 0.2]] for m in target_steps.METRICS},
        },
        {**rising_record(256, 2.0, 0, 10), "loss": "dcl"},  # the control is not a candidate
    ]
    best = target_steps.best_runs(records, 0.9)
    assert best[256]["lr_factor"] == 2.0 and best[256]["steps"] == pytest.approx(320.0) and not best[256]["edge"]
    assert best[256]["seeds"] == 3 and best[256]["by_seed"] == {0: 300, 1: 340, 2: 320}
    # 95% t-interval over 3 seeds: t(0.975, 2) = 4.303 times the standard error (sd 20)
    assert best[256]["interval"] == pytest.approx(4.3027 * 20 / math.sqrt(3), rel=1e-4)
    # f = 4 at 1,024 misses the target in seed 1 and f = 1 has one seed of two: no rate
    assert 1024 not in best
    assert target_steps.best_runs(records[:-3], 0.9)[1024] | {"interval": 0} == {
        "lr_factor": 1.0, "steps": 200, "seeds": 1, "std": 0, "interval": 0, "by_seed": {0: 200}, "edge": True
    }  # fmt: skip
