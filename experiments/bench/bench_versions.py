"""Two versions of the code, benchmarked in turns in one run: what a change costs.

    python -m experiments.bench.bench_versions --before REV --out DIR [--repeats 2]

Runs the CPU benchmarks a change of the step or the losses must not slow --
``bench_step --parts overhead`` (the default config's train step on 8 simulated devices)
and ``bench_losses --quick`` (the losses' forward and backward, dense and streamed) --
in a git worktree of ``REV`` ("before") and in this tree ("after"), alternately (before,
after, before, after, ...), so that a drift of the machine's load hits both alike. Each
run is the benchmark's own command in its own processes, writing its own results. Writes
``results.json`` (every run's figures, the load at each) and ``results.md``: for each
point, the after ÷ before ratio of the best time over the repeats, and their geometric mean.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile

from experiments import REPO

BENCHMARKS = {
    "step_overhead": ["-m", "experiments.bench.bench_step", "--parts", "overhead"],
    "losses_quick": ["-m", "experiments.bench.bench_losses", "--quick"],
}


def _run(tree: pathlib.Path, name: str, out: pathlib.Path) -> dict:
    """`BENCHMARKS[name]` in `tree` (its own code first on the path), written to `out`."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run([sys.executable, *BENCHMARKS[name], "--out", str(out)], cwd=tree, env=env, check=True)
    return json.loads((out / "results.json").read_text())


def _times(name: str, results: dict) -> dict[str, float]:
    """The seconds of each point of a benchmark's results."""
    if name == "step_overhead":
        parts = results["overhead_cpu"]
        return {f"train step, {k}": parts[k] for k in ("step", "towers", "loss", "optimizer")}
    return {
        f"{p['loss']} N={p['n']} D={p['d']} chunk={p['chunk']}{' bf16' if p.get('matmul_dtype') else ''}": p["seconds"]
        for p in results["points"]
        if p.get("worker") == "jax" and "seconds" in p
    }


def report(runs: list[dict], before: str) -> str:
    """`results.md`: after ÷ before of each point's best time, and the geometric means."""
    lines = [
        f"# This tree against {before}, in turns",
        "",
        "Load averages at each run's start: "
        + ", ".join(f"{r['version']} {r['load']:.1f}" for r in runs)
        + ". Each figure is the best of the repeats.",
    ]
    for name in BENCHMARKS:
        best = {}
        for r in (r for r in runs if r["benchmark"] == name):
            for point, seconds in r["times"].items():
                key = (r["version"], point)
                best[key] = min(best.get(key, math.inf), seconds)
        points = sorted({p for _, p in best})
        both = [p for p in points if ("after", p) in best and ("before", p) in best]
        ratios = [best["after", p] / best["before", p] for p in both]
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else math.nan
        lines += ["", f"## {name}: after ÷ before, geometric mean **{mean:.3f}**", ""]
        lines += ["| point | before (s) | after (s) | after ÷ before |", "|---|---:|---:|---:|"]
        for p in points:
            b, a = best.get(("before", p)), best.get(("after", p))
            if a and b:
                lines.append(f"| {p} | {b:.4f} | {a:.4f} | {a / b:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare this tree with")
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the results' folder")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each version (default 2)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        base = pathlib.Path(scratch) / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.before], cwd=REPO, check=True)
        try:
            turns = [(r, name, v) for r in range(args.repeats) for name in BENCHMARKS for v in ("before", "after")]
            for repeat, name, version in turns:
                load = os.getloadavg()[0]
                tree = base if version == "before" else REPO
                results = _run(tree, name, pathlib.Path(scratch) / f"{name}_{version}_{repeat}")
                runs.append({"benchmark": name, "version": version, "load": load, "times": _times(name, results)})
                (args.out / "results.json").write_text(json.dumps({"before": args.before, "runs": runs}, indent=1))
                (args.out / "results.md").write_text(report(runs, args.before))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=True)
    print(report(runs, args.before))


if __name__ == "__main__":
    main()
