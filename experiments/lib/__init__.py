"""What the studies share: the run grid (`sweep`), intervals, per-query hits, steps to a
target, the B_crit fit, gradient replicates, the learning-rate grid and the shapes towers."""
