"""The batch-size sweeps' runs: one per (N, seed) for the digits (`make_runs`), and the
cmudict study's series (`study_runs`): its learning-rate rules, optimizers, warmup, and
where the loss streams or the step caches gradients, by N.

The study's grid is described in `batch_size_sweep.py`'s docstring; its constants are here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from experiments.lib import sweep

REFERENCE_BATCH = 256  # the learning-rate rules scale from N = 256
BASE_LEARNING_RATE = 1e-3  # AdamW's peak learning rate at N = 256
# learning rate at N = BASE_LEARNING_RATE * LR_SCALING[rule](N)
LR_SCALING = {
    "none": lambda n: 1.0,
    "linear": lambda n: n / REFERENCE_BATCH,
    "sqrt": lambda n: math.sqrt(n / REFERENCE_BATCH),
}
FIXED_STEPS_SCALING = "sqrt"  # the rule of the fixed-step runs
LAMB_FROM = 16384  # "linear" at N >= this trains with LAMB instead of AdamW
WARMUP_EPOCHS = 0.25  # linear warmup length in epochs, at every N
STREAM_ABOVE = 4096  # N above this: the loss streamed in tiles (chunk_size "auto")
# N above this: gradient caching in micro-batches of MICRO_BATCH. A whole step at
# N = 65,536 holds 10.5 GB here (36 s), so no N of the study needs it.
GRAD_CACHE_ABOVE = 65536
MICRO_BATCH = 8192
MASKED_UP_TO = 16384  # the false-negative-masking series stops here (time: see ALL_SERIES_UP_TO)
# A step at N = 65,536 takes 36 s on the 2-core machine (the N^2 loss; 214 s a 4-step run),
# so above ALL_SERIES_UP_TO only these (budget, rule) series run, to stay within 90 min.
ALL_SERIES_UP_TO = 16384
LARGEST_N_SERIES = (("epochs", "sqrt"),)


def make_runs(
    base,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    *,
    steps: int | None = None,
    epochs: float | None = None,
    train_size: int | None = None,
) -> list[sweep.Run]:
    """One run per (batch size, seed): `steps` steps, or `ceil(epochs * train_size / N)`."""
    runs = []
    for n in batch_sizes:
        num_steps = steps if epochs is None else math.ceil(epochs * train_size / n)
        for seed in seeds:
            runs.append(
                sweep.Run(
                    name=f"batch{n:05d}_seed{seed}",
                    tags={"batch_size": n, "seed": seed, "steps": num_steps},
                    overrides={
                        **sweep.run_overrides(num_steps=num_steps, seed=seed, warmup_steps=base.optim.warmup_steps),
                        "train.global_batch_size": n,
                    },
                )
            )
    return runs


def study_runs(
    base,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    *,
    epochs: float,
    steps: int,
    train_size: int,
    scalings: Sequence[str] = tuple(LR_SCALING),
    masked_loss: str | None = None,
) -> list[sweep.Run]:
    """The cmudict study's runs (see `batch_size_sweep.py`'s docstring), fixed epochs first.

    Args:
      masked_loss: a loss name in the trainer's registry that masks in-batch false
        negatives out of the softmax (`batch_size_sweep.MASKED_LOSS`), or None: adds the
        series "fixed epochs, sqrt, false negatives masked" at N <= `MASKED_UP_TO`.

    Each run's tags: `series` (`"fixed epochs, sqrt"`, ...), `budget`, `scaling`,
    `optimizer`, `loss`, `batch_size`, `seed`, `steps`, `epochs` (examples seen /
    train_size) and `learning_rate`.
    """
    grid = [("epochs", rule, None) for rule in scalings] + [("steps", FIXED_STEPS_SCALING, None)]
    if masked_loss:
        grid.append(("epochs", FIXED_STEPS_SCALING, masked_loss))
    runs = []
    for budget, rule, loss in grid:
        for n in batch_sizes:
            if (loss and n > MASKED_UP_TO) or (n > ALL_SERIES_UP_TO and (budget, rule) not in LARGEST_N_SERIES):
                continue
            steps_per_epoch = train_size / n
            num_steps = math.ceil(epochs * steps_per_epoch) if budget == "epochs" else steps
            optimizer = "lamb" if rule == "linear" and n >= LAMB_FROM else base.optim.name
            learning_rate = BASE_LEARNING_RATE * LR_SCALING[rule](n)
            series = f"fixed {budget}, {rule}" + (" (LAMB)" if optimizer == "lamb" else "")
            series += ", false negatives masked" if loss else ""
            overrides = {
                **sweep.run_overrides(
                    num_steps=num_steps, seed=0, warmup_steps=max(1, round(WARMUP_EPOCHS * steps_per_epoch))
                ),
                "train.global_batch_size": n,
                "optim.learning_rate": learning_rate,
                "optim.name": optimizer,
                "loss.name": loss or base.loss.name,
            }
            if n > STREAM_ABOVE:
                overrides["loss.chunk_size"] = "auto"
            if n > GRAD_CACHE_ABOVE:
                overrides["train.micro_batch_size"] = MICRO_BATCH
            for seed in seeds:
                runs.append(
                    sweep.Run(
                        name=f"{budget}_{rule}_{optimizer}_{loss or base.loss.name}_batch{n:05d}_seed{seed}",
                        tags={
                            "series": series,
                            "budget": budget,
                            "scaling": rule,
                            "optimizer": optimizer,
                            "loss": loss or base.loss.name,
                            "batch_size": n,
                            "seed": seed,
                            "steps": num_steps,
                            "epochs": round(num_steps * n / train_size, 3),
                            "learning_rate": learning_rate,
                        },
                        overrides={**overrides, "seed": seed, "data.seed": seed},
                    )
                )
    return runs
