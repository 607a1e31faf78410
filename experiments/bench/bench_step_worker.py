"""One measurement of ``bench_step.py``, in the fresh process that runs it.

``bench_step`` starts ``python -m experiments.bench.bench_step --worker SPEC`` per measurement (a fresh process:
its own device memory, its own peak; a failure stays its own), which calls
``run_worker(spec)`` and prints the result as one JSON line. The workers:

* ``jax_step``: the project's train step (``run_plan.build`` of ``configs/finetune_clip.py``
  on the benchmark's open_clip checkpoint and records: the released-layout towers,
  AdamW, bfloat16 activations and logits' matmul, the global-batch CLIP loss) at a
  batch, then at the largest batch that fits (``largest_batch``), with ``remat``;
* ``torch_step``: open_clip's own model and a minimal training step (AMP bfloat16,
  ``nn.MultiheadAttention``'s SDPA, ``set_grad_checkpointing`` as remat, ``ClipLoss``,
  ``torch.optim.AdamW``) on the same checkpoint and batches;
* ``jax_loss`` / ``torch_loss``: the losses alone, forward and backward, bfloat16 inputs:
  ours (SigLIP, CLIP, streamed in XLA's tiles and in the fused Pallas kernels,
  ``loss.kernel``) beside ``siglip-kernel``'s ``fused_siglip_loss`` and
  Inf-CL's ``cal_inf_loss`` (both directions, CLIP's symmetric loss);
* ``input``: the record pipeline's images/s with a worker per core;
* ``overhead``: the default config's train step (8 simulated CPU devices) beside its
  parts (``step_parts``), each compiled alone on the same mesh: the towers' forward and
  backward, the loss's, the optimizer's update; ``jax_step`` does the same for the ViT
  step when asked (``spec["parts"]``).

Importing this module imports neither JAX nor PyTorch.
"""

from __future__ import annotations

import functools
import math
import os
import pathlib
import time
from collections.abc import Callable

from experiments.bench.bench_losses_worker import correlated_pairs

# The memory a largest batch may fill: this share of what the device's allocator has.
MEMORY_SHARE = 0.92
TEMPERATURE = 0.07
SIGLIP_BIAS = -10.0


def largest_batch(full: int, half: int, batch: int, limit: int, *, multiple: int = 8) -> int:
    """The largest batch, a multiple of `multiple`, whose memory fits `limit` bytes, from
    the memory at `batch` (`full`) and at `batch // 2` (`half`): memory is affine in the
    batch (the state's bytes plus the activations' per example), extrapolated to the limit.

    >>> largest_batch(1000 + 10 * 64, 1000 + 10 * 32, 64, 5000)
    400
    """
    per_example = max((full - half) / (batch - batch // 2), 1e-9)
    fixed = full - per_example * batch
    return max(multiple, int((limit - fixed) / per_example) // multiple * multiple)


def _limit(full: int, half: int, device_limit: int | None) -> int:
    """The bytes a largest batch may fill: `MEMORY_SHARE` of the accelerator's allocator;
    on a CPU (no allocator to fill: the tiny run) the memory of twice the batch's
    activations beyond the common batch's, so that the search runs there too."""
    return int(MEMORY_SHARE * device_limit) if device_limit else full + 2 * (full - half)


def _timed(step: Callable[[], object], repeats: int) -> float:
    """Median seconds of `step()` (which waits for its result) after a warm-up call
    (`bench_grad_cache.time_in_turns` of one call)."""
    from experiments.bench.bench_grad_cache import time_in_turns

    return time_in_turns({"step": step}, repeats=repeats)["step"]


# ---------------------------------------------------------------- the JAX train step


def finetune_config(spec: dict, batch: int, **fields):
    """`configs/finetune_clip.py` on the benchmark's checkpoint, records and tokenizer:
    the whole batch at once (no micro-batches), plain AdamW (no layer decay), bfloat16
    activations and logits' matmul, the towers rematerialised as `spec["remat"]` says."""
    from configs import finetune_clip
    from contrastive_jax.config_lib import override

    return override(
        finetune_clip.get_config(),
        {
            "model.init_from": spec["checkpoint"],
            "model.embed_dim": spec["embed_dim"],
            "model.compute_dtype": "bfloat16",
            "model.remat": spec.get("remat", "none"),
            "model.attention": spec.get("attention", "auto"),
            "loss.matmul_dtype": "bfloat16",
            "data.records": spec["records"],
            "data.tokenizer": spec["tokenizer"],
            "data.image_size": spec["image_size"],
            "data.text_max_length": spec["context_length"],
            "data.num_workers": 0,
            "train.global_batch_size": batch,
            "train.micro_batch_size": 0,
            "eval.split": "train",  # the benchmark's records have one split
            "optim.layer_decay": 1.0,
            "optim.warmup_steps": 10,
            **fields,
        },
    )


def batch_file(spec: dict, batch: int) -> pathlib.Path:
    """Where the JAX step leaves its first batch (`images` uint8 [B, H, W, 3], `tokens`
    [B, L]) for open_clip's step at the same batch size."""
    return pathlib.Path(spec["checkpoint"]).parent / f"batch_{batch}.npz"


class JaxStep:
    """The project's train step at global batch `batch`: compiled, its state created, one
    real batch from the record pipeline placed on the mesh."""

    def __init__(self, spec: dict, batch: int):
        import jax
        import numpy as np

        from contrastive_jax import sharding
        from contrastive_jax.training import run_plan

        self.run = run_plan.build(finetune_config(spec, batch), sharding.make_mesh()).trainer
        first = _first_batch(spec, batch)
        init, self.abstract = self.run.init_state(first)
        start = time.perf_counter()
        self.compiled = self.run.compile_step(self.abstract, first)
        self.compile_seconds = time.perf_counter() - start
        self.state = jax.block_until_ready(init())
        self.batch = jax.device_put(first, sharding.data_sharding(self.run.mesh))
        shared = batch_file(spec, batch)
        if not shared.exists():  # for open_clip's step: the same inputs, the same first loss
            np.savez(shared, images=np.asarray(first["a"]), tokens=np.asarray(first["b"]))

    def __call__(self):
        import jax

        self.state, metrics = self.compiled(self.state, self.batch)
        return jax.block_until_ready(metrics["loss"])


def _first_batch(spec: dict, batch: int) -> dict:
    """The record pipeline's first batch of `batch` rows (`a` images, `b` tokens, as
    numpy): beyond the record set's `spec["images"]` examples (a largest batch), that
    set's batch repeated row by row to `batch` rows. The step's time and memory do not
    depend on which examples fill it; its first loss does (repeats are false negatives)."""
    import numpy as np

    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training.run_plan import data_settings

    drawn = min(batch, spec["images"])
    first = next(iter(input_pipeline.train_dataset(data_settings(finetune_config(spec, drawn)))))
    rows = np.arange(batch) % drawn
    return {name: np.asarray(array)[rows] for name, array in first.items()}


def model_flops_per_example(settings) -> float:
    """Model FLOPs per example of a CLIP training step of released-layout `settings`
    (`released.base_model.TwoTowerSettings`): 3 x the towers' forward matmuls (each block's
    projections 2 T (4 W^2 + 2 W mlp_dim) and attention's 4 T^2 W over its T tokens, the
    patch embedding, the final projections to `embed_dim`), counted by hand, not by XLA,
    whose cost analysis on a GPU leaves out the cuBLAS and cuDNN calls (it gave ViT-B/16
    1% of an H200's peak). Layer norms, activations and the softmax are left out, as MFU
    conventionally does, and so is the loss (its 6 N D per example depend on the batch N:
    the report adds them)."""

    def tower(tokens: int, towers) -> float:
        per_block = (
            2 * tokens * (4 * towers.width**2 + 2 * towers.width * towers.mlp_dim) + 4 * tokens**2 * towers.width
        )
        return towers.depth * per_block + 2 * towers.width * settings.embed_dim

    patches = (settings.image_size // settings.patch_size) ** 2
    embedding = 2 * patches * 3 * settings.patch_size**2 * settings.image.width
    forward = embedding + tower(patches + 1, settings.image) + tower(settings.context_length, settings.text)
    return 3.0 * forward


def _device_memory() -> tuple[int | None, int | None]:
    """(the allocator's limit, its peak so far) in bytes on an accelerator; (None, None) on a CPU."""
    import jax

    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    return (stats["bytes_limit"], stats["peak_bytes_in_use"]) if stats else (None, None)


def _jax_step(spec: dict) -> dict:
    from contrastive_jax.training import memory_fit

    out = {"framework": "jax", "remat": spec["remat"], "points": []}
    try:
        step = JaxStep(spec, spec["batch"])
    except Exception as error:  # noqa: BLE001 (a cuDNN kernel that refuses at trace or compile time)
        # JAX's refusals of shapes are NotImplementedErrors that need not name cuDNN
        if not isinstance(error, NotImplementedError) and "cudnn" not in str(error).lower():
            raise
        out["attention_fallback"] = f"cuDNN's attention failed, XLA's measured: {str(error)[:300]}"
        spec = dict(spec, attention="xla")
        step = JaxStep(spec, spec["batch"])
    out["model_flops_per_example"] = model_flops_per_example(step.run.model.settings)
    out["points"].append(_jax_point(step, spec))
    if spec.get("parts"):  # the step beside its parts, at this batch (donates the state)
        out["parts"] = step_parts(step.run, step.state, step.batch, spec["repeats"], compiled_step=step.compiled)
    # at half the batch: the same state and trainer, compiled (not run) for fewer rows
    half_step = step.run.compile_step(step.abstract, step.batch, global_batch=spec["batch"] // 2)
    full, half = memory_fit.needed_bytes(step.compiled), memory_fit.needed_bytes(half_step)
    del step
    largest = largest_batch(full, half, spec["batch"], _limit(full, half, _device_memory()[0]))

    def jax_out_of_memory(error: Exception) -> bool:  # XLA's out-of-memory error has no public type
        return "RESOURCE_EXHAUSTED" in str(error) or "out of memory" in str(error).lower()

    return _with_largest(out, lambda b: _jax_point(JaxStep(spec, b), spec, largest=True), largest, jax_out_of_memory)


def _with_largest(out: dict, point: Callable[[int], dict], largest: int, out_of_memory, on_refusal=None) -> dict:
    """`out` with `point(batch)` at the estimated `largest` batch appended to its points,
    or at 10% less at a time (at most three tries) while the allocator refuses it
    (`out_of_memory(error)`; `on_refusal()` frees what the refused try held); the
    refused batches under `out["refused"]`. Any other failure is `out["largest_error"]`,
    the common batch's point kept."""
    for _ in range(3):
        try:
            out["points"].append(point(largest))
            break
        except Exception as error:  # noqa: BLE001 (reported, the measured point kept)
            if not out_of_memory(error):
                out["largest_error"] = f"batch {largest}: {type(error).__name__}: {str(error)[:300]}"
                break
            out.setdefault("refused", []).append(largest)
            if on_refusal:
                on_refusal()
            largest = int(largest * 0.9) // 8 * 8
    return out


def _jax_point(step: JaxStep, spec: dict, *, largest: bool = False) -> dict:
    from contrastive_jax.training import memory_fit

    first_loss = float(step())
    seconds = _timed(step, spec["repeats"])
    batch = step.run.global_batch_size
    _, peak = _device_memory()
    return {
        "batch": batch,
        "largest": largest,
        "step_seconds": seconds,
        "images_per_second": batch / seconds,
        "compiled_bytes": memory_fit.needed_bytes(step.compiled),
        "peak_bytes": peak,
        "compile_seconds": step.compile_seconds,
        "first_loss": first_loss,
    }


# ---------------------------------------------------------------- open_clip's step


def open_clip_model(spec: dict):
    """open_clip's CLIP of `spec["model"]` (a name, or the tiny config's dict), with the
    benchmark checkpoint's weights when `spec` names one."""
    import open_clip
    import torch

    if isinstance(spec["model"], str):
        model = open_clip.create_model(spec["model"])
    else:
        model = open_clip.model.CLIP(**spec["model"])
    if spec.get("checkpoint"):
        from safetensors.torch import load_file

        model.load_state_dict(load_file(spec["checkpoint"]))
    del torch
    return model


def _torch_point(spec: dict, model, optimizer, batch: int, *, largest: bool = False) -> dict:
    """open_clip's training step at `batch`, timed (AMP bfloat16, `ClipLoss`, `optimizer`,
    the logit scale clamped to 100): images/s, peak device memory, the first loss."""
    import open_clip
    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    clip_loss = open_clip.loss.ClipLoss()
    images, texts = _torch_inputs(spec, batch)
    images, texts = images.to(device), texts.to(device)
    losses = []

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            image_features, text_features, logit_scale = model(images, texts)
            loss = clip_loss(image_features, text_features, logit_scale)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        if cuda:
            torch.cuda.synchronize()
        losses.append(float(loss))

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds = _timed(step, spec["repeats"])
    return {
        "batch": batch,
        "largest": largest,
        "step_seconds": seconds,
        "images_per_second": batch / seconds,
        "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "first_loss": losses[0],
    }


def _torch_step(spec: dict) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    model = open_clip_model(spec).to("cuda" if cuda else "cpu")
    model.set_grad_checkpointing(spec["remat"] != "none")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)

    def point(batch: int, *, largest: bool = False) -> dict:
        return _torch_point(spec, model, optimizer, batch, largest=largest)

    out = {"framework": "torch", "remat": spec["remat"], "points": [point(spec["batch"])]}
    if not cuda:
        out["largest_note"] = "not searched on a CPU: PyTorch keeps no allocator statistics there"
        return out

    full, half = out["points"][0]["peak_bytes"], point(spec["batch"] // 2)["peak_bytes"]
    largest = largest_batch(
        full, half, spec["batch"], _limit(full, half, torch.cuda.get_device_properties(0).total_memory)
    )

    def free_memory():
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()

    return _with_largest(
        out,
        lambda b: point(b, largest=True),
        largest,
        lambda error: isinstance(error, torch.OutOfMemoryError),
        free_memory,
    )


def _torch_inputs(spec: dict, batch: int):
    """open_clip's inputs at `batch`: the JAX step's first batch where it left one
    (`batch_file`), its pixels normalised as open_clip's preprocessing does, else random
    pixels and token ids ending in the end-of-text token. `[B, 3, H, W]`, `[B, L]`."""
    import numpy as np
    import torch

    from contrastive_jax.models.released import open_clip_layout

    shared = batch_file(spec, batch)
    if shared.exists():
        arrays = np.load(shared)
        pixels = arrays["images"].astype(np.float32) / 255.0
        pixels = (pixels - np.array(open_clip_layout.OPENAI_MEAN)) / np.array(open_clip_layout.OPENAI_STD)
        return torch.tensor(pixels.transpose(0, 3, 1, 2), dtype=torch.float32), torch.tensor(arrays["tokens"]).long()
    generator = torch.Generator().manual_seed(0)
    size, length = spec["image_size"], spec["context_length"]
    images = torch.randn((batch, 3, size, size), generator=generator)
    texts = torch.randint(1, 49407, (batch, length), generator=generator)
    texts[:, -1] = 49407  # the end-of-text token, read by the text tower
    return images, texts


# ---------------------------------------------------------------- the losses alone


def _jax_loss(spec: dict) -> dict:
    import jax
    import jax.numpy as jnp

    from contrastive_jax import losses

    a, b = (jnp.asarray(x, jnp.bfloat16) for x in correlated_pairs(spec["n"], spec["d"]))
    fns = {}
    for kernel, suffix in (("xla", ""), ("pallas", "_pallas")):  # XLA's tiles, then the fused Pallas kernels
        streamed = losses.Streaming(chunk_size="auto", matmul_dtype="bfloat16", kernel=kernel)
        fns[f"siglip{suffix}"] = functools.partial(
            losses.siglip_loss, temperature=TEMPERATURE, bias=SIGLIP_BIAS, streaming=streamed
        )
        fns[f"clip{suffix}"] = functools.partial(losses.clip_loss, temperature=TEMPERATURE, streaming=streamed)
    out = {}
    for name, fn in fns.items():
        try:
            compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(a, b).compile()
        except Exception as error:  # noqa: BLE001 (a Pallas kernel Triton does not lower: the others still run)
            out[name] = {"error": f"{type(error).__name__}: {error}"[:300]}
            continue
        value = compiled(a, b)[0]
        seconds = _timed(lambda c=compiled: jax.block_until_ready(c(a, b)), spec["repeats"])
        _, peak = _device_memory()
        memory = compiled.memory_analysis()
        out[name] = {
            "seconds": seconds,
            "value": float(value),
            "temp_bytes": memory.temp_size_in_bytes,
            "peak_bytes": peak,
        }
    return out


def _torch_loss(spec: dict) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"note": "siglip-kernel and Inf-CL are Triton kernels: they need a CUDA GPU"}
    a, b = (torch.tensor(x, device="cuda", dtype=torch.bfloat16) for x in correlated_pairs(spec["n"], spec["d"]))
    log_t = torch.tensor(math.log(1 / TEMPERATURE), device="cuda")
    bias = torch.tensor(SIGLIP_BIAS, device="cuda")

    def kernels():
        from siglip_kernel import fused_siglip_loss

        yield "siglip_kernel", lambda a, b: fused_siglip_loss(a, b, log_t, bias)
        from inf_cl import cal_inf_loss

        scale = 1 / TEMPERATURE  # both directions: CLIP's symmetric loss, as ours
        yield "inf_cl", lambda a, b: 0.5 * (cal_inf_loss(a, b, scale=scale) + cal_inf_loss(b, a, scale=scale))

    return {name: _torch_loss_point(fn, a, b, spec["repeats"]) for name, fn in kernels()}


def _torch_loss_point(fn, a, b, repeats: int) -> dict:
    """Seconds, value and peak memory beyond the inputs of `fn(a, b)`'s forward and backward."""
    import torch

    x, y = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    values = []

    def step():
        x.grad = y.grad = None
        loss = fn(x, y)
        loss.backward()
        torch.cuda.synchronize()
        values.append(float(loss))

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    seconds = _timed(step, repeats)
    return {"seconds": seconds, "value": values[-1], "peak_bytes": torch.cuda.max_memory_allocated() - base}


# ---------------------------------------------------------------- input and overhead


def _input(spec: dict) -> dict:
    from experiments.bench import bench_input

    workers = os.cpu_count()
    seconds_per_image = 1 / bench_input.pipeline(spec["records"], spec["image_size"], spec["batches"], workers)
    return {"workers": workers, "images_per_second": 1 / seconds_per_image, "image_size": spec["image_size"]}


def step_parts(run, state, batch, repeats: int, *, compiled_step=None) -> dict:
    """A train step's seconds beside its parts', each compiled alone on `run`'s mesh and
    timed in turns with the step (`bench_grad_cache.time_in_turns`):
    `towers` (the model's forward and backward to `za`, `zb`, in training mode as the step
    runs them: dropout drawn, BatchNorm's statistics updated), `loss` (the global loss's
    value and gradients on the step's own embeddings), `optimizer` (the update and its
    application on gradients shaped as the parameters). `step` runs `run`'s compiled step.

    Args:
      run: a `trainer.Trainer` (`run_plan.build(...).trainer`).
      state: its `TrainState` on the mesh (donated by the step: not used afterwards).
      batch: a global batch on the mesh.
      repeats: timed calls per part (the median is kept).
      compiled_step: `run`'s step compiled for `state` and `batch`; None: compiled here.
    """
    import jax
    import optax

    from experiments.bench.bench_grad_cache import time_in_turns

    inputs = {k: v for k, v in batch.items() if k in ("a", "b")}  # arguments, not constants: split as the step's

    def embeddings(params, inputs):  # as the step runs the towers: training mode, dropout drawn
        out, _ = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats},
            inputs["a"],
            inputs.get("b"),
            train=True,
            rngs={"dropout": jax.random.fold_in(jax.random.key(run.seed), state.step)},
            mutable=["batch_stats"],
        )
        return {"za": out["za"], "zb": out["zb"]}, {"temperature": out["temperature"]}

    batched, shared = jax.jit(embeddings)(state.params, inputs)

    def towers(params, inputs):
        out, pull_back = jax.vjp(lambda p: embeddings(p, inputs)[0], params)
        return pull_back(out)  # any cotangent of the embeddings' shape: the same work

    def loss(batched, shared, data):
        return run.global_loss(batched, shared, data)[0]

    def update(grads, opt_state, params):
        updates, opt_state = run.optim.tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    parts = {
        "towers": (jax.jit(towers), (state.params, inputs)),
        "loss": (jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), (batched, shared, run.loss_data(batch))),
        "optimizer": (jax.jit(update), (state.params, state.opt_state, state.params)),
    }
    calls = {}
    for name, (fn, args) in parts.items():
        compiled = fn.lower(*args).compile()
        calls[name] = lambda c=compiled, a=args: jax.block_until_ready(c(*a))
    if compiled_step is None:
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        compiled_step = run.jit_train_step(abstract).lower(state, batch).compile()
    current = [jax.tree.map(lambda x: x.copy(), state)]  # the step donates its state; the parts read this one

    def train_step():
        current[0], metrics = compiled_step(current[0], batch)
        jax.block_until_ready(metrics["loss"])

    seconds = time_in_turns({**calls, "step": train_step}, repeats=repeats)  # in turns: load hits all alike
    seconds["step_over_towers_and_loss"] = seconds["step"] / (seconds["towers"] + seconds["loss"])
    seconds["rest"] = seconds["step"] - seconds["towers"] - seconds["loss"]
    return seconds


def _overhead(spec: dict) -> dict:
    """`step_parts` of the default config's step (the MLP towers on the digits' halves,
    random inputs, D = 64, CLIP streamed in `spec["chunk_size"]` tiles) at
    `spec["batch"]` on all devices (8 simulated CPU devices: the parent sets them)."""
    import jax
    import numpy as np

    from contrastive_jax import sharding
    from contrastive_jax.config_lib import load_config, override
    from contrastive_jax.data import input_pipeline
    from contrastive_jax.training import run_plan
    from contrastive_jax.training.run_plan import data_settings

    shapes = override(load_config("default"), {"train.global_batch_size": jax.device_count()})
    run_plan.write_builtin_records(shapes)  # the digits, once: build writes nothing
    element_spec = input_pipeline.train_dataset(data_settings(shapes)).element_spec
    fields = {"train.global_batch_size": spec["batch"], "loss.chunk_size": spec["chunk_size"]}
    run = run_plan.build(override(load_config("default"), fields), sharding.make_mesh()).trainer
    rng = np.random.default_rng(0)
    batch = {k: rng.standard_normal((spec["batch"], *element_spec[k].shape[1:]), np.float32) for k in ("a", "b")}
    batch = jax.device_put(batch, sharding.data_sharding(run.mesh))
    state = jax.block_until_ready(run.init_state(element_spec)[0]())
    return {"batch": spec["batch"], "devices": jax.device_count(), **step_parts(run, state, batch, spec["repeats"])}


WORKERS = {
    "jax_step": _jax_step,
    "torch_step": _torch_step,
    "jax_loss": _jax_loss,
    "torch_loss": _torch_loss,
    "input": _input,
    "overhead": _overhead,
}


def run_worker(spec: dict) -> dict:
    """Runs `spec["worker"]` on `spec` and returns its figures."""
    return WORKERS[spec["worker"]](spec)
