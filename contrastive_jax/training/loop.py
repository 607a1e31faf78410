"""The training loop: `run_loop(plan, workdir)` trains the run `plan` describes
(`run_plan.build`), resuming from `workdir`, and evaluates; `run_plan.train_and_evaluate`
is the same from a config.

    <workdir>/checkpoints --resume.restore_latest--> state and its step s
    batch_numbering.BatchNumbering(plan.data).stream_after(s) --> this process's rows of each batch
    memory_fit.compile_train_step: compiled for the largest batch; its memory per device checked (or exit 2)
    CompiledSteps: compiled once per global batch (config.train.batch_schedule's stages, batch_schedule)
    Trainer.train_step (that executable): forward, loss over the global batch in shard_map, optax
    every k steps: metrics.jsonl / TensorBoard (metric_writer), a checkpoint, evaluator.evaluation

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

import dataclasses
import functools
import os
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from contrastive_jax import console, run_dir, sharding
from contrastive_jax.data import batch_numbering
from contrastive_jax.evaluation import evaluator
from contrastive_jax.models import saved_model
from contrastive_jax.training import (
    batch_schedule,
    checkpoint,
    distributed,
    loss_guard,
    memory_fit,
    metric_writer,
    resume,
)


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    """The loop's cadences, as plain values (`config.train`, `config.checkpoint`,
    `config.eval`; their comments in configs/default.py)."""

    num_train_steps: int
    log_every_steps: int
    checkpoint_every_steps: int  # 0: only at the end
    checkpoint_max_to_keep: int
    eval_every_steps: int  # 0: only at the end


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


def _global_batch(batch: dict[str, np.ndarray], data_sharding) -> dict[str, jax.Array]:
    return {k: jax.make_array_from_process_local_data(data_sharding, v) for k, v in batch.items()}


def run_loop(plan, workdir: str) -> dict[str, float]:
    """`run_plan.train_and_evaluate` of the run `plan` (a `run_plan.RunPlan`) describes:
    trains from `workdir`'s newest good checkpoint (or from the start) and evaluates;
    returns the final evaluation."""
    trainer, cadences = plan.trainer, plan.loop_settings
    workdir = run_dir.prepare(workdir)
    ckpt = checkpoint.Checkpointer(
        os.path.join(workdir, run_dir.CHECKPOINTS), max_to_keep=cadences.checkpoint_max_to_keep
    )
    guard = loss_guard.LossGuard(plan.guard, workdir, lead=jax.process_index() == 0)
    schedule = batch_schedule.BatchSchedule(plan.batch_schedule, sharding.batch_shards(trainer.mesh))
    numbering = batch_numbering.BatchNumbering(
        plan.data,
        guard.skipped,
        nan_batches=plan.guard.inject_nan_at_batches,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        stages=schedule,
    )
    run_line = functools.partial(
        console.run_line,
        trainer.mesh,
        workdir,
        global_batch_size=plan.data.global_batch_size,
        num_steps=cadences.num_train_steps,
    )
    try:
        opened_at = ckpt.latest_step() or 0
        ds = numbering.stream_after(opened_at)
        init, abstract_state = trainer.init_state(ds.element_spec)
        start_step, state = resume.restore_latest(ckpt, plan.run_config, abstract_state)
        if state is not None and (done := _finished_results(workdir, start_step, cadences.num_train_steps)):
            logging.info("%s", run_line())
            logging.info("%s", done[1])
            return done[0]
        largest, memory = memory_fit.compile_train_step(plan, abstract_state, ds.element_spec)
        logging.info("%s", run_line(memory=memory))
        if state is None:
            state = init()
        else:
            position = ckpt.restore_position(start_step)
            guard.restore(position)
            schedule.restore(position)
            logging.info("Resumed from %s at step %d.", ckpt.directory, start_step)
        if start_step != opened_at or schedule.stages != plan.batch_schedule.stages:  # an older checkpoint; decisions
            ds = numbering.stream_after(start_step)
        model = saved_model.with_inputs(plan.saved_model, ds.element_spec)
        step_fn = CompiledSteps(trainer, abstract_state, ds.element_spec, {plan.batch_schedule.largest: largest})
        run = _Run(plan, step_fn, ckpt, guard, numbering, init, abstract_state, workdir, model, schedule)
        return run.train_from(state, ds, start_step)
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


class CompiledSteps:
    """`steps(state, batch)`: the train step compiled once for each global batch it meets
    (`Trainer.compile_step`; a batch schedule's stages), the first ones given in `compiled`
    (`{global batch: executable}`: the memory check's). `compiled` holds them all."""

    def __init__(self, trainer, abstract_state, element_spec, compiled: dict[int, Any]):
        self._trainer, self._abstract_state, self._element_spec = trainer, abstract_state, element_spec
        self.compiled = dict(compiled)

    def __call__(self, state, batch: dict[str, jax.Array]):
        size = batch["a"].shape[0]
        if size not in self.compiled:
            self.compiled[size] = self._trainer.compile_step(self._abstract_state, self._element_spec, size)
        return self.compiled[size](state, batch)


class _Run:
    """The loop of `run_loop`: steps, metric windows, saves, evaluations and rollbacks.

    `step_fn` is the compiled train step; `numbering` the run's batches
    (`batch_numbering.BatchNumbering`); `init()` the initial state (a rollback before the
    first checkpoint restarts from it); `model` the model's settings saved with each
    checkpoint (`saved_model`); `schedule` each step's global batch and its decisions
    (`batch_schedule.BatchSchedule`).
    """

    def __init__(
        self,
        plan,
        step_fn,
        ckpt,
        guard: loss_guard.LossGuard,
        numbering,
        init,
        abstract_state,
        workdir,
        model,
        schedule: batch_schedule.BatchSchedule,
    ):
        self.plan, self.step_fn, self.ckpt, self.guard, self.numbering = plan, step_fn, ckpt, guard, numbering
        self.init, self.abstract_state, self.workdir, self.model = init, abstract_state, workdir, model
        self.schedule = schedule
        self.lead = jax.process_index() == 0
        self.evaluate = evaluator.evaluation(plan.trainer.mesh, plan.data, plan.eval_settings, plan.match_keys)

    def _save(self, step: int, state) -> None:
        """Starts saving `state` as checkpoint `step`, with the input position, the guard's
        record and the model's settings."""
        position = batch_numbering.position(self.plan.run_config, step) | self.guard.saved() | self.schedule.saved()
        self.ckpt.save(step, state, position, self.model)

    def _every(self, k: int, step: int) -> bool:
        return step == self.plan.loop_settings.num_train_steps or (k > 0 and step % k == 0)

    def _metric_window(self, metrics_out, progress, start_step: int) -> metric_writer.MetricWindow:
        """The metric window of a loop from `start_step`: each step's global batch and the
        shards it is split over (the noise scale's two batch sizes)."""
        plan = self.plan
        return metric_writer.MetricWindow(
            log_every_steps=plan.loop_settings.log_every_steps,
            num_train_steps=plan.loop_settings.num_train_steps,
            batch_of=lambda step: self.schedule.batch_after(step - 1),
            batch_shards=sharding.batch_shards(plan.trainer.mesh),
            guard=self.guard,
            metrics_out=metrics_out,
            progress=progress,
            start_step=start_step,
        )

    def train_from(self, state, ds, start_step: int) -> dict[str, float]:
        """Trains from `start_step` (`ds`: the stream from its batch); returns the final
        evaluation, after writing it to `eval_results.json`."""
        cadences, ckpt = self.plan.loop_settings, self.ckpt
        num_steps = cadences.num_train_steps
        data_sharding = sharding.data_sharding(self.plan.trainer.mesh)
        metrics_out = metric_writer.MetricWriter(self.workdir, enabled=self.lead, start_step=start_step)
        if start_step > 0:  # a machine-readable record of every resume, kept across resumes
            metrics_out.write(start_step, {"resumed_from_step": start_step})
        progress = console.Progress(total_steps=num_steps, start_step=start_step, enabled=self.lead)
        window = self._metric_window(metrics_out, progress, start_step)
        batches = self.numbering.batches_after(start_step, opened=iter(ds))
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
                            self._record(window, *pending)  # step t-1's metrics, read after dispatching step t
                        pending = (step, metrics)
                        progress.step_done()
                        # The same count in every process, never going back (unlike `step`).
                        preempted = preemption.reached(dispatched)
                        save = preempted or self._every(cadences.checkpoint_every_steps, step)
                        run_eval = not preempted and self._every(cadences.eval_every_steps, step)
                        if save or run_eval or self.schedule.decides_after(step):
                            self._record(window, *pending)  # never save or evaluate a bad state
                            pending = None
                    except loss_guard.BadLoss as bad:
                        pending = None
                        step, state = self._roll_back(bad, window, progress)
                        batches = self.numbering.batches_after(step)
                        continue
                    if save:
                        self._save(step, state)
                    if preempted:
                        break
                    if run_eval:
                        results = self.evaluate(state)
                        window.metrics_out.write(step, {f"eval/{k}": v for k, v in results.items()})
                        progress.message(console.eval_line(step, results))
                    if (save or run_eval) and window.empty:  # at a logging step: time the steps alone
                        window.restart_timer()
            if start_step >= num_steps:  # already trained: evaluate the restored state
                results = self.evaluate(state)
        finally:
            progress.close()
            window.metrics_out.close()
        if preempted:
            raise Preempted(step, ckpt.directory)
        ckpt.wait()  # eval_results.json marks a finished run: only once its checkpoint is complete
        if self.lead:
            final_step = max(start_step, num_steps)  # a run resumed past its steps: the state's
            run_dir.write_eval_results(self.workdir, final_step, results)
        return results

    def _record(self, window: metric_writer.MetricWindow, step: int, metrics) -> None:
        """`window.record`s step `step`'s metrics (at a logging step, with a mixture's
        epochs per set) and gives them to the batch schedule, whose decision after it (if
        any) is written with them and logged in a line."""
        values = window.record(step, metrics)
        if window.empty and (epochs := self.numbering.epochs_through(step)):  # logged: a mixture's epochs too
            window.metrics_out.write(step, epochs)
        decision = self.schedule.observe(step, values)
        if decision is not None:
            window.metrics_out.write(step, decision.metrics())
            if self.lead:
                logging.info("%s", decision.line())

    def _roll_back(self, bad: loss_guard.BadLoss, window: metric_writer.MetricWindow, progress) -> tuple[int, Any]:
        """`(step, state)` after a bad loss: the newest checkpoint's (or the initial state
        at step 0), its record written and logged; FloatingPointError when it stops instead."""
        ckpt, guard = self.ckpt, self.guard
        ckpt.wait()  # a save still being written is the newest checkpoint
        last = ckpt.latest_step()
        guard.stop_unless_rolling_back(bad, f"step {last} in {ckpt.directory}" if last is not None else "none")
        step, state = resume.restore_latest(ckpt, self.plan.run_config, self.abstract_state)
        guard.restore(ckpt.restore_position(step) if state is not None else None)
        rollback = guard.roll_back(bad, step)
        window.metrics_out.close()  # drop the lines of the steps undone, as a resume does
        window.metrics_out = metric_writer.MetricWriter(self.workdir, enabled=self.lead, start_step=step)
        window.metrics_out.write(
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
