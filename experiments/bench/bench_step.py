"""A real-size CLIP train step on one accelerator, side by side with what users would run
instead: open_clip's own step, siglip-kernel's and Inf-CL's fused losses.

    python -m experiments.bench.bench_step                  # on a GPU: step, loss, input, remat; at most 8.5 min
    python -m experiments.bench.bench_step --parts remat    # on a GPU: the steps with remat alone
    python -m experiments.bench.bench_step --parts overhead  # on a CPU: the default step on 8 simulated devices
    python -m experiments.bench.bench_step --tiny           # every part at toy sizes on a CPU (a test)

On the accelerator, each beside its anchor in the same run (every measurement in a fresh
process, ``bench_step_worker``):

* **step** -- open_clip's ViT-B-16 architecture (224 px; a 12-layer, 512-wide text tower
  over 77 tokens), built by the project's released-layout towers from a checkpoint
  written here by open_clip itself (the same random weights on both sides), trained by
  the project's step (``run_plan.build`` of ``configs/finetune_clip.py``: AdamW,
  bfloat16, the global-batch CLIP loss streamed), beside open_clip 3.3.0's model and a
  minimal training step (AMP bfloat16, SDPA attention, ``ClipLoss``, AdamW), with and
  without rematerialisation (``config.model.remat="full"`` /
  ``set_grad_checkpointing``; the latter is the part **remat**), at a common batch and at the largest batch that fits
  (extrapolated from two batches' memory, then run): images/s, model FLOPs utilisation
  against the bfloat16 matmul peak measured in the same run, peak device memory;
* **loss** -- at N = 65,536, D = 768, bfloat16 inputs, forward + backward: our SigLIP
  beside ``siglip-kernel``'s ``fused_siglip_loss``, our CLIP beside Inf-CL's
  ``cal_inf_loss`` (both directions): time, memory, value;
* **input** -- the record pipeline's images/s at 224 px with a worker per core, beside
  the step's images/s;
* **overhead** -- the step ÷ (its towers' forward and backward + its loss's), with the
  optimizer's update apart: for the ViT step on the accelerator and for the default
  config's step on 8 simulated CPU devices at N = 16,384, D = 64.

The measurements run the most wanted first (the step without remat, ours then open_clip's;
the losses; the input; the step with remat) and none starts after ``--minutes`` (8.5):
the rest say they were skipped. Writes ``results.json`` and ``results.md`` (device,
versions, load) after each measurement to ``--out``
(default ``experiments/results/bench_step/``; ``runs/bench_step_tiny/`` with
``--tiny``). The packages a GPU machine may lack travel as wheels (docs/performance.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import pathlib
import platform
import sys
import tempfile
import time

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS
from experiments.bench import bench_losses
from experiments.bench.bench_step_worker import open_clip_model, run_worker

RESULTS = ALL_RESULTS / "bench_step"
PARTS = ("step", "loss", "input", "remat", "overhead")
PACKAGES = ("jax", "jaxlib", "flax", "optax", "torch", "open_clip_torch", "siglip-kernel", "inf-cl", "grain")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What a run measures at: the open_clip `model` (a name, or `CLIP(**model)`'s
    arguments), the common per-device `batch`, the loss's `loss_n` x `loss_d`, the record
    set's `images` and the pipeline's timed `input_batches`, the CPU step's `cpu_batch`
    (8 simulated devices) and its tiles, `repeats` per timing, the peak's matmul edge."""

    model: str | dict
    image_size: int
    context_length: int
    embed_dim: int
    batch: int
    loss_n: int
    loss_d: int
    images: int
    input_batches: int
    cpu_batch: int
    cpu_chunk: int
    repeats: int
    matmul: int


ACCELERATOR = Sizes("ViT-B-16", 224, 77, 512, 256, 65_536, 768, 512, 40, 16_384, 512, 10, 8192)
TINY_MODEL = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "patch_size": 16, "width": 64, "layers": 2, "head_width": 64},
    "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 2},
}
TINY = Sizes(TINY_MODEL, 32, 16, 32, 40, 256, 32, 64, 2, 256, 32, 2, 256)  # its largest batch passes its 64 images


def prepare(sizes: Sizes, folder: pathlib.Path) -> dict:
    """What the workers share, written into `folder`: the open_clip model's random weights
    as a `.safetensors` checkpoint (seed 0), CLIP's BPE vocabulary (open_clip's own file)
    and a record set of generated JPEGs with captions (`bench_input`'s)."""
    import torch
    from safetensors.torch import save_file

    from experiments.bench import bench_input

    torch.manual_seed(0)
    model = open_clip_model({"model": sizes.model})
    checkpoint = folder / "open_clip_model.safetensors"
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(checkpoint))
    tokenizer = pathlib.Path(importlib.util.find_spec("open_clip").origin).parent / "bpe_simple_vocab_16e6.txt.gz"
    records, writer_rate = bench_input.write_record_set(bench_input.source_jpegs(sizes.images), folder / "records")
    return {
        "model": sizes.model,
        "checkpoint": str(checkpoint),
        "tokenizer": str(tokenizer),
        "records": records,
        "images": sizes.images,
        "image_size": sizes.image_size,
        "context_length": sizes.context_length,
        "embed_dim": sizes.embed_dim,
        "repeats": sizes.repeats,
        "writer_images_per_second": writer_rate,
    }


def spawn(spec: dict, *, devices: int = 1, timeout_s: float) -> dict:
    """`spec`'s worker in a fresh process (`bench_losses.spawn` with this module)."""
    started = time.perf_counter()
    result = bench_losses.spawn(spec, devices=devices, timeout_s=timeout_s, module=__spec__.name)
    print(f"[bench_step] {spec['worker']} {spec.get('remat', '')} {time.perf_counter() - started:.0f} s", flush=True)
    return result


def plan(sizes: Sizes, parts: tuple[str, ...], shared: dict) -> list[tuple[str, dict, int]]:
    """The measurements of `parts`, the most wanted first (so that a run cut short by
    its budget has them): `(where the result goes, the worker's spec, devices)`."""
    steps = [dict(shared, batch=sizes.batch, remat=remat) for remat in ("none", "full")]
    loss = {"n": sizes.loss_n, "d": sizes.loss_d, "repeats": sizes.repeats}
    wanted = []
    if "step" in parts:
        wanted += [
            ("step", dict(steps[0], worker="jax_step", parts=True), 1),
            ("step", dict(steps[0], worker="torch_step"), 1),
        ]
    if "loss" in parts:
        wanted += [("loss.ours", dict(loss, worker="jax_loss"), 1), ("loss.theirs", dict(loss, worker="torch_loss"), 1)]
    if "input" in parts:
        spec = {"worker": "input", "records": shared["records"], "image_size": sizes.image_size}
        wanted.append(("input", dict(spec, batches=sizes.input_batches), 1))
    if "remat" in parts:
        wanted += [("step", dict(steps[1], worker="jax_step"), 1), ("step", dict(steps[1], worker="torch_step"), 1)]
    if "overhead" in parts:
        spec = {"worker": "overhead", "batch": sizes.cpu_batch, "chunk_size": sizes.cpu_chunk, "repeats": sizes.repeats}
        wanted.append(("overhead_cpu", spec, 8))
    return wanted


def measure(sizes: Sizes, parts: tuple[str, ...], folder: pathlib.Path, *, budget_s: float, save) -> dict:
    """Every measurement of `parts` at `sizes` (`plan`), each in its own process; one that
    fails is its error and the rest go on; once `budget_s` is spent the rest are skipped,
    each saying so. `save(results)` runs after each, so a run killed midway keeps what
    it measured."""
    started = time.perf_counter()
    results: dict = {"peak": bench_losses.spawn({"worker": "peak", "n": sizes.matmul, "dtype": "bfloat16"})}
    results["peak"]["n"] = sizes.matmul
    shared = prepare(sizes, folder) if {"step", "input", "remat"} & set(parts) else {}
    for where, spec, devices in plan(sizes, parts, shared):
        spent = time.perf_counter() - started
        if spent > budget_s:
            result = {"error": f"skipped: the run's budget of {budget_s:.0f} s was spent ({spent:.0f} s)"}
        else:
            result = spawn(spec, devices=devices, timeout_s=max(60.0, budget_s - spent + 60.0))
        if where == "step":
            results.setdefault("step", []).append(result)
        elif where.startswith("loss."):
            results.setdefault("loss", {})[where.removeprefix("loss.")] = result
        else:
            results[where] = result
        save(results)
    return results


def environment() -> dict:
    """The machine, the packages' versions and the load at the start."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cores",
        "python": platform.python_version(),
        "versions": versions,
        "load_average_start": os.getloadavg()[0],
    }


def _gib(num_bytes) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**30:.2f} GiB"


def _ratio(a, b) -> str:
    return "-" if not a or not b else f"{a / b:.2f}"


def step_rows(results: dict) -> tuple[list[str], dict]:
    """The step table's rows and, per remat, ours and open_clip's images/s at the common batch."""
    peak = results["peak"].get("gflops", 0.0) * 1e9
    flops = next((r.get("model_flops_per_example") for r in results["step"] if "model_flops_per_example" in r), None)
    rows, common = [], {}
    for run in results["step"]:
        if "error" in run:
            rows.append(f"| {run['error'][:120]} | | | | | | |")
            continue
        who = "contrastive_jax" if run["framework"] == "jax" else "open_clip"
        for point in run["points"]:
            loss_flops = 6.0 * point["batch"] * results["sizes"]["embed_dim"]  # the logits' matmuls, both passes
            mfu = f"{(flops + loss_flops) * point['images_per_second'] / peak:.0%}" if flops and peak else "-"
            rows.append(
                f"| {who} | {run['remat']} | {point['batch']:,}{' (largest)' if point['largest'] else ''} | "
                f"{point['images_per_second']:,.0f} | {mfu} | {_gib(point['peak_bytes'])} | {point['first_loss']:.4f} |"
            )
            if not point["largest"]:
                common.setdefault(run["remat"], {})[who] = point["images_per_second"]
        if "attention_fallback" in run:
            rows.append(f"| {who} | {run['remat']} | {run['attention_fallback'][:120]} | | | | |")
        if "largest_error" in run:
            rows.append(f"| {who} | {run['remat']} | largest failed: {run['largest_error'][:120]} | | | | |")
    return rows, common


def _step_lines(results: dict) -> list[str]:
    """The train step's table, and ours ÷ open_clip's images/s at the common batch."""
    rows, common = step_rows(results)
    lines = [
        "",
        "## The train step",
        "",
        "| step | remat | batch | images/s | MFU | peak memory | first step's loss |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    for remat, pair in common.items():
        ratio = _ratio(pair.get("contrastive_jax"), pair.get("open_clip"))
        lines.append(f"- remat {remat}: ours ÷ open_clip images/s at the common batch **{ratio}**")
    return lines


def _loss_lines(results: dict) -> list[str]:
    """The loss alone: ours beside siglip-kernel's and Inf-CL's, time, memory and value."""
    ours = results["loss"].get("ours", {"error": "not measured"})
    theirs = results["loss"].get("theirs", {"error": "not measured"})
    lines = ["", "## The loss alone (forward + backward, bfloat16 inputs)", ""]
    if "error" in ours or "error" in theirs or "note" in theirs:
        lines.append(f"- ours: {ours.get('error', 'measured')}; theirs: {theirs.get('error') or theirs.get('note')}")
    lines += [
        "| loss | ours (s) | theirs (s) | time ratio | ours memory | theirs memory | values |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    pairs = [
        (mine + kernel, other)
        for kernel in ("", "_pallas")
        for mine, other in (("siglip", "siglip_kernel"), ("clip", "inf_cl"))
    ]
    for mine, other in pairs:
        a, b = ours.get(mine, {}), theirs.get(other, {})
        if "error" in a:
            lines.append(f"| {mine} vs {other} | {a['error'][:120]} | | | | | |")
            continue
        lines.append(
            f"| {mine} vs {other} | {a.get('seconds', 0):.4f} | {b.get('seconds', 0):.4f} | "
            f"{_ratio(a.get('seconds'), b.get('seconds'))} | {_gib(a.get('peak_bytes') or a.get('temp_bytes'))} | "
            f"{_gib(b.get('peak_bytes'))} | {a.get('value', math.nan):.5f} / {b.get('value', math.nan):.5f} |"
        )
    return lines


def _overhead_lines(results: dict) -> list[str]:
    """The step ÷ (its towers + its loss), on the accelerator and on 8 CPU devices."""
    overheads = [
        ("accelerator, the ViT step", next((r.get("parts") for r in results.get("step", []) if r.get("parts")), None))
    ]
    overheads.append(("CPU, 8 simulated devices, the default step", results.get("overhead_cpu")))
    lines = [
        "",
        "## The step's own overhead",
        "",
        "| where | step | towers | loss | optimizer | step ÷ (towers + loss) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for where, parts in overheads:
        if parts and "step" in parts:
            lines.append(
                f"| {where} | {parts['step']:.4f} s | {parts['towers']:.4f} s | {parts['loss']:.4f} s | "
                f"{parts['optimizer']:.4f} s | **{parts['step_over_towers_and_loss']:.2f}** |"
            )
    return lines


def report(results: dict) -> str:
    """`results.md`: each part's table, with the ratios the issue asks for."""
    env, peak = results["environment"], results["peak"]
    lines = [
        f"# A CLIP train step on {peak.get('device_kind', '?')} ({peak.get('platform', '?')})",
        "",
        f"{env['machine']}, Python {env['python']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f". Load average {env['load_average_start']:.1f} at the start, {results['load_average_end']:.1f} at the end. "
        f"bfloat16 matmul peak {peak.get('gflops', 0) / 1e3:,.1f} TFLOP/s ({peak.get('n')}^3, this run).",
    ]
    if "step" in results:
        lines += _step_lines(results)
    if "loss" in results:
        lines += _loss_lines(results)
    if "input" in results and "step" in results:
        rate = results["input"].get("images_per_second")
        best = max((p.get("contrastive_jax", 0) for p in step_rows(results)[1].values()), default=0)
        ratio = _ratio(rate, best)
        lines += ["", f"## Input: the record pipeline {rate or 0:,.0f} images/s ÷ the step's {best:,.0f} = **{ratio}**"]
    return "\n".join(lines + _overhead_lines(results)) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Measures a real-size CLIP train step beside open_clip's and fused losses."
    )
    parser.add_argument("--tiny", action="store_true", help="toy sizes on a CPU: the same code, as a test runs it")
    parser.add_argument(
        "--parts",
        help=f"comma-separated, from {', '.join(PARTS)}; default: step,loss,input,remat "
        "(--tiny: all; overhead is the default step on 8 simulated CPU devices)",
    )
    parser.add_argument("--minutes", type=float, default=8.5, help="no measurement starts after this; default 8.5")
    parser.add_argument("--out", type=pathlib.Path, help="the results' folder")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one measurement, printed as JSON
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    default = PARTS if args.tiny else tuple(p for p in PARTS if p != "overhead")
    parts = tuple(p for p in args.parts.split(",") if p) if args.parts else default
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"--parts: {sorted(unknown)} unknown; use some of {', '.join(PARTS)}")
    sizes = TINY if args.tiny else ACCELERATOR
    out = args.out or (REPO / "runs" / "bench_step_tiny" if args.tiny else RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(), "sizes": dataclasses.asdict(sizes), "parts": parts}

    def save(measured: dict) -> None:
        finished = dict(results, **measured, load_average_end=os.getloadavg()[0])
        (out / "results.json").write_text(json.dumps(finished, indent=1) + "\n")
        (out / "results.md").write_text(report(finished))

    with tempfile.TemporaryDirectory() as scratch:
        measured = measure(sizes, parts, pathlib.Path(scratch), budget_s=60 * args.minutes, save=save)
    save(measured)
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
