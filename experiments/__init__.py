"""Research beside the package, in three folders: `lib/` what the studies share (the run
grid, intervals, steps to a target, the B_crit fit, ...), `studies/` the studies and
`bench/` the benchmarks. Each runs from the repository root as a module, e.g.
`python -m experiments.studies.batch_size_sweep`; they import the package's public door
(tests/test_layout.py)."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]  # the repository's root
RESULTS = REPO / "experiments" / "results"  # the committed results: <study or benchmark>/...
