"""What the ViT-B/16 train step keeps for its backward pass, compiled on the CPU, buffer by
buffer, before and after each fix and under each remat setting.

    python -m experiments.bench.bench_step_memory             # ViT-B/16 224 px, batch 8: 16 compilations, ~25 min
    python -m experiments.bench.bench_step_memory --batch 256  # compiled, not run: ~40 min on 2 cores
    python -m experiments.bench.bench_step_memory --tiny      # toy sizes (a test)

The step is ``bench_step``'s (open_clip's ViT-B-16 architecture from a checkpoint open_clip
writes, the project's released-layout towers, AdamW, the global-batch CLIP loss streamed;
XLA's attention, as on a CPU or TPU, or a GPU where cuDNN refuses), compiled for one CPU
device at a small global batch, at bfloat16 and float32 activations. Each variant is
compiled in a fresh process (``bench_step_memory_worker``) that dumps XLA's optimized HLO
and buffer live ranges and reports XLA's ``memory_analysis()``, the buffers live at the
step's peak grouped by what they are, and what autodiff keeps for the towers' backward.

The variants, one fix at a time (``VARIANTS``): the towers as they were (``before``: the
MLP's activation and the LayerNorms differentiated as written), the activation recomputed
from its input, the LayerNorms too (``none``, today's towers), the attention's
probabilities recomputed too (``attention``), then ``dots``, ``full`` and a per-block
setting. XLA's CPU scheduler by default runs recomputations early (for concurrency), which
hides what rematerialisation saves; the variants are compiled with its memory-minimising
scheduler (``--xla_cpu_enable_concurrency_optimized_scheduler=false``), and ``before`` once
more with the default one for reference. Writes ``results.json`` and ``results.md``
(machine, versions, load) after each variant to ``--out`` (default
``experiments/results/bench_step_memory/batch_<batch>/``; ``runs/bench_step_memory_tiny/``
with ``--tiny``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time

from experiments import REPO
from experiments import RESULTS as ALL_RESULTS
from experiments.bench import bench_losses, bench_step
from experiments.bench.bench_step_memory_worker import run_worker

RESULTS = ALL_RESULTS / "bench_step_memory"
DTYPES = ("bfloat16", "float32")
MEMORY_SCHEDULER = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
# (label, the worker's fields, XLA's CPU scheduler): one fix at a time, then the remat settings.
BEFORE = {"remat": "none", "keep": ["activation", "layer_norm"]}  # the towers as of commit f875b18
VARIANTS = (
    ("before, XLA's default scheduler", BEFORE, "default"),
    ("before", BEFORE, "memory"),
    ("none, activation recomputed", {"remat": "none", "keep": ["layer_norm"]}, "memory"),
    ("none", {"remat": "none"}, "memory"),
    ("attention", {"remat": "attention"}, "memory"),
    ("dots", {"remat": "dots"}, "memory"),
    ("full", {"remat": "full"}, "memory"),
    ("full:6,attention", {"remat": "full:6,attention"}, "memory"),
)
# What each fix is measured against: (fix, before it, after it).
FIXES = (
    ("the MLP's activation recomputed from its input (always)", "before", "none, activation recomputed"),
    ("the LayerNorms recomputed from their input (always)", "none, activation recomputed", "none"),
    ("the attention's probabilities recomputed (remat 'attention')", "none", "attention"),
)
# --tiny's variants: those the fixes are measured between (a test's run; the remat
# policies' losses and gradients are tested in tests/models).
TINY_VARIANTS = tuple(v for v in VARIANTS if any(v[0] in fix[1:] for fix in FIXES))
_MIB = 2**20


def spawn(spec: dict, scheduler: str, dump: pathlib.Path) -> dict:
    """`spec`'s variant compiled in a fresh process, XLA dumping into `dump`."""
    flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_train_step"
    if scheduler == "memory":
        flags += f" {MEMORY_SCHEDULER}"
    previous = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = f"{previous or ''} {flags}".strip()
    started = time.perf_counter()
    try:
        return bench_losses.spawn(spec, timeout_s=1800, module=__spec__.name)
    finally:
        if previous is None:
            del os.environ["XLA_FLAGS"]
        else:
            os.environ["XLA_FLAGS"] = previous
        print(f"[bench_step_memory] {spec['dtype']} {spec['label']}: {time.perf_counter() - started:.0f} s", flush=True)


def measure(shared: dict, batch: int, scratch: pathlib.Path, save, dtypes=DTYPES, variants=VARIANTS) -> list[dict]:
    """Each of `variants` at each of `dtypes`, `save(results)` after each."""
    results = []
    for dtype in dtypes:
        for index, (label, fields, scheduler) in enumerate(variants):
            dump = scratch / f"{dtype}_{index}"
            spec = dict(shared, **fields, batch=batch, dtype=dtype, label=label, dump=str(dump))
            results.append({"dtype": dtype, "label": label, "scheduler": scheduler, **spawn(spec, scheduler, dump)})
            save(results)
    return results


def _mib(size) -> str:
    return "-" if size is None else f"{size / _MIB:,.1f}"


def _signed(size) -> str:
    """`−100.0` or `+8.5` (MiB)."""
    return f"{'−' if size < 0 else '+'}{abs(size) / _MIB:,.1f}"


def _found(results: list[dict], dtype: str, label: str) -> dict:
    return next((r for r in results if r["dtype"] == dtype and r["label"] == label and "error" not in r), {})


def memory_lines(results: list[dict]) -> list[str]:
    """The compiled step's memory per variant and dtype (MiB)."""
    lines = [
        "| variant | compute dtype | temp | needed | at the peak | not donated | autodiff's residuals |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['dtype']} | {r['error'][:120]} | | | | |")
            continue
        m = r["memory"]
        lines.append(
            f"| {r['label']} | {r['dtype']} | {_mib(m['temp'])} | {_mib(m['needed'])} | {_mib(r['peak']['bytes'])} | "
            f"{_mib(m['argument'] - m['alias'])} | {_mib(r['residuals']['bytes'])} |"
        )
    return lines


def kind_lines(results: list[dict], dtype: str) -> list[str]:
    """The bytes live at the peak by kind (MiB), one column per variant at `dtype`."""
    runs = [r for r in results if r["dtype"] == dtype and "error" not in r]
    kinds = list(dict.fromkeys(k for r in runs for k in r["peak"]["by_kind"]))
    lines = [f"| at the peak, {dtype} | " + " | ".join(r["label"] for r in runs) + " |"]
    lines.append("|---|" + "---:|" * len(runs))
    for kind in kinds:
        lines.append(f"| {kind} | " + " | ".join(_mib(r["peak"]["by_kind"].get(kind, 0)) for r in runs) + " |")
    return lines


def largest_lines(run: dict) -> list[str]:
    """The largest groups of buffers live at `run`'s peak."""
    lines = [f"| {run['dtype']} {run['label']}: kind | dtype | shape | count | MiB |", "|---|---|---|---:|---:|"]
    for group in run["peak"]["largest"]:
        shape = "×".join(map(str, group["shape"]))
        lines.append(f"| {group['kind']} | {group['dtype']} | {shape} | {group['count']} | {_mib(group['bytes'])} |")
    return lines


def fix_lines(results: list[dict]) -> list[str]:
    """What each fix saved, per dtype: temp, the peak's bytes and autodiff's residuals."""
    lines = []
    for fix, before, after in FIXES:
        for dtype in DTYPES:
            a, b = _found(results, dtype, before), _found(results, dtype, after)
            if a and b:
                temp = a["memory"]["temp"] - b["memory"]["temp"]
                kept = a["residuals"]["bytes"] - b["residuals"]["bytes"]
                lines.append(
                    f"- {fix}, {dtype}: temp {_mib(a['memory']['temp'])} → {_mib(b['memory']['temp'])} MiB "
                    f"(**{_signed(-temp)} MiB**, {-temp / a['memory']['temp']:+.0%}); "
                    f"autodiff's residuals {_signed(-kept)} MiB"
                )
    return lines


def report(results: list[dict], header: dict) -> str:
    """`results.md`: the memory table, the fixes' savings, the peak by kind, the largest buffers."""
    env = header["environment"]
    lines = [
        f"# What the ViT-B/16 train step keeps, compiled on the CPU (global batch {header['batch']})",
        "",
        f"{env['machine']}, Python {env['python']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
        + f". Load average {env['load_average_start']:.1f} at the start, {header['load_average_end']:.1f} at the end. "
        f"One CPU device; XLA's attention; MiB. 'not donated': argument − alias bytes (the batch).",
        "",
        "What the CPU's figures leave out or add: its backend computes bfloat16 matmuls and element-wise ops "
        "in float32 (float32 copies of bfloat16 arrays a GPU would not hold), and even its memory-minimising "
        "scheduler runs a rematerialised block's recomputation early, so that the compiled temp falls less "
        "than what autodiff keeps (its residuals, traced without a compiler: the figure a GPU's or TPU's "
        "scheduler approaches).",
        "",
        *memory_lines(results),
        "",
        "## What each fix saved",
        "",
        *fix_lines(results),
    ]
    measured = list(dict.fromkeys(r["dtype"] for r in results))
    for dtype in measured:
        lines += ["", *kind_lines(results, dtype)]
    for dtype in measured:
        for label in ("before", "attention"):
            if run := _found(results, dtype, label):
                lines += ["", *largest_lines(run)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="What the ViT-B/16 train step keeps, compiled on the CPU.")
    parser.add_argument(
        "--tiny", action="store_true", help="toy sizes, bfloat16, the fixes' variants: the same code, as a test runs it"
    )
    parser.add_argument("--batch", type=int, default=8, help="the global batch; default 8")
    parser.add_argument("--out", type=pathlib.Path, help="the results' folder")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one variant, printed as JSON
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    sizes = dataclasses.replace(bench_step.TINY if args.tiny else bench_step.ACCELERATOR, images=args.batch)
    out = args.out or (REPO / "runs" / "bench_step_memory_tiny" if args.tiny else RESULTS / f"batch_{args.batch}")
    out.mkdir(parents=True, exist_ok=True)
    header = {"environment": bench_step.environment(), "batch": args.batch, "sizes": dataclasses.asdict(sizes)}

    def save(results: list[dict]) -> None:
        finished = dict(header, load_average_end=os.getloadavg()[0], variants=results)
        (out / "results.json").write_text(json.dumps(finished, indent=1) + "\n")
        (out / "results.md").write_text(report(results, finished))

    with tempfile.TemporaryDirectory() as scratch:
        shared = bench_step.prepare(sizes, pathlib.Path(scratch))
        dtypes, variants = (DTYPES[:1], TINY_VARIANTS) if args.tiny else (DTYPES, VARIANTS)
        save(measure(shared, args.batch, pathlib.Path(scratch), save, dtypes, variants))
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
