"""experiments/studies/batch_schedule.py: each arm's run (its schedule, rate rule and
cadence reaching the config), the examples a run read by its stages, the ratio to the best
constant batch against a hand-computed example, the report, the constant records' check,
bad options, and --quick end to end (both arms and a constant N; a rerun trains nothing)."""

import argparse
import json
import math

import numpy as np
import pytest

from experiments.lib import constant_rate, intervals, target_steps
from experiments.studies import batch_schedule as study

RUN_ARGS = {"train_size": 108_000, "max_epochs": 16.0, "eval_examples": 32_768}
FULL = argparse.Namespace(**study.FULL)
STAGES, NOISE = study.arms(FULL)


def test_each_arm_s_schedule_rate_rule_and_cadence_reach_the_config(load_config):
    """Both arms start at 512 with the constant-rate protocol's overrides at 4,096's
    cadence (validation every 8 steps), the first stage's rate, the sqrt rule; stages: the
    schedule string and the cap at 16 epochs of its stages; noise: the rule's fields.
    (Mutations, each red: lr_scaling not passed; the noise fields left out; the cap at the
    first batch for the stages.)"""
    from contrastive_jax.config_lib import override
    from contrastive_jax.training import batch_schedule

    run = STAGES.run(512, 3, 1, **RUN_ARGS)
    plain = constant_rate.study_run(4096, 3, 1, **RUN_ARGS)
    assert run.name == "stages_n512_k3_s1"
    # 16 epochs: 16,384 + 65,536 examples by step 64, then (1,728,000 - 81,920) / 4,096 = 401.9 steps more
    assert run.tags["max_steps"] == 64 + 402 and STAGES.largest == 4096
    config = override(load_config("cmudict_clip"), run.overrides)
    assert config.train.batch_schedule == "512@0,2048@32,4096@64" and config.optim.lr_scaling == "sqrt"
    assert (config.train.global_batch_size, config.train.num_train_steps) == (512, 466)
    assert config.optim.learning_rate == pytest.approx(1e-3 * 2**1.5) and config.optim.warmup_steps == 20
    assert config.eval.every_steps == 8 == plain.overrides["eval.every_steps"] and config.optim.schedule == "constant"
    settings = batch_schedule.parse(config.train.batch_schedule, config.train.global_batch_size)
    assert settings.stages.stages == ((0, 512), (32, 2048), (64, 4096))
    noise = override(load_config("cmudict_clip"), NOISE.run(512, 4, 2, **RUN_ARGS).overrides)
    assert (noise.train.batch_schedule, noise.train.log_noise_scale, noise.train.batch_max) == ("noise", True, 4096)
    assert (noise.train.batch_noise_factor, noise.train.batch_noise_window_steps) == (1.0, 16)
    assert (noise.train.num_train_steps, noise.optim.lr_scaling, noise.eval.every_steps) == (3375, "sqrt", 8)
    assert (
        NOISE.run(512, 4, 2, **RUN_ARGS).tags["arm"] == "noise" and run.tags["schedule"] == config.train.batch_schedule
    )


def test_an_arm_s_patience_is_the_first_batch_s_in_examples():
    """Validated 8 times as often as N = 512's constant runs, an arm waits 8 x 12
    evaluations without a new best before it stops. (Mutation: PATIENCE_EVALS
    evaluations: red.)"""
    assert STAGES.patience == NOISE.patience == 8 * constant_rate.PATIENCE_EVALS

    def stalled(flat):  # R@1 up to 0.85 at the 10th evaluation, then `flat` evaluations at 0.84
        values = [0.085 * (i + 1) for i in range(10)] + [0.84] * flat
        return np.array([[8 * (i + 1), v] for i, v in enumerate(values)])

    assert not STAGES.stops(stalled(95), 0.86) and STAGES.stops(stalled(96), 0.86)
    assert (
        constant_rate.finished(stalled(12), 0.86)
        and STAGES.stops(stalled(0), 0.85)
        and not STAGES.stops(stalled(0)[:9], 0.85)
    )


def test_examples_follow_each_run_s_stages():
    """Examples by step = the trainer's `Stages.examples_before`; a noise run's stages from
    its logged decisions; a constant N's one stage. (Mutations, each red: a stage's steps
    counted from its own step + 1; a decision's batch from its step rather than after it.)"""
    from contrastive_jax.data.batch_numbering import Stages

    stages = study.stage_list("512@0,2048@32,4096@64")
    steps = np.arange(0, 200)
    expected = [Stages(tuple(stages)).examples_before(int(s)) for s in steps]
    np.testing.assert_array_equal(study.examples_at(stages, steps), expected)
    assert study.examples_at(stages, [40]) == [32 * 512 + 8 * 2048]
    decisions = [[16, 512.0], [32, 1024.0], [48, 1024.0], [64, 2048.0]]
    noise = {"batch_size": 512, "schedule": "noise", "curves": {study.DECISIONS: decisions}}
    assert study.record_stages(noise) == [(0, 512), (32, 1024), (64, 2048)]
    assert study.record_stages({"batch_size": 256}) == [(0, 256)]
    curve = [[32, 0.4], [48, 0.8]]  # 0.6 at step 40: 32 x 512 + 8 x 1,024 examples
    record = {**noise, "curves": {**noise["curves"], **{f"eval/{m}": curve for m in target_steps.METRICS}}}
    (converted,) = study.in_examples([record])
    assert target_steps.steps_to_target(target_steps.validation_curve(converted), 0.6) == 32 * 512 + 8 * 1024


def record(run, reached_at, every, top=0.9, decisions=None):
    """The record of `run` whose validation R@1 rises linearly from 0 to `top` at step
    `reached_at`, evaluated every `every` steps until it reaches it."""
    steps = range(every, every * math.ceil(reached_at / every) + 1, every)
    curve = [[s, min(top, top * s / reached_at)] for s in steps]
    curves = {f"eval/{m}": curve for m in target_steps.METRICS} | ({study.DECISIONS: decisions} if decisions else {})
    return {"name": run.name, **run.tags, "curves": curves}


REACHED = {512: [256, 320, 384], 1024: [128, 128, 160], 4096: [80, 88, 96], "stages": [96, 104, 112]}  # evaluated


def report_records():
    """Constant N = 512, 1,024, 4,096 and both arms at rate step 3, 3 seeds each, linear
    curves (`REACHED`); the noise arm at the stages' steps, doubling after 32 and 48."""
    constants = [record(constant_rate.study_run(n, 3, s, **RUN_ARGS), at, max(1, round(32_768 / n)))
                 for n in (512, 1024, 4096) for s, at in enumerate(REACHED[n])]  # fmt: skip
    decisions = [[16, 512], [32, 1024], [48, 2048], [64, 2048]]
    by_arm = {STAGES: [record(STAGES.run(512, 3, s, **RUN_ARGS), at, 8) for s, at in enumerate(REACHED["stages"])],
              NOISE: [record(NOISE.run(512, 3, s, **RUN_ARGS), at, 8, decisions=decisions)
                      for s, at in enumerate(REACHED["stages"])]}  # fmt: skip
    return constants, by_arm


def test_the_report_sets_each_arm_against_the_constants_with_the_fewest_steps_and_examples():
    """At R@1 0.86 (0.86 / 0.9 of each linear curve's step): the fewest steps at 4,096, the
    fewest examples at 1,024 (136,000 against 512's 157,000); each arm's ratios to those by
    `ratio_cell`; the stages' examples through 512, 2,048 and 4,096; the noise arm's batch
    path; the constants' targets under every peak and the protocol's line. (Mutation: the
    fewest examples chosen by steps: red.)"""
    constants, by_arm = report_records()
    text = study.summary(constants, by_arm, [0.8, 0.86], FULL, "the committed records")
    scale = 0.86 / 0.9
    stage_steps = [scale * at for at in REACHED["stages"]]
    stage_examples = [float(study.examples_at(study.stage_list(study.STAGES), s)) for s in stage_steps]
    assert stage_examples[1] == pytest.approx(16_384 + 65_536 + (scale * 104 - 64) * 4096)
    c4096 = [scale * at for at in REACHED[4096]]
    c1024 = [scale * at * 1024 for at in REACHED[1024]]
    assert "| arm | steps / N = 4,096's (the fewest steps) | examples / N = 1,024's (the fewest examples) |" in text
    cell = intervals.ratio_cell
    expected = f"| stages | {cell(stage_steps, c4096)} | {cell(stage_examples, c1024)} |"
    assert expected in text and "resolved" in expected
    assert f"| constant N = 1,024 | 3; 3 | {scale * 416 / 3:.0f} ± " in text
    assert f"| stages 512@0,2048@32,4096@64 | 3; 3 | {np.mean(stage_steps):.0f} ± " in text
    noise_examples = [float(study.examples_at([(0, 512), (32, 1024), (48, 2048)], s)) for s in stage_steps]
    assert f"| noise | {cell(stage_steps, c4096)} | {cell(noise_examples, c1024)} |" in text
    assert "s0: 512@0, 1,024@32, 2,048@48 (peak 0.900)" in text
    assert "Targets below every N's lowest peak (0.900" in text and "ran this protocol" in text
    assert text.count("## Validation R@1 ") == 2
    partial = study.summary(constants, {STAGES: by_arm[STAGES], NOISE: []}, [0.86], FULL, "x")  # --hours 0 midway
    assert "| noise | no run yet | no run yet |" in partial and "No run finished yet." in partial
    figure = study.curves_figure(constants, by_arm, 0.86)["curves"]
    assert len(figure.axes[0].lines) == 5 * 3 + 1  # 512, 4,096 (largest, fewest steps), 1,024, 2 arms; the target


def test_the_constant_records_must_be_this_protocol():
    """Another cadence, another cap or a missing seed is refused with the record or N
    named. (Mutation: the cadence unchecked: red.)"""
    constants, _ = report_records()
    assert "N = 512, 1,024, 4,096; 9 runs" in study.comparable(constants, FULL)
    other = constants[:1] + [dict(constants[1], curves={k: [[10, 0.5]] for k in constants[1]["curves"]})]
    with pytest.raises(ValueError, match="n512_k3_s1: not this protocol"):
        study.comparable(other, FULL)
    with pytest.raises(ValueError, match="n512_k3_s0: not this protocol"):
        study.comparable([dict(constants[0], max_steps=100)], FULL)
    with pytest.raises(ValueError, match=r"lack a seed of \[0, 1, 2\] at N = \[4096\]"):
        study.comparable(constants[:-1], FULL)


BAD_OPTIONS = {  # the error's words: the options after --quick
    "must start at step 0": ["--stages", "64@4"],
    "give 'N@step,...'": ["--stages", "64,128@4"],
    "--batch-max 128 be >= its N": ["--stages", "256@0"],
    "each run trains to its target or its cap": ["--steps", "5"],
}


@pytest.mark.parametrize("words", BAD_OPTIONS)
def test_a_bad_option_is_one_clear_error(words, capsys):
    """Each refused before anything runs, exit status 2, its words on stderr."""
    with pytest.raises(SystemExit, match="^2$"):
        study.main(["--quick", *BAD_OPTIONS[words]])
    assert words in capsys.readouterr().err


@pytest.mark.e2e
def test_quick_runs_both_arms_and_a_constant_n_and_reports_and_resumes(tmp_path, cmudict_data_dir, capsys):
    args = ["--quick", "--out", str(tmp_path), "--data-dir", cmudict_data_dir]
    by_arm = study.main(args)
    assert {r["batch_size"] for r in by_arm["constant"]} == {64} and all("arm" not in r for r in by_arm["constant"])
    for name, schedule in (("stages", "32@0,128@4"), ("noise", "noise")):
        assert {r["seed"] for r in by_arm[name]} == {0, 1} and len(by_arm[name]) >= 6  # and the edge runs
        for r in by_arm[name]:
            config = json.loads((tmp_path / "runs" / r["name"] / "config.json").read_text())
            assert (config["train"]["batch_schedule"], config["optim"]["lr_scaling"]) == (schedule, "sqrt")
            logged = dict(map(tuple, r["curves"]["train/global_batch"]))
            stages = study.record_stages(r)  # the batch logged at each step is the stages'
            assert all(n == next(b for s, b in reversed(stages) if s < step) for step, n in logged.items())
    assert all(len(r["curves"][study.DECISIONS]) == len(r["curves"]["batch/noise_scale"]) > 0 for r in by_arm["noise"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert len(saved) == sum(map(len, by_arm.values())) and {r.get("arm") for r in saved} == {None, "stages", "noise"}
    summary = (tmp_path / "summary.md").read_text()
    assert "Against the best constant batch" in summary and "run here under the same protocol" in summary
    assert "### noise: 32 doubling to 128 when B_simple > 1 x N, every 2 steps" in summary
    assert (tmp_path / "curves.png").stat().st_size > 0
    capsys.readouterr()
    assert json.loads(json.dumps(study.main(args))) == json.loads(json.dumps(by_arm))
    assert "training" not in capsys.readouterr().out
