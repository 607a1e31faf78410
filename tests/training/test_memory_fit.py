"""Will it fit? The compiled step's memory per device, checked before the first step
against the device's (on the CPU, a `config.train.memory_limit_gib`)."""

import logging
import os
import re

import pytest
from subprocess_runs import tiny_fields

from contrastive_jax import sharding
from contrastive_jax.config_lib import override
from contrastive_jax.data import input_pipeline
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import memory_fit, run_plan, trainer
from contrastive_jax.training.run_plan import data_settings

# N = 1,024 with dense logits: 1.4 MiB per device (a [128, 1024] block of logits and its
# gradient dominate); 0.95 MiB leaves room for the ring's or micro-batches' step only.
TOO_BIG = {
    "train.global_batch_size": 1024,
    "train.memory_limit_gib": 0.95 / 1024,
}


def compiled(config):
    """`compile_train_step` of `config` on all 8 devices (`config.mesh.fsdp` of them
    splitting the parameters)."""
    run = run_plan.build(config, sharding.make_mesh(fsdp=config.mesh.fsdp))
    spec = input_pipeline.train_dataset(data_settings(config)).element_spec
    return memory_fit.compile_train_step(run, run.trainer.init_state(spec)[1], spec)


@pytest.mark.slow
def test_a_step_that_does_not_fit_names_settings_that_fit_as_compiled(load_config, digits_data_dir, tmp_path):
    config = override(load_config("default"), tiny_fields(digits_data_dir) | TOO_BIG)
    workdir = str(tmp_path / "run")
    with pytest.raises(ConfigError) as refused:
        run_plan.train_and_evaluate(config, workdir)
    message = str(refused.value)
    assert re.fullmatch(
        r"The train step needs 1\.\d MiB per device, the device has 972\.8 KiB "
        r"\(config.train.memory_limit_gib\); (with (--config\.\S+ )+it needs [\d.]+ KiB(; |\.$))+",
        message,
    ), message
    assert not os.path.exists(os.path.join(workdir, "metrics.jsonl"))  # refused before step 1
    suggestions = re.findall(r"with ((?:--config\.\S+ )+)it needs ([\d.]+ KiB)", message)
    assert len(suggestions) == 2
    for flags, stated in suggestions:  # each suggestion fits, with the need it states
        fields = dict(flag[len("--config.") :].split("=") for flag in flags.split())
        fields = {k: int(v) if v.isdigit() else v for k, v in fields.items()}
        _, memory = compiled(override(config, fields))
        assert memory.fits and memory_fit.format_bytes(memory.needed) == stated


@pytest.mark.slow
def test_towers_too_big_to_replicate_are_told_to_split_their_parameters(load_config, digits_data_dir):
    """The logits are streamed around the ring already; the state dominates: the first
    suggestion splits it over the 8 devices, and fits with the need it states."""
    fields = tiny_fields(digits_data_dir) | {
        "model.mlp_hidden_dims": (1024,),
        "model.encoder_dim": 1024,
        "train.global_batch_size": 64,
        "loss.chunk_size": 8,
        "loss.collective": "ring",
        "mesh.fsdp_min_kib": 0.0,
    }
    config = override(load_config("default"), fields)
    _, split = compiled(override(config, {"mesh.fsdp": 8}))
    _, whole = compiled(config)
    limit_gib = (split.needed + whole.needed) / 2 / 2**30
    stated = memory_fit.format_bytes(split.needed)
    with pytest.raises(ConfigError, match=rf"; with --config\.mesh\.fsdp=8 it needs {stated}[;.]"):
        compiled(override(config, {"train.memory_limit_gib": limit_gib}))


def test_the_loop_runs_the_step_the_check_compiled_and_logs_its_memory(
    load_config, digits_data_dir, tmp_path, monkeypatch, caplog
):
    real = trainer.Trainer.jit_train_step
    jitted = []

    def only_lowered(self, abstract_state):
        jitted.append(real(self, abstract_state))

        def called(*args):
            pytest.fail("the step was compiled a second time")

        return type("Jitted", (), {"lower": jitted[-1].lower, "__call__": called})()

    monkeypatch.setattr(trainer.Trainer, "jit_train_step", only_lowered)
    fields = tiny_fields(digits_data_dir, train__num_train_steps=2, train__memory_limit_gib=1)
    with caplog.at_level(logging.INFO):
        run_plan.train_and_evaluate(override(load_config("default"), fields), str(tmp_path))
    assert len(jitted) == 1
    [first] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cpu: ")]
    assert re.search(r"; 2 steps; step needs \d+\.\d KiB per device of 1\.0 GiB; workdir ", first)


def test_the_device_memory_is_the_limit_or_the_hosts_available_share():
    assert memory_fit.device_memory(1.5) == (
        int(1.5 * 2**30),
        "config.train.memory_limit_gib",
    )
    available, source = memory_fit.device_memory(None)  # the CPU: the host's / 8
    with open("/proc/meminfo") as f:
        [kib] = [int(line.split()[1]) for line in f if line.startswith("MemAvailable:")]
    assert source == "host memory available / 8 devices"
    assert available == pytest.approx(kib * 1024 / 8, rel=0.2)
    with pytest.raises(ConfigError, match=r"config.train.memory_limit_gib=0.0 must be > 0"):
        memory_fit.device_memory(0.0)
    assert memory_fit.format_bytes(17.2 * 2**30) == "17.2 GiB"
    assert memory_fit.format_bytes(1536) == "1.5 KiB"


@pytest.mark.parametrize(
    "model, suggested",
    [
        ({"encoder_a": "vit_tiny", "encoder_b": "vit_tiny", "patch_size": 4}, True),
        ({"encoder_a": "mlp", "encoder_b": "text_transformer"}, True),
        ({"encoder_a": "vit_tiny", "encoder_b": "vit_tiny", "patch_size": 4, "remat": "dots"}, False),
        ({}, False),  # the MLP towers: no Transformer blocks to recompute
    ],
)
def test_towers_with_transformer_blocks_are_told_to_rematerialise_them(load_config, digits_data_dir, model, suggested):
    fields = tiny_fields(digits_data_dir) | {f"model.{name}": value for name, value in model.items()}
    run = run_plan.build(override(load_config("default"), fields), sharding.make_mesh())
    assert ({"model.remat": "full"} in memory_fit.candidates(run)) == suggested
