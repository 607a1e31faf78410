"""What a trainable loss is: `Loss` (its function and the inputs it reads), `LossState`
(what it keeps across steps) and `LossSettings` (its hyperparameters as plain values).
The table of losses is `losses.registry`.

Model outputs (see `two_tower.TwoTower`): `za`, `zb` [B, D] L2-normalised; `logits` [B, C]
(classifier head); `temperature`, `bias` scalars and `proxies` [C, D] (replicated);
`hard_negatives` [B, M, D], the b tower's embeddings of a batch's `negatives`. From
the data: `label` [B] int; `groups` [B, K] int (the dataset's id keys); `index` [B].
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax

Outputs = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]
CLASSIFIER_OUTPUTS = frozenset({"logits", "proxies"})
#: `config.loss.positives` of a loss whose only positive is each row's own pair.
OWN_PAIR = "own"


@dataclasses.dataclass(frozen=True)
class LossSettings:
    """The loss's hyperparameters as plain Python values: `run_plan.build` reads them
    from the config once (`trainer.loss_settings`), and the loss functions, traced inside the
    step, read these, never a ConfigDict. Each field is `config.loss.<name>`, but for
    `seed` and `embed_dim` (`config.seed`, `config.model.embed_dim`: a queue's or
    memory's first entries)."""

    chunk_size: int | str | None
    collective: str
    matmul_dtype: str | None
    kernel: str  # `losses.Streaming.kernel`: "xla", "pallas" or "pallas_interpret"
    margin: float
    triplet_mining: str
    label_smoothing: float
    focal_gamma: float
    dcl_weight_sigma: float | None
    dcl_weight_gradient: bool
    sogclr_gamma: float
    queue_size: int
    queue_momentum: float
    queue_stop_gradient: bool
    xbm_loss: str
    xbm_memory_size: int
    xbm_warmup_steps: int
    xbm_memory_weight: float | None
    group_size: int
    extra_negatives: int
    positives: str  # OWN_PAIR, or a form of several positives (`losses.positives.FORMS`)
    negatives_from: str  # a .npy file of [M, D] embeddings, each a negative of every row; "": none
    seed: int
    embed_dim: int
    # The terms added by weight (`losses.weighted_terms`): total = contrastive_weight x the
    # loss + distill_weight x distillation (in `distill_form`) + caption_weight x captioning.
    contrastive_weight: float = 1.0
    distill_weight: float = 0.0
    distill_form: str = "logits"
    caption_weight: float = 0.0


# (one device's model outputs and data fields, settings) -> (global loss, metrics).
LossFn = Callable[[Outputs, LossSettings], tuple[jax.Array, Metrics]]
# The same for a loss with state (`Outputs` also holds `state` and `step`): (global
# loss, metrics, new state).
StatefulLossFn = Callable[[Outputs, LossSettings], tuple[jax.Array, Metrics, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class LossState:
    """What a loss keeps across steps, in `TrainState.loss_state`.

    Attributes:
      init: `(settings, params, num_examples) -> {name: global array}`, the first
        state (`num_examples`: the rows of a per-example table, see `run_plan.build`).
      sharded: the names whose arrays are split over the batch axes by rows (the
        queue, the memory); the others are replicated.
      check: `(settings, global_batch_size, micro_batch_size) -> None`, raising
        ConfigError for settings the state cannot take (run by `run_plan.build`, before
        anything compiles).
      after_step: `(state, params, settings) -> state` after the optimizer step (the
        momentum encoder's update), or None.
      params_like: the names holding a copy of the parameters (the momentum
        encoder's), split over the mesh like them; `fn` never reads them.
    """

    init: Callable[[LossSettings, Any, int], dict[str, Any]]
    sharded: frozenset[str]
    check: Callable[[LossSettings, int, int], None]
    after_step: Callable[[dict[str, Any], Any, LossSettings], dict[str, Any]] | None = None
    params_like: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Loss:
    """A trainable loss.

    Attributes:
      fn: returns the scalar loss over the global batch (the same on every device) and
        scalar metrics; with `state`, also the new state (see the module docstring).
      inputs: the model outputs and data fields (`label`, `groups`, `index`) that `fn`
        reads.
      state: what the loss keeps across steps, or None.
      options: the fields of `losses.Candidates` it takes (`"positive_ids"`: `index` read
        as the pairs' ids with `config.loss.positives`; `"group_size"`; `"query_rows"`:
        `config.loss.extra_negatives`; `"extra_columns"`: a batch's `negatives`, a bank);
        the config door refuses the others when set.
    """

    fn: LossFn | StatefulLossFn
    inputs: frozenset[str]
    state: LossState | None = None
    options: frozenset[str] = frozenset()

    @property
    def pairs(self) -> bool:
        """Compares `za` with `zb`: needs two inputs per example."""
        return "zb" in self.inputs

    @property
    def labels(self) -> bool:
        """Needs a dataset with labels."""
        return "label" in self.inputs

    @property
    def groups(self) -> bool:
        """Needs a dataset with id keys (`groups`)."""
        return "groups" in self.inputs

    @property
    def indices(self) -> bool:
        """Reads each example's index in the training split (`index`)."""
        return "index" in self.inputs

    @property
    def classifier(self) -> bool:
        """Needs the classifier head (`config.model.num_classes > 0`)."""
        return bool(self.inputs & CLASSIFIER_OUTPUTS)

    @property
    def learned_bias(self) -> bool:
        """The model learns a logit bias (SigLIP's)."""
        return "bias" in self.inputs
