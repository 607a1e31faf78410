"""Which batch of the training stream each step reads: the one place batches are numbered.

Batch t is the one step t reads when nothing was skipped (the input pipeline's
`start_step=t-1`: the stream is a pure function of the batch number). A rollback skips
batches (`training/loss_guard`), so with skips step t reads the t-th batch not skipped
(`batch_number`). A checkpoint saves the step a run continues from (`position`), and the
run opens the stream at the batch the next step reads (`BatchNumbering.stream_after`):
when it resumes, after a corrupt newest checkpoint sent it to an older one, and after a
rollback (`BatchNumbering.batches_after`).
"""

from collections.abc import Collection, Iterator, Mapping
from typing import Any

import numpy as np

from contrastive_jax.data import input_pipeline
from contrastive_jax.data.settings import DataSettings


def batch_number(step: int, skipped: Collection[int]) -> int:
    """The number of the batch step `step` reads: the `step`-th one not in `skipped`."""
    number = step
    for s in sorted(skipped):
        if s <= number:
            number += 1
    return number


def position(run_config: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The input position saved with checkpoint `step`: the run continues after `step`
    (`resumed_step`); the config (`run_config`, as JSON) tells what stream it was."""
    return {"next_step": step, "config": dict(run_config)}


def resumed_step(saved: Mapping[str, Any]) -> int:
    """The step a run continues after, from the input position `position` saved."""
    return saved["next_step"]


class BatchNumbering:
    """This process's batches of a run, numbered, the skipped ones left out.

    Args:
      data: the run's data settings.
      skipped: the numbers of the batches skipped (`LossGuard.skipped`; read as it grows).
      nan_batches: the numbers of the batches whose float inputs become NaN (a fault
        injection, `config.train.inject_nan_at_batches`).
      process_index, process_count: this process, of how many (its rows of each batch).
    """

    def __init__(
        self,
        data: DataSettings,
        skipped: Collection[int],
        *,
        nan_batches: Collection[int] = (),
        process_index: int = 0,
        process_count: int = 1,
    ):
        self._data, self._skipped, self._nan_batches = data, skipped, nan_batches
        self._process_index, self._process_count = process_index, process_count

    def first_batch(self, step: int) -> int:
        """The number of the batch the step after `step` reads."""
        return batch_number(step + 1, self._skipped)

    def stream_after(self, step: int) -> input_pipeline.TrainStream:
        """The stream from the batch the step after `step` reads, no batch left out."""
        return self._stream_from(self.first_batch(step))

    def _stream_from(self, number: int) -> input_pipeline.TrainStream:
        """This process's rows of the batches numbered `number`, `number + 1`, ..."""
        return input_pipeline.train_dataset(
            self._data,
            start_step=number - 1,
            process_index=self._process_index,
            process_count=self._process_count,
        )

    def batches_after(self, step: int, *, opened: Iterator | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The NumPy batches of steps `step + 1`, `step + 2`, ..., the skipped ones left
        out (the stream reopened past them).

        Args:
          step: the step done.
          opened: `iter(self.stream_after(step))` if already opened.
        """
        number = self.first_batch(step)
        stream = opened if opened is not None else iter(self._stream_from(number))
        while True:
            for batch in stream:
                if number in self._nan_batches:
                    batch = {
                        k: np.full_like(v, np.nan) if np.issubdtype(v.dtype, np.floating) else v
                        for k, v in batch.items()
                    }
                yield batch
                number += 1
                if number in self._skipped:
                    break
            while number in self._skipped:
                number += 1
            stream = iter(self._stream_from(number))
