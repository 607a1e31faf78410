"""Batch size as a schedule (`config.train.batch_schedule`): the global batch of each step.

- "constant": `config.train.global_batch_size` throughout (the default).
- stages, `"512@0,2048@300,8192@600"`: N examples per step for the steps after step s
  (`N@s`; the first stage at 0).
- "noise": start at `global_batch_size`; every `batch_noise_window_steps` steps, double
  the batch when the gradient noise scale ``B_simple`` measured over those steps
  (`noise_scale.estimate`, McCandlish et al. 2018) exceeds `batch_noise_factor` times the
  current batch, up to `batch_max`. Each decision is a `Decision`: logged as a line and
  as `batch/*` metrics.

Exact: the stream counts examples (`batch_numbering.Stages`), so a change of batch
neither repeats nor skips one. Resumable: a checkpoint saves the stages so far and the
noise window's squared norms (`BatchSchedule.saved`), so a resumed "noise" run decides as
the uninterrupted one. The learning rate follows `config.optim.lr_scaling`
(`optimizer.rate_factor`); the warm-up counts steps, never restarted by a change.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from contrastive_jax.data.batch_numbering import Stages
from contrastive_jax.errors import ConfigError
from contrastive_jax.training import noise_scale

# What a checkpoint's input position holds of the schedule.
_SAVED = "batch_schedule"


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
    """`config.train.batch_schedule` read (`parse`), as plain values; the noise rule's
    fields are `config.train.batch_noise_factor`, `batch_noise_window_steps`, `batch_max`."""

    kind: str  # "constant", "stages" or "noise"
    stages: Stages  # the rows read a step ("noise": the first stage, which decisions extend)
    noise_factor: float = 2.0
    noise_window_steps: int = 50
    batch_max: int = 0
    extra_rows: int = 0  # rows read a step beside the optimizer's batch (config.loss.extra_negatives)

    @property
    def largest(self) -> int:
        """The most rows a step reads (the memory check's)."""
        return self.batches[-1]

    @property
    def batches(self) -> tuple[int, ...]:
        """Every number of rows a step can read, smallest first (each optimizer batch,
        `optimizer_batches`, and the extra rows)."""
        return tuple(n + self.extra_rows for n in self.optimizer_batches)

    @property
    def optimizer_batches(self) -> tuple[int, ...]:
        """Every global batch the optimizer can see, smallest first."""
        if self.kind != "noise":
            return tuple(sorted({n - self.extra_rows for _, n in self.stages.stages}))
        first = self.stages.stages[0][1] - self.extra_rows
        return tuple(first * 2**k for k in range(int(math.log2(self.batch_max // first)) + 1))


def first_stage(text: str) -> int | None:
    """The first stage's global batch of stages `text` (`"64@0,256@50"`: 64); None for
    "constant", "noise" or text that is no schedule (`parse` says why)."""
    first = text.split(",")[0].split("@")
    return int(first[0]) if len(first) == 2 and first[0].isdigit() else None


def parse(text: str, first_batch: int, *, extra_rows: int = 0, **noise) -> ScheduleSettings:
    """`ScheduleSettings` of `config.train.batch_schedule` = `text`; `first_batch` is
    `config.train.global_batch_size` (the first stage of "constant" and "noise", which
    stages start with: `run_plan` sets it from them), `extra_rows` the rows read a step
    beside the optimizer's batch, `noise` the noise rule's fields.

    Raises:
      ConfigError: `text` is none of the three forms, or its stages do not start at step 0
        with `first_batch` and increase in step.
    """
    field = f"config.train.batch_schedule={text!r}"
    if text in ("constant", "noise"):
        return ScheduleSettings(text, Stages(((0, first_batch + extra_rows),)), extra_rows=extra_rows, **noise)
    try:
        stages = tuple((int(s), int(n)) for n, s in (part.split("@") for part in text.split(",")))
    except ValueError:
        raise ConfigError(
            f"{field} is not a schedule; use 'constant', 'noise' or stages 'N@step,...' "
            f"such as '{first_batch}@0,{2 * first_batch}@300'."
        ) from None
    steps = [s for s, _ in stages]
    if stages[0] != (0, first_batch) or steps != sorted(set(steps)) or min(n for _, n in stages) < 1:
        raise ConfigError(
            f"{field}: the stages must start with config.train.global_batch_size at step 0 "
            f"('{first_batch}@0,...'), their steps increasing, each batch >= 1."
        )
    read = tuple((s, n + extra_rows) for s, n in stages)
    return ScheduleSettings("stages", Stages(read), extra_rows=extra_rows, **noise)


def check(settings: ScheduleSettings, text: str, *, unit: int, unit_is: str, on_bad_loss: str) -> None:
    """Each global batch the schedule reaches is a multiple of `unit` (`unit_is` names
    what it divides over: devices, processes, micro-batches); "noise" has a sound rule;
    a rollback's skipped batches are a constant batch's (`on_bad_loss`).

    Raises:
      ConfigError: naming the field and a fix.
    """
    field = f"config.train.batch_schedule={text!r}"
    if settings.kind == "constant":
        return
    if on_bad_loss != "stop":
        raise ConfigError(f"{field} needs config.train.on_bad_loss='stop' (a rollback skips a constant batch's steps).")
    first = settings.optimizer_batches[0]
    if settings.kind == "noise" and not (settings.batch_max >= first and settings.noise_window_steps >= 1):
        raise ConfigError(
            f"{field} doubles the batch up to config.train.batch_max={settings.batch_max}, deciding every "
            f"config.train.batch_noise_window_steps={settings.noise_window_steps}: set batch_max >= "
            f"config.train.global_batch_size ({first}) and the window >= 1."
        )
    if settings.kind == "noise" and not settings.noise_factor > 0:
        raise ConfigError(f"config.train.batch_noise_factor={settings.noise_factor!r} must be > 0.")
    for n in settings.optimizer_batches:
        if n % unit:
            lower = n - n % unit
            nearest = " or ".join(str(m) for m in (lower, lower + unit) if m > 0)
            raise ConfigError(
                f"{field} reaches a global batch of {n}, which must be a multiple of {unit} ({unit_is}); use {nearest}."
            )


@dataclasses.dataclass(frozen=True)
class Decision:
    """A "noise" decision after `step`: the window's `b_simple` against `factor` x `batch`."""

    step: int
    b_simple: float
    batch: int  # the global batch before
    next_batch: int  # the global batch after (doubled, or the same)
    reason: str

    def line(self) -> str:
        """One line for the log."""
        change = f"doubles to {self.next_batch:,}" if self.next_batch != self.batch else f"stays {self.batch:,}"
        return (
            f"Batch schedule after step {self.step}: B_simple {self.b_simple:,.0f}; "
            f"the global batch {change} ({self.reason})."
        )

    def metrics(self) -> dict[str, float]:
        """The decision as metrics at its step."""
        return {
            "batch/noise_scale": self.b_simple,
            "batch/doubled": float(self.next_batch != self.batch),
            "batch/next_global_batch": float(self.next_batch),
        }


class BatchSchedule:
    """A run's batch schedule as it goes: the stages so far (`batch_after`,
    `examples_before`: a `batch_numbering.BatchNumbering`'s `stages`) and, for "noise",
    the decisions (`observe`), saved with each checkpoint and restored on resume.

    Args:
      settings: the schedule.
      batch_shards: the devices the batch is split over (the noise scale's small batch is
        a device's share).
    """

    def __init__(self, settings: ScheduleSettings, batch_shards: int):
        self.settings, self._batch_shards = settings, batch_shards
        self.stages = settings.stages
        self._norms: list[tuple[float, float]] = []  # (small, big) of the window's steps so far

    def batch_after(self, step: int) -> int:
        return self.stages.batch_after(step)

    def examples_before(self, step: int) -> int:
        return self.stages.examples_before(step)

    def decides_after(self, step: int) -> bool:
        """Whether a decision follows `step` (its metrics are read before the next step)."""
        return self.settings.kind == "noise" and step % self.settings.noise_window_steps == 0

    def observe(self, step: int, values: Mapping[str, float]) -> Decision | None:
        """Takes step `step`'s metrics; after a window's last step, decides the batch of
        the steps after it (a new stage when it doubles) and returns the `Decision`."""
        if self.settings.kind != "noise":
            return None
        self._norms.append((values[noise_scale.SMALL_KEY], values[noise_scale.BIG_KEY]))
        if not self.decides_after(step):
            return None
        settings = self.settings
        batch = self.batch_after(step - 1) - settings.extra_rows  # the optimizer's
        small = sum(s for s, _ in self._norms) / len(self._norms)
        big = sum(b for _, b in self._norms) / len(self._norms)
        self._norms = []
        estimate = noise_scale.estimate(small, big, batch // self._batch_shards, batch)
        if estimate.g_squared <= 0:
            reason, doubled = "|G|^2 estimate <= 0: no signal in the window", False
        elif estimate.b_simple <= settings.noise_factor * batch:
            reason, doubled = f"B_simple <= {settings.noise_factor:g} x {batch:,}", False
        elif 2 * batch > settings.batch_max:
            reason, doubled = f"at config.train.batch_max={settings.batch_max:,}", False
        else:
            reason, doubled = f"B_simple > {settings.noise_factor:g} x {batch:,}", True
        next_batch = 2 * batch if doubled else batch
        if doubled:
            self.stages = self.stages.then(step, next_batch + settings.extra_rows)
        return Decision(step, estimate.b_simple, batch, next_batch, reason)

    def saved(self) -> dict[str, Any]:
        """What a checkpoint's input position keeps of the schedule."""
        return {_SAVED: {"stages": [list(s) for s in self.stages.stages], "norms": [list(n) for n in self._norms]}}

    def restore(self, saved: Mapping[str, Any] | None) -> None:
        """Back to the schedule a checkpoint's input position `saved` kept (None: the start)."""
        kept = (saved or {}).get(_SAVED)
        self.stages = self.settings.stages if kept is None else Stages(tuple(tuple(s) for s in kept["stages"]))
        self._norms = [] if kept is None else [tuple(n) for n in kept["norms"]]
