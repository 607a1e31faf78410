"""Which batch of the training stream each step reads: the one place batches are numbered.

Batch t is the one step t reads when nothing was skipped (the input pipeline's
`start_step=t-1`: the stream is a pure function of the batch number). A rollback skips
batches (`training/loss_guard`), so with skips step t reads the t-th batch not skipped
(`batch_number`). A checkpoint saves the step a run continues from (`position`), and the
run opens the stream at the batch the next step reads (`BatchNumbering.stream_after`):
when it resumes, after a corrupt newest checkpoint sent it to an older one, and after a
rollback (`BatchNumbering.batches_after`).

The stream counts examples (`Stages`): step t reads the global batch of its stage
(`config.train.batch_schedule`), the examples at stream positions
`[examples_before(t - 1), examples_before(t))`, so a change of batch neither repeats nor
skips an example. With one stage (a constant batch N) batch t holds positions
`[(t - 1) N, t N)`, as it always did. The stream is reopened where the batch changes.
"""

import dataclasses
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import numpy as np

from contrastive_jax.data import input_pipeline
from contrastive_jax.data.settings import DataSettings


@dataclasses.dataclass(frozen=True)
class Stages:
    """The global batch of every step: `stages[i] = (s, N)`, N examples per step for the
    steps after step s (`s` the state's step count before them; the first stage at 0).

    Attributes:
      stages: `((0, N_0), (s_1, N_1), ...)`, the `s` increasing.
    """

    stages: tuple[tuple[int, int], ...]

    def batch_after(self, step: int) -> int:
        """The global batch of the step after `step`."""
        return next(n for s, n in reversed(self.stages) if s <= step)

    def examples_before(self, step: int) -> int:
        """The examples the steps up to `step` read (the stream position of the next one's first)."""
        total = 0
        for (s, n), (end, _) in zip(self.stages, (*self.stages[1:], (step, 0))):
            total += n * max(0, min(step, end) - s)
        return total

    def then(self, step: int, batch: int) -> "Stages":
        """These stages and a new one: `batch` for the steps after `step`."""
        return Stages((*(stage for stage in self.stages if stage[0] < step), (step, batch)))


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
      stages: each step's global batch (`Stages`, or an object with its `batch_after` and
        `examples_before`, read as it grows); None: `data.global_batch_size` throughout.
    """

    def __init__(
        self,
        data: DataSettings,
        skipped: Collection[int],
        *,
        nan_batches: Collection[int] = (),
        process_index: int = 0,
        process_count: int = 1,
        stages: Stages | None = None,
    ):
        self._data, self._skipped, self._nan_batches = data, skipped, nan_batches
        self._process_index, self._process_count = process_index, process_count
        self._stages = Stages(((0, data.global_batch_size),)) if stages is None else stages
        self._mixture = None  # a mixture's `mixture.Mixture`, once `epochs_through` needs it

    def first_batch(self, step: int) -> int:
        """The number of the batch the step after `step` reads."""
        return batch_number(step + 1, self._skipped)

    def epochs_through(self, step: int) -> dict[str, float]:
        """`{"train/epoch/<set>": epochs}`: how much of each set of a mixture the batches up
        to step `step`'s have read (the skipped ones included); {} for one record set."""
        if not self._data.mixture_records:
            return {}
        if self._mixture is None:
            self._mixture = input_pipeline.source_mixture(self._data, input_pipeline.training_sources(self._data))
        return self._mixture.epochs(self._stages.examples_before(batch_number(step, self._skipped)))

    def stream_after(self, step: int) -> input_pipeline.TrainStream:
        """The stream from the batch the step after `step` reads, no batch left out."""
        return self._stream_from(self.first_batch(step))

    def _stream_from(self, number: int) -> input_pipeline.TrainStream:
        """This process's rows of the batches numbered `number`, `number + 1`, ..., all of
        the size of batch `number` (its stage's)."""
        return input_pipeline.train_dataset(
            self._data,
            start_step=number - 1,
            process_index=self._process_index,
            process_count=self._process_count,
            global_batch_size=self._stages.batch_after(number - 1),
            start_example=self._stages.examples_before(number - 1),
        )

    def batches_after(self, step: int, *, opened: Iterator | None = None) -> Iterator[dict[str, np.ndarray]]:
        """The NumPy batches of steps `step + 1`, `step + 2`, ..., the skipped ones left
        out (the stream reopened past them, and where the global batch changes).

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
                if number in self._skipped or self._changes(number):
                    break
            while number in self._skipped:
                number += 1
            stream = iter(self._stream_from(number))

    def _changes(self, number: int) -> bool:
        """Whether batch `number` is of another size than the one before it."""
        return self._stages.batch_after(number - 1) != self._stages.batch_after(number - 2)
