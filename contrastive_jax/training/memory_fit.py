"""Will the step fit? The train step's per-device memory, from its compilation, checked
against the device's before the first step.

`compile_train_step` has the run's trainer compile its train step for the global batch's
shapes (`Trainer.compile_step`: the executable the loop then calls, so the check costs
nothing when the step fits) and reads XLA's `memory_analysis()`: arguments + outputs - donated (aliased) buffers +
temporaries + generated code, per device. The device's memory is `config.train.memory_limit_gib` when
set, else the accelerator's limit (`memory_stats()["bytes_limit"]`), else, on the CPU,
the host's available memory shared by its simulated devices. A step that needs more is a
`ConfigError` naming the figures and the settings that would fit, each measured by
compiling the run's variant with it (`RunPlan.variant`) (`loss.chunk_size`, `loss.collective="ring"`,
`mesh.fsdp`, `model.remat`, `train.micro_batch_size`, `model.compute_dtype`): only then are other
steps compiled. A leaf: it imports neither the run plan nor the config.
"""

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import jax

from contrastive_jax import sharding
from contrastive_jax.errors import ConfigError
from contrastive_jax.losses import logit_stats
from contrastive_jax.losses.streaming import AUTO_TILE
from contrastive_jax.models import encoders

_GIB = 2**30
# How many of the candidates that fit a message names (the least intrusive first).
_SUGGESTIONS = 2


@dataclasses.dataclass(frozen=True)
class StepMemory:
    """A compiled step's memory per device and the device's (bytes), and whence that."""

    needed: int
    available: int
    source: str

    @property
    def fits(self) -> bool:
        """Whether the step needs no more than the device has."""
        return self.needed <= self.available

    def __str__(self) -> str:
        needed, available = format_bytes(self.needed), format_bytes(self.available)
        return f"step needs {needed} per device of {available}"


def format_bytes(size: float) -> str:
    """`17.2 GiB`, `1.4 MiB`, `12.0 KiB`: one decimal in the largest unit below `size`."""
    for unit, scale in (("GiB", _GIB), ("MiB", 2**20)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 2**10:.1f} KiB"


def needed_bytes(compiled: jax.stages.Compiled) -> int:
    """Per-device bytes of a compiled step: arguments + outputs - aliased (donated) +
    temporaries + generated code."""
    m = compiled.memory_analysis()
    return (
        m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes
        + m.generated_code_size_in_bytes
    )


def device_memory(limit: float | None) -> tuple[int, str]:
    """`(bytes, where the figure comes from)`: the memory of one device, `limit` GiB
    (`config.train.memory_limit_gib`) when it is not None.

    Raises:
      ConfigError: `limit` is not positive.
    """
    if limit is not None:
        if not limit > 0:
            raise ConfigError(
                f"config.train.memory_limit_gib={limit!r} must be > 0 (GiB per device), or "
                "None for the device's own memory."
            )
        return int(limit * _GIB), "config.train.memory_limit_gib"
    device = jax.local_devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), f"{device.platform} memory"
    count = jax.local_device_count()
    return _host_available_bytes() // count, f"host memory available / {count} devices"


def _host_available_bytes() -> int:
    """The host's available memory (Linux `MemAvailable`, else the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def compile_train_step(plan, abstract_state, element_spec) -> tuple[Callable, StepMemory]:
    """The train step compiled for the largest global batch the run reaches (its batch
    schedule's, `plan.batch_schedule.largest`; `Trainer.compile_step`), and its memory
    per device: checked before the first step, whichever stage that is.

    Args:
      plan: the run's `run_plan.RunPlan`.
      abstract_state: the state as `jax.ShapeDtypeStruct` leaves with shardings.
      element_spec: the input pipeline's `element_spec` (this process's rows).

    Returns:
      `(step, memory)`: `step(state, batch)` is the compiled step for that batch (call it
      as the jitted one); `memory` its per-device need and the device's memory.

    Raises:
      ConfigError: the step needs more memory than the device has; the message gives
        both figures and the settings that fit, each with its measured need.
    """
    available, source = device_memory(plan.memory_limit_gib)  # checked before compiling
    compiled = plan.trainer.compile_step(abstract_state, element_spec, plan.batch_schedule.largest)
    memory = StepMemory(needed_bytes(compiled), available, source)
    if not memory.fits:
        raise ConfigError(_does_not_fit(plan, element_spec, memory))
    return compiled, memory


def _does_not_fit(plan, element_spec, memory: StepMemory) -> str:
    """The message for a step that does not fit: the figures, then what would fit."""
    measured = []  # (flags, bytes) of each candidate that builds
    for fields in candidates(plan):
        try:
            other = plan.variant(fields).trainer
        except ConfigError:
            continue
        _, abstract_state = other.init_state(element_spec)
        needed = needed_bytes(other.compile_step(abstract_state, element_spec, plan.batch_schedule.largest))
        flags = " ".join(f"--config.{k}={v}" for k, v in fields.items())
        measured.append((flags, needed))
        if sum(n <= memory.available for _, n in measured) == _SUGGESTIONS:
            break
    fitting = [f"with {flags} it needs {format_bytes(n)}" for flags, n in measured if n <= memory.available]
    lower = _lower_batch(plan.batch_schedule.kind)
    if fitting:
        fix = "; ".join(fitting)
    elif measured:
        flags, least = min(measured, key=lambda m: m[1])
        fix = f"none of the usual fixes is enough (the best: with {flags} it needs {format_bytes(least)}); {lower}"
    else:
        fix = f"the config uses every fix already; {lower}"
    schedule = plan.batch_schedule
    at = "" if schedule.kind == "constant" else f" at the schedule's largest batch ({schedule.largest:,})"
    return (
        f"The train step{at} needs {format_bytes(memory.needed)} per device, the device has "
        f"{format_bytes(memory.available)} ({memory.source}); {fix}."
    )


def _lower_batch(kind: str) -> str:
    """How to lower the largest batch of a run's batch schedule of `kind` ("constant",
    "stages", "noise": `batch_schedule.ScheduleSettings.kind`)."""
    if kind == "noise":
        return "lower --config.train.batch_max"
    if kind == "stages":
        return "lower the last stages of --config.train.batch_schedule"
    return "lower --config.train.global_batch_size"


def candidates(plan) -> list[dict[str, Any]]:
    """Config overrides that lower the step memory of a run (`run_plan.RunPlan`), the least
    intrusive first: stream the logits in tiles, pass the other side's shards around a
    ring, split the parameters and optimizer state over each host's devices
    (`mesh.fsdp`), recompute each Transformer block in the backward pass (`model.remat`,
    for towers that have blocks), micro-batches, bfloat16 activations (each one the run
    does not already use)."""
    trainer, loss = plan.trainer, plan.trainer.loss_settings
    n, num_devices = trainer.global_batch_size, sharding.batch_shards(trainer.mesh)
    tile = AUTO_TILE["cpu"]  # the largest divisor of the columns at most the CPU's tile
    found = []
    if loss.chunk_size is None:
        found.append({"loss.chunk_size": logit_stats.divisor_at_most(n, tile)})
    if loss.collective != "ring":
        ring_tile = logit_stats.divisor_at_most(n // num_devices, tile)
        found.append({"loss.collective": "ring", "loss.chunk_size": ring_tile})
    if trainer.mesh.shape[sharding.FSDP_AXIS] == 1 and jax.local_device_count() > 1:
        found.append({"mesh.fsdp": jax.local_device_count()})
    model = plan.run_config["model"]
    has_blocks = model["init_from"] or {model["encoder_a"], model["encoder_b"]} & encoders.TRANSFORMER_ENCODERS
    if has_blocks and model["remat"] == "none":
        found.append({"model.remat": "full"})
    if not trainer.gradient.micro_batch_size and n % (8 * num_devices) == 0:
        streamed = {} if loss.chunk_size is not None else found[0]
        found.append({"train.micro_batch_size": n // 8, **streamed})
    if plan.compute_dtype == "float32":
        found.append({"model.compute_dtype": "bfloat16"})
    return found
