"""Sweep drivers and benchmarks; run from the repository root, e.g. `python -m experiments.batch_size_sweep`."""
