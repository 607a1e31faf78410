"""The training loop: `train_and_evaluate(config, workdir)` trains, resuming from
`workdir`, and evaluates.

    config --trainer.build--> Trainer (model, optimizer, loss; plain values for all below)
    <workdir>/checkpoints --resume.restore_latest--> state and its step s
    input_pipeline.train_dataset(trainer.data, start_step=s) --> this process's rows of each batch
    memory_fit.compile_train_step: compiled once; its memory per device checked (or exit 2)
    Trainer.train_step (that executable): forward, loss over the global batch in shard_map, optax
    every k steps: metrics.jsonl / TensorBoard, a checkpoint, evaluator.Evaluator

One pure `train_step`, jitted once with the state placed on a (data, fsdp) mesh (the
parameters split over fsdp), the batch split over both axes, and the state donated.
Outputs in `workdir`: `checkpoints/<step>/`, `metrics.jsonl`, `tensorboard/`,
`eval_results.json`; files are written by process 0.

Nothing lost: a run resumes from its newest good checkpoint (state, input position and
RNG are all in it, so the resumed run reaches the uninterrupted run's parameters bit for
bit); SIGTERM finishes the current step, saves and raises `Preempted`; a bad loss stops
or is rolled back to the newest checkpoint, skipping its batches (`loss_guard`); a corrupt
checkpoint is reported and skipped for the previous one; resuming with another seed,
batch or data, or onto another model, is refused with the fields that changed.
Multi-process runs (`distributed.initialize`) train on one global batch per step whatever
the number of processes (see `input_pipeline`).
"""

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from contrastive_jax import console, run_dir, sharding
from contrastive_jax.data import input_pipeline, settings, writer
from contrastive_jax.evaluation import evaluator
from contrastive_jax.models import saved_model
from contrastive_jax.sharding import DATA_AXIS
from contrastive_jax.training import checkpoint, distributed, loss_guard, memory_fit, metric_writer, noise_scale, resume
from contrastive_jax.training.trainer import LoopSettings, Trainer, build, data_settings


class Preempted(Exception):
    """Training stopped at a SIGTERM after saving a checkpoint; rerun to resume.

    Attributes:
      step: the step saved.
      directory: the checkpoint directory it was saved in.
    """

    def __init__(self, step: int, directory: str):
        super().__init__(
            f"SIGTERM: stopped after step {step} and saved it in {directory}; rerun the same command to resume."
        )
        self.step, self.directory = step, directory


def _train_batches(data: settings.DataSettings, first_batch: int) -> input_pipeline.TrainStream:
    """This process's rows of the global batches numbered `first_batch`, `first_batch + 1`,
    ... (batch t: what step t reads when no batch was skipped, see `loss_guard`)."""
    return input_pipeline.train_dataset(
        data,
        start_step=first_batch - 1,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
    )


def _global_batch(batch: dict[str, np.ndarray], data_sharding) -> dict[str, jax.Array]:
    return {k: jax.make_array_from_process_local_data(data_sharding, v) for k, v in batch.items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
    """Trains (resuming from `workdir` if it holds a checkpoint) and evaluates.

    The config is read once, by `trainer.build`; the run then uses the plain values it
    returns (`train`). A built-in dataset's records are written first, once, where the
    config says (`writer.write_builtin`; one line says so). Before the first step
    the train step is compiled (the executable the loop runs) and its memory per device
    checked against the device's (`memory_fit`). Logs a first line (backend, devices,
    batch, the step's memory per device), a short line per logging step, a line per
    rollback (`loss_guard`) and the headline metrics of each evaluation (`console`). A run that already reached
    `config.train.num_train_steps` and holds its evaluation returns that evaluation
    without compiling, training or evaluating again.

    Args:
      config: the experiment config (see configs/default.py).
      workdir: directory for checkpoints, metrics and evaluations; created if missing.

    Returns:
      The final evaluation metrics (also written to `<workdir>/eval_results.json`).

    Raises:
      ConfigError: the config, the workdir or the checkpoint to resume from cannot be
        used (raised before compiling; the message names the field and a fix), or the
        train step does not fit in the device's memory (the message names settings that
        fit).
      FloatingPointError: the loss became non-finite or spiked and
        `config.train.on_bad_loss` is "stop", or it rolled back too often; the message
        names the step(s) and the last good checkpoint, which is left untouched.
      Preempted: SIGTERM arrived; the current step finished and was saved.
    """
    data = data_settings(config)
    written = writer.write_builtin_of(data)
    if written:
        logging.info("Wrote the built-in dataset %s's records to %s (once: later runs read them).", data.name, written)
    return train(build(config), workdir)


def train(trainer: Trainer, workdir: str) -> dict[str, float]:
    """`train_and_evaluate` of the run `trainer` was built for (`trainer.build`)."""
    loop = trainer.loop
    workdir = run_dir.prepare(workdir)
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, run_dir.CHECKPOINTS), max_to_keep=loop.checkpoint_max_to_keep)
    guard = loss_guard.LossGuard(trainer.guard, workdir, lead=jax.process_index() == 0)
    run_line = functools.partial(
        console.run_line,
        trainer.mesh,
        workdir,
        global_batch_size=trainer.data.global_batch_size,
        num_steps=loop.num_train_steps,
    )
    try:
        opened_at = ckpt.latest_step() or 0
        ds = _train_batches(trainer.data, guard.first_batch(opened_at))
        init, abstract_state = trainer.init_state(ds.element_spec)
        start_step, state = resume.restore_latest(ckpt, trainer.run_config, abstract_state)
        if state is not None and (done := _finished_results(workdir, start_step, loop.num_train_steps)):
            logging.info("%s", run_line())
            logging.info("%s", done[1])
            return done[0]
        step_fn, memory = memory_fit.compile_train_step(trainer, abstract_state, ds.element_spec)
        logging.info("%s", run_line(memory=memory))
        if state is None:
            state = init()
        else:
            guard.restore(ckpt.restore_position(start_step))
            logging.info("Resumed from %s at step %d.", ckpt.directory, start_step)
        if start_step != opened_at:  # the newest checkpoint was corrupt: an older one
            ds = _train_batches(trainer.data, guard.first_batch(start_step))
        model = saved_model.with_inputs(trainer.saved_model, ds.element_spec)
        run = _Run(trainer, step_fn, ckpt, guard, init, abstract_state, workdir, model)
        return run.loop(state, ds, start_step)
    finally:  # also on errors: finish the saves already started
        ckpt.close()


def _finished_results(workdir: str, start_step: int, num_steps: int) -> tuple[dict[str, float], str] | None:
    """The saved evaluation when the run already trained its steps and evaluated them,
    and the line that says so."""
    results = run_dir.read_eval_results(workdir) if start_step >= num_steps else None
    if results is None or results.pop("step", None) != start_step:
        return None
    return results, (
        f"Already done: {console.display_path(workdir)} holds step {start_step} of "
        f"{num_steps} and its evaluation; nothing to train. Raise "
        "--config.train.num_train_steps to train longer, or use a new --workdir."
    )


def evaluation(
    run_mesh: jax.sharding.Mesh,
    data: settings.DataSettings,
    loop: LoopSettings,
    match_keys: tuple[str | None, str | None] | None,
) -> Callable[[Any], dict[str, float]]:
    """`state -> metrics`: the run's evaluation (`loop`'s split and probes, on `data`;
    `match_keys` the record set's, `trainer.match_keys`), for a state on `run_mesh`.

    It runs whole in every process, on its own devices, from the state gathered whole
    (the loss's state, which may be split over the devices, is not evaluated).
    """
    if jax.process_count() == 1:
        mesh, local_state = run_mesh, lambda state: state.replace(loss_state=None)
    else:
        mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (DATA_AXIS,))
        gather = jax.jit(lambda state: state.replace(loss_state=None), out_shardings=sharding.replicated(run_mesh))
        local_state = lambda state: jax.tree.map(  # noqa: E731
            lambda x: jax.device_put(x.addressable_data(0), sharding.replicated(mesh)), gather(state)
        )
    eval_arrays = input_pipeline.eval_arrays(data, loop.eval_split, class_range=loop.eval_class_range)
    probe_arrays = None
    if "label" in eval_arrays and (loop.knn_k > 0 or loop.linear_probe):
        probe_arrays = input_pipeline.eval_arrays(data, data.train_split, class_range=data.train_class_range)
    captions = None
    if data.task == "pairs" and settings.open_metadata(data).has("captions") and loop.eval_class_range is None:
        captions = input_pipeline.eval_captions(data, loop.eval_split)
    evaluate = evaluator.Evaluator(
        mesh,
        eval_arrays,
        batch_size=loop.eval_batch_size,
        recall_ks=loop.recall_ks,
        match_keys=match_keys or (None, None),
        probe_arrays=probe_arrays,
        knn_k=loop.knn_k,
        linear_probe=loop.linear_probe,
        captions=captions,
    )
    return lambda state: evaluate(local_state(state))


class MetricWindow:
    """The metrics of the steps since the last logging step, logged every k steps.

    `record` takes a finished step's metrics (raising `loss_guard.BadLoss` on a bad one)
    and, at a logging step, writes their means with the time per step, the examples per
    second, the share of the time spent waiting for input and the records skipped.
    """

    def __init__(
        self,
        loop: LoopSettings,
        global_batch: int,
        batch_shards: int,
        guard: loss_guard.LossGuard,
        writer,
        progress,
        start_step: int,
    ):
        self._loop, self._global_batch, self._batch_shards = loop, global_batch, batch_shards
        self._guard, self.writer, self._progress = guard, writer, progress
        self._start_step = start_step
        self._window: list[dict[str, float]] = []
        self.skipped_records = 0
        self.restart_timer()

    def restart_timer(self) -> None:
        """Times the steps from now (after a warm-up, a save or an evaluation)."""
        self._timer_start, self._timed_steps, self._input_wait = time.perf_counter(), 0, 0.0

    def waited(self, seconds: float) -> None:
        """Counts `seconds` spent waiting for a batch."""
        self._input_wait += seconds

    def clear(self) -> None:
        """Forgets the metrics of steps undone (a rollback)."""
        self._window.clear()

    @property
    def empty(self) -> bool:
        return not self._window

    def record(self, step: int, metrics) -> None:
        """Fetches a finished step's metrics, raises BadLoss on a bad one, logs every k."""
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self._guard.check(step, values)
        self._window.append(values)
        if step == self._start_step + 1:  # the first step warms up: time the steps after it
            self.restart_timer()
        else:
            self._timed_steps += 1
        loop = self._loop
        if step % loop.log_every_steps == 0 or step == loop.num_train_steps:
            self._log(step)

    def _log(self, step: int) -> None:
        window, global_batch = self._window, self._global_batch
        scalars = {f"train/{k}": float(np.mean([w[k] for w in window])) for k in window[0]}
        elapsed = time.perf_counter() - self._timer_start
        seconds_per_step = elapsed / max(self._timed_steps, 1)
        if noise_scale.SMALL_KEY in window[0]:
            scalars["train/noise_scale"] = noise_scale.window_b_simple(window, global_batch, self._batch_shards)
        if self._timed_steps:
            scalars["train/examples_per_second"] = global_batch / seconds_per_step
            scalars["train/input_wait_share"] = self._input_wait / elapsed
        if self.skipped_records:
            scalars["train/skipped_records"] = self.skipped_records
        self.writer.write(step, scalars)
        self._progress.log(step, scalars, seconds_per_step=seconds_per_step if self._timed_steps else None)
        window.clear()
        self.restart_timer()


class _Run:
    """The loop of `train`: steps, metric windows, saves, evaluations and rollbacks.

    `step_fn` is the compiled train step; `init()` the initial state (a rollback before
    the first checkpoint restarts from it); `model` the model's settings saved with each
    checkpoint (`saved_model`).
    """

    def __init__(
        self, trainer: Trainer, step_fn, ckpt, guard: loss_guard.LossGuard, init, abstract_state, workdir, model
    ):
        self.trainer, self.step_fn, self.ckpt, self.guard = trainer, step_fn, ckpt, guard
        self.init, self.abstract_state, self.workdir, self.model = init, abstract_state, workdir, model
        self.lead = jax.process_index() == 0
        self.evaluate = evaluation(trainer.mesh, trainer.data, trainer.loop, trainer.match_keys)

    def _save(self, step: int, state) -> None:
        """Starts saving `state` as checkpoint `step`, with the input position, the guard's
        record and the model's settings."""
        position = resume.position(self.trainer.run_config, step) | self.guard.saved()
        self.ckpt.save(step, state, position, self.model)

    def _every(self, k: int, step: int) -> bool:
        return step == self.trainer.loop.num_train_steps or (k > 0 and step % k == 0)

    def _metric_window(self, writer, progress, start_step: int) -> MetricWindow:
        """The metric window of a loop from `start_step`: the run's global batch and the
        shards it is split over (the noise scale's two batch sizes)."""
        loop, data, shards = self.trainer.loop, self.trainer.data, sharding.batch_shards(self.trainer.mesh)
        return MetricWindow(loop, data.global_batch_size, shards, self.guard, writer, progress, start_step)

    def _open_at(self, batch_number: int):
        return iter(_train_batches(self.trainer.data, batch_number))

    def loop(self, state, ds, start_step: int) -> dict[str, float]:
        """Trains from `start_step` (`ds`: the stream from its batch); returns the final
        evaluation, after writing it to `eval_results.json`."""
        loop, ckpt, guard = self.trainer.loop, self.ckpt, self.guard
        num_steps = loop.num_train_steps
        data_sharding = sharding.data_sharding(self.trainer.mesh)
        writer = metric_writer.MetricWriter(self.workdir, enabled=self.lead, start_step=start_step)
        if start_step > 0:  # a machine-readable record of every resume, kept across resumes
            writer.write(start_step, {"resumed_from_step": start_step})
        progress = console.Progress(total_steps=num_steps, start_step=start_step, enabled=self.lead)
        window = self._metric_window(writer, progress, start_step)
        batches = guard.batches(start_step, self._open_at, opened=iter(ds))
        results, pending, preempted = {}, None, False  # pending: (step, metrics) dispatched, not read
        step, dispatched = start_step, 0  # dispatched: steps run, rolled back or not
        try:
            with distributed.Preemption() as preemption:
                while step < num_steps:
                    step, dispatched = step + 1, dispatched + 1
                    waiting_since = time.perf_counter()
                    batch = next(batches)
                    window.waited(time.perf_counter() - waiting_since)
                    window.skipped_records += int(batch.pop("skipped_records", 0))
                    state, metrics = self.step_fn(state, _global_batch(batch, data_sharding))
                    try:
                        if pending is not None:
                            window.record(*pending)  # step t-1's metrics, read after dispatching step t
                        pending = (step, metrics)
                        progress.step_done()
                        # The same count in every process, never going back (unlike `step`).
                        preempted = preemption.reached(dispatched)
                        save = preempted or self._every(loop.checkpoint_every_steps, step)
                        run_eval = not preempted and self._every(loop.eval_every_steps, step)
                        if save or run_eval:
                            window.record(*pending)  # never save or evaluate a bad state
                            pending = None
                    except loss_guard.BadLoss as bad:
                        pending = None
                        step, state = self._roll_back(bad, window, progress)
                        batches = guard.batches(step, self._open_at)
                        continue
                    if save:
                        self._save(step, state)
                    if preempted:
                        break
                    if run_eval:
                        results = self.evaluate(state)
                        window.writer.write(step, {f"eval/{k}": v for k, v in results.items()})
                        progress.message(console.eval_line(step, results))
                    if (save or run_eval) and window.empty:  # at a logging step: time the steps alone
                        window.restart_timer()
            if start_step >= num_steps:  # already trained: evaluate the restored state
                results = self.evaluate(state)
        finally:
            progress.close()
            window.writer.close()
        if preempted:
            raise Preempted(step, ckpt.directory)
        ckpt.wait()  # eval_results.json marks a finished run: only once its checkpoint is complete
        if self.lead:
            final_step = max(start_step, num_steps)  # a run resumed past its steps: the state's
            run_dir.write_eval_results(self.workdir, final_step, results)
        return results

    def _roll_back(self, bad: loss_guard.BadLoss, window: MetricWindow, progress) -> tuple[int, Any]:
        """`(step, state)` after a bad loss: the newest checkpoint's (or the initial state
        at step 0), its record written and logged; FloatingPointError when it stops instead."""
        ckpt, guard = self.ckpt, self.guard
        ckpt.wait()  # a save still being written is the newest checkpoint
        last = ckpt.latest_step()
        guard.stop_unless_rolling_back(bad, f"step {last} in {ckpt.directory}" if last is not None else "none")
        step, state = resume.restore_latest(ckpt, self.trainer.run_config, self.abstract_state)
        guard.restore(ckpt.restore_position(step) if state is not None else None)
        rollback = guard.roll_back(bad, step)
        window.writer.close()  # drop the lines of the steps undone, as a resume does
        window.writer = metric_writer.MetricWriter(self.workdir, enabled=self.lead, start_step=step)
        window.writer.write(
            step,
            {
                "rollback/bad_step": rollback["bad_step"],
                "rollback/first_skipped_batch": rollback["skipped_batches"][0],
                "rollback/skipped_batches": len(rollback["skipped_batches"]),
            },
        )
        progress.message(guard.line(rollback))
        window.clear()
        return step, self.init() if state is None else state
