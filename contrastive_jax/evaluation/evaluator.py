"""The evaluation a training run logs: `Evaluator` embeds the evaluation split (and, for
the probes, training examples) with the current state, on the run's mesh, and computes
the metrics that fit the data (`metrics`; `clip_benchmark.retrieval` over every caption).
`evaluation` sets it up for a run, from its `EvalSettings` (`config.eval`); the training
loop calls it every `config.eval.every_steps` and at the end.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from contrastive_jax import sharding
from contrastive_jax.data import input_pipeline
from contrastive_jax.data.settings import DataSettings, open_metadata
from contrastive_jax.evaluation import clip_benchmark, metrics, padded_chunks
from contrastive_jax.sharding import DATA_AXIS


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """What a run evaluates, as plain values: `run_plan.build` reads them from the config
    once (`run_plan.eval_settings`). Each field is `config.eval.<name>` (its comment in
    configs/default.py says what it does)."""

    split: str
    class_range: tuple[int, int] | None
    batch_size: int
    recall_ks: tuple[int, ...]
    knn_k: int
    linear_probe: bool


class Evaluator:
    """Embeds the evaluation (and, for probes, training) examples and computes metrics.

    Which metrics depends on the data: paired inputs (`b`) get cross-view R@K both ways
    (answers grouped by `match_keys`) and alignment; labelled eval data gets
    leave-one-out retrieval (R@K, MAP@R, R-precision); kNN and the linear probe run on
    `probe_arrays` when every eval class is also one of theirs (not on a class-disjoint
    split); uniformity and collapse diagnostics always.

    Args:
      mesh: the devices to embed on (data parallel).
      eval_arrays: the evaluation examples, `a` [n, ...], optional `b` [n, ...], `label`
        [n] and id keys [n] (`input_pipeline.eval_arrays`).
      batch_size: examples per forward pass (rounded up to a multiple of the devices).
      recall_ks: the K of R@K.
      match_keys: `(a -> b, b -> a)`: the id key whose equal values count as right
        answers (`records.Metadata.match_keys`), or None: only the pair itself.
      probe_arrays: labelled training examples for kNN and the linear probe, or None.
      knn_k: neighbours of the kNN classifier; 0: no kNN.
      linear_probe: fit a logistic-regression probe.
      captions: `(tokens [m, L], image [m])`, every caption of the eval images and the
        image each describes (`input_pipeline.eval_captions`), or None. With them,
        retrieval over all captions both ways (`all_captions/...`,
        `clip_benchmark.retrieval`).
    """

    def __init__(
        self,
        mesh: jax.sharding.Mesh,
        eval_arrays: dict[str, np.ndarray],
        *,
        batch_size: int,
        recall_ks: Sequence[int],
        match_keys: tuple[str | None, str | None] = (None, None),
        probe_arrays: dict[str, np.ndarray] | None = None,
        knn_k: int = 0,
        linear_probe: bool = False,
        captions: tuple[np.ndarray, np.ndarray] | None = None,
    ):
        self._mesh = mesh
        self._captions = captions
        self._eval = eval_arrays
        self._recall_ks = tuple(recall_ks)
        self._match_keys = match_keys
        self._knn_k, self._linear_probe = knn_k, linear_probe
        self._train = None
        if probe_arrays is not None and "label" in eval_arrays and (knn_k > 0 or linear_probe):
            if set(np.unique(eval_arrays["label"])) <= set(np.unique(probe_arrays["label"])):
                self._train = probe_arrays
        self._devices = sharding.batch_shards(mesh)
        self._batch_size = batch_size
        # The state stays where it is (replicated, or its parameters split over fsdp).
        variables = lambda state: {"params": state.params, "batch_stats": state.batch_stats}  # noqa: E731
        self._embed = jax.jit(lambda state, a, b: state.apply_fn(variables(state), a, b, train=False))
        self._embed_b = jax.jit(lambda state, b, _: {"zb": state.apply_fn(variables(state), b, "b", method="embed")})

    def embed(self, state, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`za` [n, D] (and `zb` [n, D] when `arrays` has `b`) for every example."""
        return self._batched(self._embed, state, arrays["a"], arrays.get("b"))

    def _batched(self, embed, state, a: np.ndarray, b: np.ndarray | None) -> dict[str, np.ndarray]:
        """`embed(state, a, b)` over batches of `a` (and `b`) [n, ...], the last padded: of
        `batch_size` rows, or of n when fewer (a small split is not padded to a large
        batch), rounded up to a multiple of the devices."""

        def embed_chunk(a_rows, b_rows):
            # Explicitly placed: a multi-process jit refuses NumPy inputs with shardings.
            out = embed(state, *jax.device_put([a_rows, b_rows], sharding.data_sharding(self._mesh)))
            return {k: v for k, v in out.items() if k in ("za", "zb")}

        width = -(-max(1, min(self._batch_size, len(a))) // self._devices) * self._devices
        return padded_chunks.map_padded_chunks(embed_chunk, (a, b), width)

    def __call__(self, state) -> dict[str, float]:
        """All metrics for the current state, as a flat `{name: value}` dict."""
        ks = self._recall_ks
        z = self.embed(state, self._eval)
        out = {}
        if "zb" in z:
            match_a, match_b = self._match_keys
            for name, query, gallery, match in (("a_to_b", "za", "zb", match_a), ("b_to_a", "zb", "za", match_b)):
                groups = self._eval[match] if match else None
                recall = metrics.cross_view_recall(z[query], z[gallery], ks, groups=groups)
                out |= {f"{name}/{k}": v for k, v in recall.items()}
            out["alignment"] = metrics.alignment(z["za"], z["zb"])
        if self._captions is not None:  # every caption of each image (COCO's protocol)
            tokens, owner = self._captions
            captions = self._batched(self._embed_b, state, tokens, None)["zb"]
            all_captions = clip_benchmark.retrieval(z["za"], captions, owner, ks)
            out |= {f"all_captions/{k}": v for k, v in all_captions.items()}
        if "label" in self._eval:
            labels = self._eval["label"]
            out |= {f"retrieval/{k}": v for k, v in metrics.retrieval_metrics(z["za"], labels, ks).items()}
            if self._train is not None:
                train_z = self.embed(state, self._train)["za"]
                train_labels = self._train["label"]
                if self._knn_k > 0:
                    out["knn_top1"] = metrics.knn_accuracy(train_z, train_labels, z["za"], labels, k=self._knn_k)
                if self._linear_probe:
                    out["linear_probe"] = metrics.linear_probe_accuracy(train_z, train_labels, z["za"], labels)
        out["uniformity"] = metrics.uniformity(z["za"])
        out |= {f"collapse/{k}": v for k, v in metrics.collapse_diagnostics(z["za"]).items()}
        return out


def evaluation(
    run_mesh: jax.sharding.Mesh,
    data: DataSettings,
    settings: EvalSettings,
    match_keys: tuple[str | None, str | None] | None,
) -> Callable[[Any], dict[str, float]]:
    """`state -> metrics`: a run's evaluation (`settings`' split and probes, on `data`;
    `match_keys` the record set's, `RunPlan.match_keys`), for a state on `run_mesh`.

    It runs whole in every process, on its own devices, from the state gathered whole
    (the loss's state, which may be split over the devices, is not evaluated).
    """
    if jax.process_count() == 1:
        mesh, local_state = run_mesh, lambda state: state.replace(loss_state=None)
    else:
        mesh = jax.sharding.Mesh(np.array(jax.local_devices()), (DATA_AXIS,))
        gather = jax.jit(lambda state: state.replace(loss_state=None), out_shardings=sharding.replicated(run_mesh))
        local_state = lambda state: jax.tree.map(  # noqa: E731
            lambda x: jax.device_put(x.addressable_data(0), sharding.replicated(mesh)), gather(state)
        )
    eval_arrays = input_pipeline.eval_arrays(data, settings.split, class_range=settings.class_range)
    probe_arrays = None
    if "label" in eval_arrays and (settings.knn_k > 0 or settings.linear_probe):
        probe_arrays = input_pipeline.eval_arrays(data, data.train_split, class_range=data.train_class_range)
    captions = None
    if data.task == "pairs" and open_metadata(data).has("captions") and settings.class_range is None:
        captions = input_pipeline.eval_captions(data, settings.split)
    evaluate = Evaluator(
        mesh,
        eval_arrays,
        batch_size=settings.batch_size,
        recall_ks=settings.recall_ks,
        match_keys=match_keys or (None, None),
        probe_arrays=probe_arrays,
        knn_k=settings.knn_k,
        linear_probe=settings.linear_probe,
        captions=captions,
    )
    return lambda state: evaluate(local_state(state))
