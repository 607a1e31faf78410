"""The training loop: `train_and_evaluate(config, workdir)` trains, resuming from
`workdir`, and evaluates.

    config --trainer.build--> Trainer (model, optimizer, loss; plain values for all below)
    <workdir>/checkpoints --resume.restore_latest--> state and its step s
    input_pipeline.train_dataset(trainer.data, start_step=s) --> this process's rows of each batch
    memory_fit.compile_train_step: compiled once; its memory per device checked (or exit 2)
    Trainer.train_step (that executable): forward, loss over the global batch in shard_map, optax
    every k steps: metrics.jsonl / TensorBoard, a checkpoint, evaluate.Evaluator

One pure `train_step`, jitted once with the state placed on a (data, fsdp) mesh (the
parameters split over fsdp), the batch split over both axes, and the state donated.
Outputs in `workdir`: `checkpoints/<step>/`, `metrics.jsonl`, `tensorboard/`,
`eval_results.json`; files are written by process 0.

Nothing lost: a run resumes from its newest good checkpoint (state, input position and
RNG are all in it, so the resumed run reaches the uninterrupted run's parameters bit for
bit); SIGTERM finishes the current step, saves and raises `Preempted`; a bad loss stops
or is rolled back to the newest checkpoint, skipping its batches (`bad_loss`); a corrupt
checkpoint is reported and skipped for the previous one; resuming with another seed,
batch or data, or onto another model, is refused with the fields that changed.
Multi-process runs (`distributed.initialize`) train on one global batch per step whatever
the number of processes (see `input_pipeline`).
"""

import functools
import json
import os
import tempfile
import time

import jax
import ml_collections
import numpy as np
from absl import logging

from contrastive_jax import (
    bad_loss,
    checkpoint,
    console,
    data_sources,
    distributed,
    evaluate,
    input_pipeline,
    memory_fit,
    metric_writer,
    noise_scale,
    resume,
    sharding,
)
from contrastive_jax.config_lib import ConfigError
from contrastive_jax.sharding import DATA_AXIS
from contrastive_jax.trainer import Trainer, build


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


def prepare_workdir(workdir: str | os.PathLike | None) -> str:
    """Creates `workdir` if needed and returns its absolute path.

    Raises:
      ConfigError: `workdir` is not given, or cannot be created or written.
    """
    if not workdir:
        raise ConfigError("No workdir: pass --workdir=DIR (created if missing) for checkpoints and metrics.")
    workdir = os.path.abspath(workdir)
    try:
        os.makedirs(workdir, exist_ok=True)
        with tempfile.TemporaryFile(dir=workdir):
            pass
    except OSError as e:
        raise ConfigError(
            f"--workdir={workdir} cannot be created or written ({e.strerror or e}); pass a "
            "directory you can write to (on storage every process shares)."
        ) from e
    return workdir


def _train_batches(data: data_sources.DataSettings, first_batch: int) -> input_pipeline.TrainStream:
    """This process's rows of the global batches numbered `first_batch`, `first_batch + 1`,
    ... (batch t: what step t reads when no batch was skipped, see `bad_loss`)."""
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

    Before the first step the train step is compiled (the executable the loop runs) and
    its memory per device checked against the device's (`memory_fit`). Logs a first line
    (backend, devices, batch, the step's memory per device), a short line per logging
    step, a line per rollback (`bad_loss`) and the headline metrics of each evaluation
    (`console`). A run that already reached `config.train.num_train_steps` and holds its
    evaluation returns that evaluation without compiling, training or evaluating again.

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
    mesh = sharding.make_mesh(fsdp=config.mesh.fsdp)
    trainer = build(config, mesh)
    workdir = prepare_workdir(workdir)
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=config.checkpoint.max_to_keep)
    guard = bad_loss.LossGuard(trainer.guard, workdir, lead=jax.process_index() == 0)
    run_line = functools.partial(
        console.run_line,
        mesh,
        workdir,
        global_batch_size=trainer.data.global_batch_size,
        num_steps=config.train.num_train_steps,
    )
    try:
        opened_at = ckpt.latest_step() or 0
        ds = _train_batches(trainer.data, guard.first_batch(opened_at))
        init, abstract_state = trainer.init_state(ds.element_spec)
        start_step, state = resume.restore_latest(ckpt, config, abstract_state)
        if state is not None and (done := _finished_results(workdir, start_step, config)):
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
        return _train(trainer, step_fn, ckpt, guard, init, state, abstract_state, ds, start_step, workdir)
    finally:  # also on errors: finish the saves already started
        ckpt.close()


def _finished_results(workdir: str, start_step: int, config) -> tuple[dict[str, float], str] | None:
    """The saved evaluation when the run already trained its steps and evaluated them,
    and the line that says so."""
    path = os.path.join(workdir, "eval_results.json")
    if start_step < config.train.num_train_steps or not os.path.exists(path):
        return None
    with open(path) as f:
        results = json.load(f)
    if results.pop("step", None) != start_step:
        return None
    return results, (
        f"Already done: {console.display_path(workdir)} holds step {start_step} of "
        f"{config.train.num_train_steps} and its evaluation; nothing to train. Raise "
        "--config.train.num_train_steps to train longer, or use a new --workdir."
    )


def _evaluator(ev: ml_collections.ConfigDict, trainer: Trainer, mesh: jax.sharding.Mesh) -> evaluate.Evaluator:
    """The evaluator of `config.eval` (`ev`) on `mesh`: the eval split, and the training
    split for the kNN and linear probes when they are on and the data have labels."""
    data = trainer.data
    eval_arrays = input_pipeline.eval_arrays(data, ev.split, class_range=ev.class_range)
    probe_arrays = None
    if "label" in eval_arrays and (ev.knn_k > 0 or ev.linear_probe):
        probe_arrays = input_pipeline.eval_arrays(data, data.train_split, class_range=data.train_class_range)
    return evaluate.Evaluator(
        mesh,
        eval_arrays,
        batch_size=ev.batch_size,
        recall_ks=ev.recall_ks,
        match_keys=trainer.match_keys or (None, None),
        probe_arrays=probe_arrays,
        knn_k=ev.knn_k,
        linear_probe=ev.linear_probe,
    )


def _roll_back(bad: bad_loss.BadLoss, guard: bad_loss.LossGuard, ckpt, init, abstract_state, config):
    """`(step, state, record)` after a bad loss: the newest checkpoint's (or the initial
    state at step 0) and the rollback's record; FloatingPointError when it stops instead."""
    ckpt.wait()  # a save still being written is the newest checkpoint
    last = ckpt.latest_step()
    guard.stop_unless_rolling_back(bad, f"step {last} in {ckpt.directory}" if last is not None else "none")
    step, state = resume.restore_latest(ckpt, config, abstract_state)
    guard.restore(ckpt.restore_position(step) if state is not None else None)
    return step, init() if state is None else state, guard.roll_back(bad, step)


def _train(
    trainer: Trainer,
    step_fn,
    ckpt: checkpoint.Checkpointer,
    guard: bad_loss.LossGuard,
    init,
    state,
    abstract_state,
    ds,
    start_step: int,
    workdir: str,
) -> dict[str, float]:
    """The loop of `train_and_evaluate` from `start_step`; returns the final evaluation.

    `step_fn` is the compiled train step; `init()` the initial state (a rollback before
    the first checkpoint restarts from it); `ds` the stream from `start_step`'s batch.
    """
    config = trainer.config
    num_steps = config.train.num_train_steps
    lead = jax.process_index() == 0
    data_sharding = sharding.data_sharding(trainer.mesh)
    # Evaluation runs whole in every process, on its own devices, from the state gathered
    # whole (the loss's state, which may be split over the devices, is not evaluated).
    if jax.process_count() == 1:
        eval_mesh, local_state = trainer.mesh, lambda state: state.replace(loss_state=None)
    else:
        eval_mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (DATA_AXIS,))
        gather = jax.jit(lambda state: state.replace(loss_state=None), out_shardings=sharding.replicated(trainer.mesh))
        local_state = lambda state: jax.tree.map(  # noqa: E731
            lambda x: jax.device_put(x.addressable_data(0), sharding.replicated(eval_mesh)), gather(state)
        )
    evaluator = _evaluator(config.eval, trainer, eval_mesh)
    writer = metric_writer.MetricWriter(workdir, enabled=lead, start_step=start_step)
    if start_step > 0:  # a machine-readable record of every resume, kept across resumes
        writer.write(start_step, {"resumed_from_step": start_step})
    progress = console.Progress(total_steps=num_steps, start_step=start_step, enabled=lead)
    open_at = lambda number: iter(_train_batches(trainer.data, number))  # noqa: E731
    batches = guard.batches(start_step, open_at, opened=iter(ds))
    window: list[dict[str, float]] = []  # the metrics of the steps since the last log
    timer_start, timed_steps = time.perf_counter(), 0  # steps finished since timer_start
    input_wait, skipped_records = 0.0, 0  # seconds waited for batches since timer_start; records skipped

    def record(step: int, metrics) -> None:
        """Fetches a finished step's metrics, raises BadLoss on a bad one, logs every k."""
        nonlocal timer_start, timed_steps, input_wait
        values = {k: float(v) for k, v in jax.device_get(metrics).items()}
        guard.check(step, values)
        window.append(values)
        if step == start_step + 1:  # the first step warms up: time the steps after it
            timer_start, timed_steps, input_wait = time.perf_counter(), 0, 0.0
        else:
            timed_steps += 1
        if step % config.train.log_every_steps == 0 or step == num_steps:
            scalars = {f"train/{k}": float(np.mean([w[k] for w in window])) for k in window[0]}
            seconds_per_step = (time.perf_counter() - timer_start) / max(timed_steps, 1)
            if noise_scale.SMALL_KEY in window[0]:
                scalars["train/noise_scale"] = noise_scale.window_b_simple(
                    window, config.train.global_batch_size, sharding.batch_shards(trainer.mesh)
                )
            if timed_steps:
                scalars["train/examples_per_second"] = config.train.global_batch_size / seconds_per_step
                scalars["train/input_wait_share"] = input_wait / (time.perf_counter() - timer_start)
            if skipped_records:
                scalars["train/skipped_records"] = skipped_records
            writer.write(step, scalars)
            progress.log(step, scalars, seconds_per_step=seconds_per_step if timed_steps else None)
            window.clear()
            timer_start, timed_steps, input_wait = time.perf_counter(), 0, 0.0

    def every(k: int, step: int) -> bool:
        return step == num_steps or (k > 0 and step % k == 0)

    results = {}
    pending = None  # (step, metrics) dispatched but not yet read
    preempted = False
    step, dispatched = start_step, 0  # dispatched: steps run, rolled back or not
    try:
        with distributed.Preemption() as preemption:
            while step < num_steps:
                step, dispatched = step + 1, dispatched + 1
                waiting_since = time.perf_counter()
                batch = next(batches)
                input_wait += time.perf_counter() - waiting_since
                skipped_records += int(batch.pop("skipped_records", 0))
                state, metrics = step_fn(state, _global_batch(batch, data_sharding))
                try:
                    if pending is not None:
                        record(*pending)  # step t-1's metrics, read after dispatching step t
                    pending = (step, metrics)
                    progress.step_done()
                    # The same count in every process, never going back (unlike `step`).
                    preempted = preemption.reached(dispatched)
                    save = preempted or every(config.checkpoint.every_steps, step)
                    run_eval = not preempted and every(config.eval.every_steps, step)
                    if save or run_eval:
                        record(*pending)  # never save or evaluate a bad state
                        pending = None
                except bad_loss.BadLoss as bad:
                    pending = None
                    step, state, rollback = _roll_back(bad, guard, ckpt, init, abstract_state, config)
                    writer.close()  # drop the lines of the steps undone, as a resume does
                    writer = metric_writer.MetricWriter(workdir, enabled=lead, start_step=step)
                    writer.write(
                        step,
                        {
                            "rollback/bad_step": rollback["bad_step"],
                            "rollback/first_skipped_batch": rollback["skipped_batches"][0],
                            "rollback/skipped_batches": len(rollback["skipped_batches"]),
                        },
                    )
                    progress.message(guard.line(rollback))
                    window.clear()
                    batches = guard.batches(step, open_at)
                    continue
                if save:
                    ckpt.save(step, state, resume.position(config, step) | guard.saved())
                if preempted:
                    break
                if run_eval:
                    results = evaluator(local_state(state))
                    writer.write(step, {f"eval/{k}": v for k, v in results.items()})
                    progress.message(console.eval_line(step, results))
                if (save or run_eval) and not window:  # at a logging step: time the steps alone
                    timer_start, input_wait = time.perf_counter(), 0.0
        if start_step >= num_steps:  # already trained: evaluate the restored state
            results = evaluator(local_state(state))
    finally:
        progress.close()
        writer.close()
    if preempted:
        raise Preempted(step, ckpt.directory)
    if lead:
        final_step = max(start_step, num_steps)  # a run resumed past its steps: the state's
        evaluate.write_json(os.path.join(workdir, "eval_results.json"), final_step, results)
    return results
