"""Zero-shot evaluation as the field reports it, on the embedded image-text data: a small
CLIP trained on the generated `shapes` set, then judged by `contrastive_jax.benchmark` on
its test split.

The run is `configs/clip_shapes.py` with CPU-sized towers (`TOWERS`: the small CNN for
the pictures, the byte-level 1-D CNN for the captions) for `STEPS` steps. Then:

* **zero-shot classification** of each picture's first shape's kind (the split's
  `label`, 5 classes, chance 0.2) from the class names alone, with one template and with
  a prompt ensemble (`TEMPLATES`, CLIP's mean of the prompts' embeddings);
* **retrieval with every caption** of each picture (4 each; COCO's protocol), both ways.

Run (from the repository root; a finished run is not trained again):
  .venv/bin/python -m experiments.studies.zero_shot_shapes             # results committed
  .venv/bin/python -m experiments.studies.zero_shot_shapes --quick     # CI: a few steps of 64

Writes `results.json` (the CLIP_benchmark reports, the run's own evaluation and its
time) and `summary.md` to `experiments/results/zero_shot_shapes/`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from contrastive_jax.config_lib import load_config, override
from contrastive_jax.simulated_devices import simulate_cpu_devices
from experiments.lib import sweep
from experiments.lib.tasks import SHAPES_CNN_TOWERS as TOWERS

STEPS = 1500
KINDS = ("circle", "square", "triangle", "cross", "diamond")  # data.builtin.shapes.KINDS, in label order
TEMPLATES = ("a {}.", "a picture with a {}.", "a small {}.", "a large {}.", "a {} on a plain background.")

QUICK_OVERRIDES = {"train.global_batch_size": 64}  # --quick: the convolutions' time is the batch's


def evaluate(workdir: str) -> dict:
    """The three benchmark reports of the run in `workdir`: zero-shot kinds with the first
    template and with all of them, and all-caption retrieval."""
    from contrastive_jax import benchmark

    reports = {}
    tasks = {
        "kinds, one template": ("zeroshot_classification", TEMPLATES[:1]),
        f"kinds, {len(TEMPLATES)} templates": ("zeroshot_classification", TEMPLATES),
        "retrieval, all captions": ("zeroshot_retrieval", ("{}",)),
    }
    for name, (task, templates) in tasks.items():
        reports[name] = benchmark.run(workdir, task, "test", list(KINDS), list(templates))
    return reports


def run(args) -> dict:
    """Trains (or finds) the run, evaluates it, writes the results."""
    config = override(load_config("clip_shapes"), TOWERS)
    fields = sweep.run_overrides(num_steps=args.steps, seed=0, warmup_steps=args.steps // 20, evals=2)
    config = override(config, {**fields, "data.data_dir": args.data_dir, **(QUICK_OVERRIDES if args.quick else {})})
    simulate_cpu_devices(config.num_simulated_devices)
    from contrastive_jax.training import run_plan

    workdir = args.out / "runs" / "clip_shapes_small"
    started = time.perf_counter()
    during_training = run_plan.train_and_evaluate(config, str(workdir))
    seconds = time.perf_counter() - started
    reports = evaluate(str(workdir))
    results = {
        "steps": args.steps,
        "overrides": {k: list(v) if isinstance(v, tuple) else v for k, v in TOWERS.items()},
        "train_and_evaluate_seconds": seconds,
        "run_evaluation": during_training,
        "reports": reports,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "summary.md").write_text(summary(results))
    print((args.out / "summary.md").read_text())
    return results


def summary(results: dict) -> str:
    """The markdown report: each task's metrics."""
    text = (
        f"# Zero-shot on the generated image-text set (`shapes` test split, 500 pictures)\n\n"
        f"`configs/clip_shapes.py` with small CNN towers, {results['steps']:,} steps "
        f"(training and the run's evaluations: {results['train_and_evaluate_seconds'] / 60:.1f} min).\n\n"
    )
    rows = [
        [name, *(f"{k}={v:.3f}" for k, v in sorted(report["metrics"].items()))]
        for name, report in results["reports"].items()
    ]
    width = max(len(r) for r in rows)
    rows = [r + [""] * (width - len(r)) for r in rows]
    return text + sweep.markdown_table(rows, ["task", *[""] * (width - 1)])


def main(argv: Sequence[str] | None = None) -> dict:
    parser = sweep.argument_parser(__doc__.splitlines()[0])
    args = sweep.resolve(parser.parse_args(argv), "zero_shot_shapes", {"steps": STEPS}, {"steps": 20})
    return run(args)


if __name__ == "__main__":
    main()
