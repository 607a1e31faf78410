"""Research beside the package, in three folders: `lib/` what the studies share (the run
grid, intervals, steps to a target, the B_crit fit, ...), `studies/` the studies and
`bench/` the benchmarks. Each runs from the repository root as a module, e.g.
`python -m experiments.studies.batch_size_sweep`; they import the package's public door
(tests/test_layout.py)."""

import os
import pathlib

# NumPy's linear algebra on one thread, set before NumPy loads: a driver's cores belong to
# XLA, and OpenBLAS's own threads beside a busy XLA (or a second study) spin: the
# evaluation's SVD of 256 x 64 embeddings took 0.45 s so, 1.5 ms on one thread.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]  # the repository's root
RESULTS = REPO / "experiments" / "results"  # the committed results: <study or benchmark>/...
