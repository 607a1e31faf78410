"""experiments/studies/critical_batch_study.py: the grid, McCandlish's fit, the choice of the
tuned rate, and --quick end to end (resumable: a rerun trains and measures
nothing again)."""

import json
import math
import shutil

import numpy as np
import pytest

from experiments.lib import intervals, target_steps, tasks
from experiments.studies import critical_batch_study as study


def test_grid_tunes_the_rate_per_batch_at_the_same_epochs():
    run_args = {"epochs": study.EPOCHS, "train_size": target_steps.FIT_PAIRS}
    runs = study.tuning_runs(study.BATCH_SIZES, study.LR_FACTORS, 0, **run_args)
    assert len(runs) == 5 * 4 and len({r.name for r in runs}) == len(runs)
    for run in runs:
        n, factor = run.tags["batch_size"], run.tags["lr_factor"]
        assert run.overrides["train.num_train_steps"] == math.ceil(6 * 108_000 / n)
        assert run.overrides["optim.learning_rate"] == pytest.approx(1e-3 * math.sqrt(n / 256) * factor)
        assert run.overrides["eval.every_steps"] == round(108_000 / n / 2)  # twice an epoch
        assert "loss.name" not in run.overrides and run.tags["seed"] == 0
    linear = [r for r in runs if r.tags["batch_size"] == 4096 and r.tags["lr_factor"] == 4.0][0]
    assert linear.overrides["optim.learning_rate"] == pytest.approx(1e-3 * 4096 / 256)  # linear scaling
    assert target_steps.SPLITS == {"data.train_split": "fit", "eval.split": "validation"}  # never the test split
    control = study.study_run(1024, 2.0, 1, loss="dcl", **run_args)
    assert control.overrides["loss.name"] == "dcl" and control.tags["loss"] == "dcl"
    assert control.name == "dcl_n1024_lr2_s1" and not target_steps.is_clip(control.tags)


def test_shapes_task_tunes_its_own_rates_on_validation_pictures():
    task, (full, _) = tasks.TASKS["shapes"], study.PRESETS["shapes"]
    assert task.config == "clip_shapes" and task.overrides["data.train_split"] == "train"
    assert task.overrides["eval.split"] == "validation[:1000]" and full["final_split"] == "test[:1000]"
    assert full["train_size"] == 54_000  # shapes.split_sizes(60,000)["train"]
    run_args = {"epochs": full["epochs"], "train_size": full["train_size"]}
    runs = study.tuning_runs(full["batch_sizes"], full["lr_factors"], 0, **run_args)
    assert len(runs) == 3 * 5 and full["lr_factors"][-1] == 16.0 and full["seeds"] == [0, 1, 2]
    for run in runs:
        n, factor = run.tags["batch_size"], run.tags["lr_factor"]
        assert run.overrides["train.num_train_steps"] == math.ceil(8 * 54_000 / n)
        assert run.overrides["optim.learning_rate"] == pytest.approx(1e-3 * math.sqrt(n / 256) * factor)
        assert run.tags["learning_rate"] == run.overrides["optim.learning_rate"]


def test_other_seeds_repeat_the_rates_best_at_some_target(rising_record):
    # N = 256: f = 2 best at both targets; N = 1,024: f = 4 at the low one, f = 2 at the high one
    records = [
        rising_record(256, 1.0, 0, 400),
        rising_record(256, 2.0, 0, 300),
        rising_record(1024, 2.0, 0, 100, top=0.95),
        rising_record(1024, 4.0, 0, 90),
    ]
    factors = study.replicated_factors(records, [0.5, 0.92])
    assert factors == {256: [2.0], 1024: [2.0, 4.0]}
    runs = study.replicate_runs(factors, [1, 2], epochs=1.0, train_size=4096)
    assert [(r.tags["seed"], r.tags["batch_size"], r.tags["lr_factor"]) for r in runs] == [
        (1, 256, 2.0), (1, 1024, 2.0), (1, 1024, 4.0), (2, 256, 2.0), (2, 1024, 2.0), (2, 1024, 4.0)
    ]  # fmt: skip
    assert study.control_factors(records, [0.5, 0.92]) == {256: 2.0, 1024: 2.0}  # the middle target's best
    # an N that reaches no target: the factor ending at the highest validation R@1, the smaller on a tie
    missing = [
        rising_record(4096, 8.0, 0, 100, top=0.3),
        rising_record(4096, 4.0, 0, 100, top=0.2),
        rising_record(4096, 1.0, 0, 100, top=0.3),
    ]
    assert study.control_factors(records + missing, [0.5, 0.92]) == {256: 2.0, 1024: 2.0, 4096: 1.0}


def test_mccandlish_fit_recovers_a_closed_form_curve():
    s_min, e_min = 120.0, 300_000.0
    ns = [256, 512, 1024, 2048, 4096]
    fit = study.fit_mccandlish(ns, [s_min + e_min / n for n in ns])
    assert fit["s_min"] == pytest.approx(s_min) and fit["e_min"] == pytest.approx(e_min)
    assert fit["b_crit"] == pytest.approx(2500.0) and fit["max_residual"] < 1e-9
    # ... which is the model's (S / S_min - 1)(E / E_min - 1) = 1 at every N
    for n in ns:
        steps = s_min + e_min / n
        assert (steps / s_min - 1) * (n * steps / e_min - 1) == pytest.approx(1.0)


def test_bcrit_interval_fits_each_seed():
    s_min, e_min = 50.0, 100_000.0
    ns = [1024, 2048, 4096]
    best = {
        n: {"steps": s_min + e_min / n, "by_seed": {s: s_min * (1 + 0.1 * s) + e_min / n for s in (0, 1, 2)}}
        for n in ns
    }
    text = study._fits(best)
    per_seed = [e_min / (s_min * (1 + 0.1 * s)) for s in (0, 1, 2)]
    assert f"B_crit = {', '.join(f'{b:,.0f}' for b in per_seed)} (seeds 0, 1, 2)" in text
    assert f"mean {np.mean(per_seed):,.0f} ± {intervals.t_interval(per_seed):,.0f} (95%)" in text
    assert text.count("McCandlish's") == 1  # 1,024 needs the fewest examples: the second fit would repeat the first


def test_final_table_reads_the_seeds_the_ceiling_and_the_paired_differences():
    queries = 1000
    rng = np.random.default_rng(0)
    base = rng.random(queries) < 0.85
    records, final = [], {}
    # CLIP at 256 and 512 (two seeds each), DCL at 256 (one seed): N = 512 and DCL are
    # right on 20 more queries per seed than CLIP at 256, both ways.
    for loss, n, seeds, extra in (("clip", 256, (0, 1), 0), ("clip", 512, (0, 1), 20), ("dcl", 256, (0,), 20)):
        for seed in seeds:
            hits = base.copy()
            hits[np.flatnonzero(~base)[: extra + 10 * seed]] = True  # seed 1: 10 more
            name = f"{loss}_n{n}_s{seed}"
            records.append({"name": name, "batch_size": n, "seed": seed, "lr_factor": 2.0, "loss": loss})
            final[name] = {"a_to_b": hits, "b_to_a": hits, "a_to_b/ceiling": 0.93, "b_to_a/ceiling": 0.98}
    # a rate chosen earlier (its hits cached) is not the N's rate now: left out
    records.append({"name": "clip_n256_lr4_s0", "batch_size": 256, "seed": 0, "lr_factor": 4.0, "loss": "clip"})
    final["clip_n256_lr4_s0"] = {"a_to_b": ~base, "b_to_a": ~base, "a_to_b/ceiling": 0.93, "b_to_a/ceiling": 0.98}
    text = study._final_table(records, final, {256: 2.0, 512: 2.0})
    clip_256 = [base.mean(), base.mean() + 0.01]
    mean_256, mean_512 = np.mean(clip_256), np.mean(clip_256) + 0.02
    assert (
        f"| CLIP | 256 | 2 | 2 | {mean_256:.3f} ± {intervals.t_interval(clip_256):.3f} | {0.93 - mean_256:.3f} |"
        in text
    )
    assert f"| CLIP | 512 | 2 | 2 | {mean_512:.3f} ± " in text
    assert f"| DCL | 256 | 2 | 1 | {base.mean() + 0.02:.3f} | {0.93 - base.mean() - 0.02:.3f} |" in text
    assert "0.930 a_to_b, 0.980 b_to_a" in text
    seed_mean = {key: np.mean([final[f"{key}_s{seed}"]["a_to_b"] for seed in seeds], axis=0) for key, seeds in
                 (("clip_n256", (0, 1)), ("clip_n512", (0, 1)), ("dcl_n256", (0,)))}  # fmt: skip
    for row, x, y in (
        ("CLIP 512 - CLIP 256", "clip_n512", "clip_n256"),
        ("DCL 256 - CLIP 256", "dcl_n256", "clip_n256"),
    ):
        difference, low, high = intervals.paired_bootstrap(seed_mean[x], seed_mean[y])
        assert 0 < low < difference < high
        cell = f"{difference:+.4f} [{low:+.4f}, {high:+.4f}]"
        assert f"| {row} | {cell} | {cell} |" in text
    assert "| DCL 256 - CLIP 256 | +0.0150 [" in text  # 20 more queries than seed 0, 10 more than seed 1
    # over the seeds (Welch): 512 - 256 is +0.02 with two seeds 0.01 apart on each side: resolved
    # over the queries above, not over the seeds; DCL has one seed
    welch = intervals.welch_interval([base.mean() + 0.02, base.mean() + 0.03], clip_256)
    cell = f"{intervals.difference_cell(*welch)}, {intervals.verdict(*welch[1:])}"
    assert f"| CLIP 512 - CLIP 256 | {cell} | {cell} |" in text and cell.endswith("], not resolved")
    assert "| DCL 256 - CLIP 256 | +0.0150 [n/a], not resolved |" in text


@pytest.mark.e2e
def test_quick_measures_steps_and_noise_and_resumes(tmp_path, cmudict_data_dir, capsys):
    args = ["--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    records = study.main(args)
    tuning = sorted((r["batch_size"], r["lr_factor"]) for r in records if r["seed"] == 0 and target_steps.is_clip(r))
    assert tuning == [(64, 1.0), (64, 4.0), (128, 1.0), (128, 4.0)]
    replicated = study.replicated_factors([r for r in records if r["seed"] == 0], study.QUICK["targets"])
    assert sorted((r["batch_size"], r["lr_factor"]) for r in records if r["seed"] == 1 and target_steps.is_clip(r)) == [
        (n, f) for n, fs in replicated.items() for f in fs
    ]
    assert sorted((r["seed"], r["batch_size"]) for r in records if not target_steps.is_clip(r)) == [(0, 128), (1, 128)]
    for record in records:
        curve = target_steps.validation_curve(record)
        assert len(curve) == 2 * 2 and np.all((0 <= curve[:, 1]) & (curve[:, 1] <= 1))  # 2 epochs, 2 evals each
    noise = json.loads((tmp_path / "noise.json").read_text())
    assert noise and all(entry["n"] == 128 for entry in noise.values())
    assert all(np.isfinite(entry["trace_sigma"]) and entry["trace_sigma"] > 0 for entry in noise.values())
    summary = (tmp_path / "summary.md").read_text()
    assert "B_crit" in summary and "replicate noise scale" in summary and "DCL against CLIP" in summary
    assert (tmp_path / "steps_to_target.png").stat().st_size > 0
    final = json.loads((tmp_path / "final.json").read_text())  # every seed at each N's rate, on test[:256]
    rates = study.control_factors(records, study.QUICK["targets"])
    assert sorted(final) == sorted(r["name"] for r in records if r["lr_factor"] == rates[r["batch_size"]])
    assert all(entry["queries"] == 256 and 0.9 < entry["a_to_b/ceiling"] <= 1 for entry in final.values())
    assert "The test split, read once" in summary and "DCL 128 - CLIP 128" in summary
    capsys.readouterr()
    assert json.loads(json.dumps(study.main(args))) == json.loads(json.dumps(records))
    out = capsys.readouterr().out
    assert out.count("finished earlier, skipped") == len(records) and "[noise]" not in out and "[hits]" not in out
    # a fresh clone: the workdirs gone, the committed results.json stands in for them
    for workdir in (tmp_path / "runs").iterdir():
        shutil.rmtree(workdir)
    assert json.loads(json.dumps(study.main(args))) == json.loads(json.dumps(records))
    out = capsys.readouterr().out
    assert out.count("read from") == len(records) and "training" not in out and "[noise]" not in out
    # --hours spent: a third seed's runs do not start; the report holds what finished
    budgeted = study.main([*args, "--seeds", "0,1,2", "--hours", "0"])
    out = capsys.readouterr().out
    assert json.loads(json.dumps(budgeted)) == json.loads(json.dumps(records)) and "training" not in out
    # seed 2: the chosen rate at each N and the DCL control
    assert out.count("not started") == len(study.QUICK["batch_sizes"]) + len(study.QUICK["control_batch_sizes"])


@pytest.mark.e2e
def test_quick_shapes_writes_its_pictures_and_measures_steps(tmp_path):
    data_dir = tmp_path / "data"
    args = ["--task", "shapes", "--quick", "--out", str(tmp_path / "out"), "--data-dir", str(data_dir)]
    records = study.main(
        [*args, "--seeds", "0", "--batch-sizes", "64", "--lr-factors", "1", "--control-batch-sizes", ""]
    )
    assert [(r["batch_size"], r["lr_factor"], r["learning_rate"]) for r in records] == [(64, 1.0, 1e-3 / 2)]
    assert (data_dir / "shapes-v2-32px-1500" / "metadata.json").exists()  # 1,500 pictures at 32 px, generator v2
    curve = target_steps.validation_curve(records[0])
    assert len(curve) == 2 * 2 and np.all((0 <= curve[:, 1]) & (curve[:, 1] <= 1))  # 2 epochs of 1,024, 2 evals each
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith("# The critical batch on the generated image-text set") and "replicate" not in summary
    final = json.loads((tmp_path / "out" / "final.json").read_text())
    assert [entry["queries"] for entry in final.values()] == [64]  # test[:64]
    ceiling = json.loads((tmp_path / "out" / "ceiling.json").read_text())  # computed: the set has no match keys
    assert ceiling["split"] == "test[:64]" and 0 < ceiling["a_to_b"] <= 1 and 0 < ceiling["b_to_a"] <= 1
