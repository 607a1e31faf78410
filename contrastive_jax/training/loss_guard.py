"""A bad loss (non-finite, or a spike): stop, or roll back and skip the batches
(PaLM's recipe, Chowdhery et al. 2022, §5.1).

`LossGuard.check` reads each finished step's metrics: a non-finite loss or gradient
norm is bad, and so, with `config.train.loss_spike_factor` k > 0, is a loss above k x the
median of the last `loss_spike_window_steps` finite losses (kept in every checkpoint, so
a resumed run judges as the uninterrupted one did). With `config.train.on_bad_loss`:

* "stop": `FloatingPointError` naming the step and the last good checkpoint (exit 1).
* "rollback": the loop restores the newest intact checkpoint (before the bad step: a
  step is saved only once its loss was read) and skips the batches the next
  `rollback_skip_batches` steps would have read (at least through the bad one). The
  skips are appended to `<workdir>/rollbacks.json` before training goes on, so a rerun
  after a kill skips the same ones; the data are a pure function of the batch number,
  so skipping is exact. More than `max_rollbacks` within `rollback_window_steps` steps
  stops as "stop" does, naming the bad steps.

Batch numbers (which batch each step reads, the skipped ones left out) are
`data.batch_numbering`'s. `config.train.inject_nan_at_batches` turns the float inputs of
the batches with those numbers into NaN (`BatchNumbering`): a fault injection for tests
and drills, off (empty) by default.
"""

import collections
import dataclasses
import json
import math
import os
import statistics
from collections.abc import Mapping
from typing import Any

from contrastive_jax import run_dir
from contrastive_jax.data.batch_numbering import batch_number
from contrastive_jax.errors import ConfigError

ON_BAD_LOSS = ("stop", "rollback")


@dataclasses.dataclass(frozen=True)
class GuardSettings:
    """What `LossGuard` judges by, as plain values: `run_plan.build` reads them from the
    config once (`run_plan.guard_settings`). Each field is `config.train.<name>` (its comment in
    configs/default.py says what it does)."""

    on_bad_loss: str  # one of ON_BAD_LOSS
    loss_spike_factor: float
    loss_spike_window_steps: int
    rollback_skip_batches: int
    max_rollbacks: int
    rollback_window_steps: int
    inject_nan_at_batches: tuple[int, ...]


def check_config(settings: GuardSettings) -> None:
    """The bad-loss settings (their counts are checked with the config's other counts).

    Raises:
      ConfigError: an unknown `on_bad_loss`, a spike factor in (0, 1], or a batch
        number below 1 in `inject_nan_at_batches`.
    """
    if settings.on_bad_loss not in ON_BAD_LOSS:
        raise ConfigError(f"config.train.on_bad_loss={settings.on_bad_loss!r}; use one of {ON_BAD_LOSS}.")
    factor = settings.loss_spike_factor
    if not (factor == 0 or factor > 1):
        raise ConfigError(
            f"config.train.loss_spike_factor={factor!r} must be > 1 (a spike is a loss above "
            "that many times the running median), or 0 for no spike detection."
        )
    if any(not isinstance(n, int) or n < 1 for n in settings.inject_nan_at_batches):
        raise ConfigError(
            f"config.train.inject_nan_at_batches={settings.inject_nan_at_batches!r} must hold "
            "batch numbers >= 1 (batch t: what step t reads when nothing was skipped)."
        )


class BadLoss(Exception):
    """A step whose metrics are bad: `step`, and `reason` (e.g. "Loss is nan")."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"{reason} at step {step}")
        self.step, self.reason = step, reason


class LossGuard:
    """Judges each step's metrics and keeps the run's rollbacks (see the module doc).

    Every process holds one and decides alike (the metrics are replicated); only
    `lead` (process 0) writes `rollbacks.json`.
    """

    def __init__(self, settings: GuardSettings, workdir: str, *, lead: bool):
        self._settings = settings
        self._path = os.path.join(workdir, run_dir.ROLLBACKS)
        self._lead = lead
        self._recent = collections.deque(maxlen=self._settings.loss_spike_window_steps)
        self.rollbacks: list[dict[str, Any]] = []
        if os.path.exists(self._path):
            with open(self._path) as f:
                self.rollbacks = json.load(f)
        self.skipped = {n for r in self.rollbacks for n in r["skipped_batches"]}

    def check(self, step: int, values: Mapping[str, float]) -> None:
        """Raises `BadLoss` when step `step`'s metrics are bad; else remembers its loss."""
        loss = values["loss"]
        for name, label in (("loss", "Loss"), ("grad_norm", "Gradient norm")):
            if not math.isfinite(values.get(name, 0.0)):
                raise BadLoss(step, f"{label} is {values[name]}")
        factor, recent = self._settings.loss_spike_factor, self._recent
        if factor and len(recent) == recent.maxlen:
            median = statistics.median(recent)
            if loss > factor * median:
                raise BadLoss(
                    step,
                    f"Loss is {loss:.4g}, above {factor:g} x the median {median:.4g} of the "
                    f"last {recent.maxlen} steps,",
                )
        recent.append(loss)

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps of the guard (merged into its input position)."""
        return {"recent_losses": list(self._recent)}

    def restore(self, position: Mapping[str, Any] | None) -> None:
        """Takes back what `saved` gave (None: a run from the start, nothing seen)."""
        self._recent.clear()
        self._recent.extend((position or {}).get("recent_losses", []))

    def stop_unless_rolling_back(self, bad: BadLoss, last_checkpoint: str) -> None:
        """Raises FloatingPointError when `bad` stops the run: `on_bad_loss` is "stop",
        or `max_rollbacks` rollbacks happened within the last `rollback_window_steps`.

        Args:
          last_checkpoint: where the newest checkpoint is (or "none"), for the message.
        """
        advice = (
            f"Last good checkpoint: {last_checkpoint} (left untouched). Lower "
            "config.optim.learning_rate or set config.optim.grad_clip_norm, then rerun to "
            "resume from it."
        )
        if self._settings.on_bad_loss == "stop":
            raise FloatingPointError(f"{bad}; training stopped. {advice}")
        recent = self._recent_bad_steps(bad.step)
        if len(recent) >= self._settings.max_rollbacks:
            steps = ", ".join(map(str, [*recent, bad.step]))
            raise FloatingPointError(
                f"{bad}, after {len(recent)} rollback{'s' if len(recent) > 1 else ''} within "
                f"{self._settings.rollback_window_steps} steps (bad steps {steps}); training "
                f"stopped (config.train.max_rollbacks={self._settings.max_rollbacks}). {advice}"
            )

    def _recent_bad_steps(self, step: int) -> list[int]:
        """The bad steps of the rollbacks within `rollback_window_steps` up to `step`."""
        window = self._settings.rollback_window_steps
        return [r["bad_step"] for r in self.rollbacks if step - window < r["bad_step"] <= step]

    def roll_back(self, bad: BadLoss, restored_step: int) -> dict[str, Any]:
        """Records a rollback from `bad.step` to checkpoint `restored_step` (0: the
        initial state) and the batches it skips; returns the record.

        Skips the batches of the next max(rollback_skip_batches, bad step - restored
        step) steps, so the bad step's batch is among them; the record is written to
        `rollbacks.json` (atomically) before this returns.
        """
        count = max(self._settings.rollback_skip_batches, bad.step - restored_step)
        numbers = [batch_number(restored_step + 1 + i, self.skipped) for i in range(count)]
        record = {
            "bad_step": bad.step,
            "reason": bad.reason,
            "restored_step": restored_step,
            "skipped_batches": numbers,
        }
        self.rollbacks.append(record)
        self.skipped.update(numbers)
        if self._lead:
            run_dir.write_json(self._path, self.rollbacks)
        return record

    def line(self, record: Mapping[str, Any]) -> str:
        """The log line of the rollback `roll_back` just recorded."""
        settings, skipped = self._settings, record["skipped_batches"]
        within = self._recent_bad_steps(record["bad_step"])
        contiguous = skipped[-1] - skipped[0] + 1 == len(skipped)
        numbers = f"{skipped[0]}-{skipped[-1]}" if contiguous else ", ".join(map(str, skipped))
        return (
            f"Rollback: {record['reason']} at step {record['bad_step']}; restored step "
            f"{record['restored_step']} and skipping {len(skipped)} batches ({numbers}); "
            f"rollback {len(within)} of at most {settings.max_rollbacks} within "
            f"{settings.rollback_window_steps} steps."
        )
