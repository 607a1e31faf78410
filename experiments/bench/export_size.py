"""Measures the size of an exported tower against its parameters' bytes: open_clip's
ViT-B/32 layout (random weights: the size does not depend on them), its image tower
exported by `TrainedModel.export` (one tower's variables) and, for comparison, as
`export` did it before issue 44: the jitted tower called with the variables of both
towers, which the export then holds whole (an inner jit's unused arguments are not
dropped; the same tower with both towers' variables closed over directly exports at the
tower's size).

Run (from the repository root; about 30 s and 3 GiB on a CPU):
  .venv/bin/python -m experiments.bench.export_size

Writes `summary.json` to `experiments/results/export_size/`.
"""

import json

import jax
import numpy as np
from jax import export as jax_export

from contrastive_jax import trained
from contrastive_jax.models.released import open_clip_layout
from contrastive_jax.models.transformer import TowerSettings
from experiments import RESULTS

OUT = RESULTS / "export_size"
MIB = 2**20
VIT_B_32 = open_clip_layout.Settings(
    image_size=224,
    patch_size=32,
    image=TowerSettings(768, 12, 12, 3072),
    context_length=77,
    vocab_size=49408,
    text=TowerSettings(512, 12, 8, 2048),
    embed_dim=512,
)


def _mib(tree) -> float:
    return round(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)) / MIB, 1)


def main() -> dict:
    """`{parameters' MiB (all, tower a, tower b), the exported image tower's MiB (now, before)}`."""
    model = open_clip_layout.Model(VIT_B_32)
    images, texts = np.zeros((1, 224, 224, 3), np.float32), np.zeros((1, 77), np.int32)
    params = jax.device_get(jax.jit(lambda: model.init(jax.random.key(0), images, texts))())["params"]
    inputs = {"a": ((224, 224, 3), np.dtype(np.uint8)), "b": ((77,), np.dtype(np.int32))}
    tokenizer = {"spec": "bytes", "text_max_length": 77, "files": {}}
    run = trained.TrainedModel(model, {"params": params, "batch_stats": {}}, inputs, tokenizer, 0, 512, {})
    (batch,) = jax_export.symbolic_shape("batch")
    tower = jax.jit(lambda variables, x: model.apply(variables, x, "a", method="embed"))  # as TrainedModel's
    both = jax_export.export(jax.jit(lambda x: tower(run.variables, x)))(
        jax.ShapeDtypeStruct((batch, 224, 224, 3), np.float32)
    )
    result = {
        "parameters_mib": {
            "all": _mib(params),
            "tower_a": _mib(run.tower_variables("a")),
            "tower_b": _mib(run.tower_variables("b")),
        },
        "exported_tower_a_mib": round(len(run.export("a").serialize()) / MIB, 1),
        "exported_tower_a_with_both_towers_variables_mib": round(len(both.serialize()) / MIB, 1),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "summary.json", "w") as f:
        json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
