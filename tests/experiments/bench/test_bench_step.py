"""`experiments/bench/bench_step.py`: the largest batch's extrapolation, the report's ratios,
and the whole command at toy sizes on the CPU (`--tiny`: the code an accelerator runs)."""

import json
import os
import subprocess
import sys

import pytest

from experiments import REPO
from experiments.bench import bench_step
from experiments.bench.bench_step_worker import largest_batch, model_flops_per_example


def test_largest_batch_extrapolates_the_memory_to_the_limit():
    # 2 GiB of state, 40 MiB per example: 10 GiB hold (10 - 2) GiB / 40 MiB = 204.8 examples.
    gib, mib = 2**30, 2**20
    assert largest_batch(2 * gib + 256 * 40 * mib, 2 * gib + 128 * 40 * mib, 256, 10 * gib) == 200
    assert largest_batch(2 * gib + 256 * 40 * mib, 2 * gib + 128 * 40 * mib, 256, 10 * gib, multiple=1) == 204
    assert largest_batch(100, 100, 64, 50) == 8  # nothing fits: the smallest multiple, which the run then refuses


@pytest.mark.parametrize("image_size, context_length", [(224, 77), (64, 9)])
def test_model_flops_are_xla_s_count_of_the_forward_on_the_cpu_times_three(image_size, context_length):
    """The hand count against XLA's on the CPU (which counts every dot; on a GPU its cost
    analysis leaves out the library calls), at ViT-B/16's widths, one block a tower: XLA
    adds the elementwise work, about 2% at these widths."""
    import jax
    import jax.numpy as jnp

    from contrastive_jax.models.released import open_clip_layout
    from contrastive_jax.models.transformer import TowerSettings

    settings = open_clip_layout.Settings(
        image_size=image_size, patch_size=16, image=TowerSettings(768, 1, 12, 3072),
        context_length=context_length, vocab_size=100, text=TowerSettings(512, 1, 8, 2048), embed_dim=512,
    )  # fmt: skip
    model = open_clip_layout.Model(settings=settings)
    images = jnp.zeros((4, image_size, image_size, 3))
    tokens = jnp.ones((4, context_length), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), images, tokens)
    cost = jax.jit(model.apply).lower(params, images, tokens).compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"] / 4
    assert 0.97 <= model_flops_per_example(settings) / 3 / xla <= 1.0  # 0.98 here


def _results():
    point = {"largest": False, "peak_bytes": 2**30, "first_loss": 5.5}
    return {
        "environment": {
            "machine": "x86_64 16 cores", "python": "3.12", "versions": {"jax": "0.11"}, "load_average_start": 1.0
        },
        "load_average_end": 2.0,
        "sizes": {"embed_dim": 512},
        "peak": {"gflops": 800_000.0, "device_kind": "NVIDIA H100", "platform": "gpu", "n": 8192},
        "step": [
            {"framework": "jax", "remat": "none", "model_flops_per_example": 1e11, "points": [
                dict(point, batch=256, images_per_second=3000.0),
                dict(point, batch=1024, largest=True, images_per_second=3200.0)]},
            {"framework": "torch", "remat": "none", "points": [dict(point, batch=256, images_per_second=1500.0)],
             "largest_error": "batch 1584: RuntimeError: no kernel"},
            {"framework": "jax", "remat": "full", "points": [], "attention_fallback": "cuDNN's attention failed"},
            {"error": "exit 1: out of memory"},
        ],
        "loss": {
            "ours": {
                "siglip": {"seconds": 0.05, "peak_bytes": 2**30, "value": 1.0}, "clip": {"seconds": 0.1, "value": 2.0},
                "siglip_pallas": {"seconds": 0.03, "value": 1.0}, "clip_pallas": {"error": "LoweringError: no"},
            },
            "theirs": {
                "siglip_kernel": {"seconds": 0.04, "peak_bytes": 2**29, "value": 1.0}, "inf_cl": {"seconds": 0.2}
            },
        },
        "input": {"images_per_second": 4500.0},
    }  # fmt: skip


def test_report_gives_the_ratios_the_issue_asks_for():
    text = bench_step.report(_results())
    assert "ours ÷ open_clip images/s at the common batch **2.00**" in text  # 3,000 / 1,500
    assert "| contrastive_jax | none | 256 | 3,000 | 38% |" in text  # 1e11 x 3,000 / 8e14
    assert "| contrastive_jax | none | 1,024 (largest) | 3,200 |" in text
    assert "| exit 1: out of memory |" in text  # a failed measurement is shown, not dropped
    assert "| open_clip | none | largest failed: batch 1584: RuntimeError: no kernel |" in text
    assert "| contrastive_jax | full | cuDNN's attention failed |" in text
    assert "| siglip vs siglip_kernel | 0.0500 | 0.0400 | 1.25 | 1.00 GiB | 0.50 GiB |" in text
    assert "| siglip_pallas vs siglip_kernel | 0.0300 | 0.0400 | 0.75 |" in text
    assert "| clip_pallas vs inf_cl | LoweringError: no |" in text  # a kernel Triton refused, shown
    assert "pipeline 4,500 images/s ÷ the step's 3,000 = **1.50**" in text


@pytest.mark.parametrize(
    "parts, expected",
    [
        (("step",), [("jax_step", "none"), ("torch_step", "none")]),
        (("remat",), [("jax_step", "full"), ("torch_step", "full")]),
        (
            ("step", "loss", "input", "remat"),
            [("jax_step", "none"), ("torch_step", "none"), "jax_loss", "torch_loss", "input"]
            + [("jax_step", "full"), ("torch_step", "full")],
        ),
    ],
)
def test_the_plan_runs_the_parts_asked_the_most_wanted_first(parts, expected):
    """`--parts remat` runs the steps with remat alone (what a second GPU call needs)."""
    shared = {"records": "records"}
    planned = [
        spec["worker"] if "remat" not in spec else (spec["worker"], spec["remat"])
        for _, spec, _ in bench_step.plan(bench_step.TINY, parts, shared)
    ]
    assert planned == expected


@pytest.mark.slow
def test_the_command_runs_at_toy_sizes_on_the_cpu(tmp_path):
    """The whole benchmark, every part, as the accelerator runs it (3 minutes here)."""
    command = [sys.executable, "-m", "experiments.bench.bench_step", "--tiny", "--out", str(tmp_path)]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # as a user runs it: not the tests' 8 devices
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=900)
    results = json.loads((tmp_path / "results.json").read_text())
    assert not [run for run in results["step"] if "error" in run], results["step"]
    jax_runs = [run for run in results["step"] if run["framework"] == "jax"]
    torch_runs = [run for run in results["step"] if run["framework"] == "torch"]
    for ours, theirs in zip(jax_runs, torch_runs):
        common, largest = ours["points"]
        assert largest["largest"] and largest["batch"] > common["batch"]
        # The same weights (open_clip's, loaded by the released layout), the same first
        # batch: the same first loss, to bfloat16's rounding.
        assert common["first_loss"] == pytest.approx(theirs["points"][0]["first_loss"], rel=2e-2)
    assert jax_runs[0]["points"][1]["batch"] > results["sizes"]["images"]  # the record set's batch repeated
    assert jax_runs[0]["parts"]["step_over_towers_and_loss"] > 0
    ours = results["loss"]["ours"]
    assert ours["siglip"]["value"] > 0 and "note" in results["loss"]["theirs"]
    for name in ("siglip", "clip"):  # "pallas" on the CPU: XLA's tiles (no Pallas lowering there)
        assert ours[f"{name}_pallas"]["value"] == pytest.approx(ours[name]["value"], rel=1e-6)
    assert results["input"]["images_per_second"] > 0
    assert results["overhead_cpu"]["devices"] == 8 and results["overhead_cpu"]["batch"] == 256
    assert "ours ÷ open_clip images/s" in (tmp_path / "results.md").read_text()


def test_a_partial_run_reports_what_it_measured():
    """The report is rewritten after each measurement: the loss's second half not yet run."""
    results = _results()
    results["loss"] = {"ours": results["loss"]["ours"]}
    assert "theirs: not measured" in bench_step.report(results)
