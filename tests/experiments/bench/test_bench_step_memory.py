"""`experiments/bench/bench_step_memory.py`: the buffers live at a compiled step's peak, read
from XLA's dumps and sorted by what they are; the report's savings; the whole command at toy
sizes (slow)."""

import json
import os
import subprocess
import sys
import time

import pytest

from experiments import REPO
from experiments.bench import bench_step_memory, bench_step_memory_hlo

B, H, L, D = 4, 2, 64, 16
BACKWARD = "jit(train_step)/transpose(jvp(Model))"
ARGUMENT = bench_step_memory_hlo.ARGUMENT


def _peak_rows(tmp_path, recompute: bool) -> list[dict]:
    """The peak's buffers of the gradient of a one-layer attention, its probabilities
    recomputed in the backward pass or kept, compiled with the memory-minimising scheduler."""
    import jax
    import jax.numpy as jnp

    def attention(q, k, v):  # [B, H, L, D] each
        probabilities = jax.nn.softmax(jnp.einsum("bhld,bhmd->bhlm", q, k), axis=-1)
        return jnp.einsum("bhlm,bhmd->bhld", probabilities, v)

    kernel = jax.checkpoint(attention) if recompute else attention

    def model(params, x):  # named as Flax names a model's apply: its ops under `jvp(Model)`
        q, k, v = (jnp.tanh(x @ params[name]) for name in ("q", "k", "v"))
        return kernel(q, k, v)

    def loss(state, x):
        return jnp.sum(jnp.sin(jax.named_call(model, name="Model")(state["params"], x)))

    state = {"params": {name: jnp.ones((D, D)) for name in ("q", "k", "v")}}
    x = jax.ShapeDtypeStruct((B, H, L, D), jnp.float32)
    options = {
        "xla_dump_to": str(tmp_path),
        "xla_dump_hlo_as_text": True,
        "xla_cpu_enable_concurrency_optimized_scheduler": False,
    }
    salt = float(time.time_ns() % 1_000_003)

    def salted(state, x):  # a program the compilation cache has not seen (a cached one dumps no live ranges)
        return jax.grad(loss)(state, x), salt * jnp.sum(x)

    jax.jit(salted).lower(state, x).compile(options)
    hlo, live = bench_step_memory_hlo.dump_files(tmp_path, module="jit_salted")
    return bench_step_memory_hlo.peak_buffers(hlo.read_text(), live.read_text())


def test_the_peak_holds_the_attention_probabilities_unless_they_are_recomputed(tmp_path):
    kept = _peak_rows(tmp_path / "kept", recompute=False)
    recomputed = _peak_rows(tmp_path / "recomputed", recompute=True)
    square = [r for r in kept if r["kind"] == "attention probabilities"]
    assert square and all(r["shape"][-2:] == [L, L] and r["dtype"] == "f32" for r in square)
    assert {r["kind"] for r in kept} >= {"parameters", "batch", "activations", "attention probabilities"}
    assert all(r["op_name"] for r in kept if r["bytes"] >= 1024)  # what JAX made, named (not XLA's constants)
    assert not [r for r in recomputed if r["kind"] == "attention probabilities"]
    assert [r for r in recomputed if r["kind"] == "backward temporaries" and r["shape"][-2:] == [L, L]]  # in use
    by_kind = bench_step_memory_hlo.by_kind(kept)
    assert sum(by_kind.values()) == sum(r["bytes"] for r in kept)
    assert sum(g["bytes"] for g in bench_step_memory_hlo.grouped(kept)) == sum(by_kind.values())


@pytest.mark.parametrize(
    "name, shape, op_name, kind",
    [
        ("state_params__k__.1", (8, 8), f"{ARGUMENT} state.params['img']['kernel']", "parameters"),
        ("state_opt_state__.1", (8, 8), f"{ARGUMENT} state.opt_state[1][0].mu['img']['kernel']", "optimizer state"),
        ("batch_a_.1", (2, 5, 8), f"{ARGUMENT} batch['a']", "batch"),
        ("fusion.3", (8, 8), f"{BACKWARD}/img/Dense_0/dot_general", "gradients"),
        ("fusion.4", (4, 16), f"{BACKWARD}/img/Dense_0/dot_general", "gradients"),  # reshaped by XLA
        ("fusion.5", (2, 5, 8), f"{BACKWARD}/img/Dense_0/dot_general", "backward temporaries"),
        ("fusion.6", (2, 3, 5, 5), "jit(train_step)/jvp(Model)/img/encoderblock_0/div", "attention probabilities"),
        ("convert.6", (64,), "jit(train_step)/jvp(Model)/img/Dense_0/convert_element_type", "parameter copies"),
        ("fusion.7", (2, 5, 8), "jit(train_step)/jvp(Model)/img/encoderblock_0/add", "activations"),
        ("fusion.8", (2, 8), "jit(train_step)/transpose(jvp())/exp", "loss"),
        ("fusion.9", (2, 8), "jit(train_step)/jvp()/reduce_max", "loss"),
        ("fusion.10", (8, 8), "jit(train_step)/sqrt", "optimizer update"),
    ],
)
def test_a_value_s_kind_comes_from_its_name_shape_and_op_name(name, shape, op_name, kind):
    assert bench_step_memory_hlo.kind_of(name, shape, op_name, frozenset({(8, 8)})) == kind


def _variant(label, dtype, temp, residuals):
    memory = {"argument": 100 * 2**20, "output": 99 * 2**20, "alias": 99 * 2**20, "temp": temp * 2**20, "needed": 0}
    peak = {"bytes": temp * 2**20, "by_kind": {"activations": temp * 2**20}, "by_block": {}, "largest": []}
    return {"label": label, "dtype": dtype, "memory": memory, "peak": peak, "residuals": {"bytes": residuals * 2**20}}


def test_the_report_states_each_fix_s_saving():
    results = [
        _variant(label, dtype, temp, kept)
        for dtype in bench_step_memory.DTYPES
        for label, temp, kept in (
            ("before", 400, 300),
            ("none, activation recomputed", 300, 200),
            ("none", 280, 180),
            ("attention", 250, 150),
        )
    ]
    results.append({"label": "full", "dtype": "float32", "error": "exit 1: boom"})
    header = {
        "environment": {"machine": "x86_64 2 cores", "python": "3.11", "versions": {"jax": "0.10"}},
        "batch": 8,
        "load_average_end": 2.0,
    }
    header["environment"]["load_average_start"] = 1.0
    text = bench_step_memory.report(results, header)
    assert "temp 400.0 → 300.0 MiB (**−100.0 MiB**, -25%); autodiff's residuals −100.0 MiB" in text
    assert "temp 300.0 → 280.0 MiB (**−20.0 MiB**, -7%)" in text
    assert "temp 280.0 → 250.0 MiB (**−30.0 MiB**, -11%)" in text
    assert "| full | float32 | exit 1: boom |" in text
    assert "| attention | bfloat16 | 250.0 | 0.0 | 250.0 | 1.0 | 150.0 |" in text  # 1 MiB not donated


@pytest.mark.slow
def test_the_whole_command_at_toy_sizes(tmp_path):
    """The fixes' variants compiled at toy sizes in bfloat16 (open_clip's tiny model; about a minute)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "experiments.bench.bench_step_memory", "--tiny", "--out", str(tmp_path)]
    subprocess.run(command, check=True, cwd=REPO, env=env, capture_output=True, timeout=1200)
    results = json.loads((tmp_path / "results.json").read_text())
    assert [v["label"] for v in results["variants"]] == [
        "before", "none, activation recomputed", "none", "attention"
    ]  # fmt: skip
    assert {v["dtype"] for v in results["variants"]} == {"bfloat16"}
    assert not [v for v in results["variants"] if "error" in v]
    assert "## What each fix saved" in (tmp_path / "results.md").read_text()
