"""The benchmarks, one command each (`python -m experiments.bench.<benchmark>`), and the
workers (`*_worker.py`) they start in fresh processes to measure the package's internals."""
