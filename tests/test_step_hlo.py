"""What the compiled train step does: its N x N work is the loss's own forward and
backward, and the ring gathers no array of the global batch's size.

Each test reads the optimized per-device HLO of the real jitted step,
`build(config, mesh).jit_train_step(abstract).lower(abstract, batch).compile()`, on 8
simulated devices. N = 96 (12 rows per device, tiles of 24 columns) is chosen so that
no model array has a dimension among the logits' (12, 24, 96): a matrix with both
dimensions among them is a block of logits or of their gradient.
"""

import re

import jax
import numpy as np
import pytest

from contrastive_jax import input_pipeline, sharding
from contrastive_jax.config_lib import override
from contrastive_jax.trainer import build

NUM_DEVICES = 8
N = 96
LOGIT_DIMS = {N // NUM_DEVICES, 24, N}
# One HLO instruction with an array result: `%name = f32[12,96]{1,0} op(%x, %y), ...`.
_INSTRUCTION = re.compile(r"%([\w.-]+) = \w+\[([\d,]*)\]\S* ([\w-]+)\(([^)]*)\)")

@pytest.fixture
def config(load_config, digits_data_dir):
    """The default config with small towers (no dimension among LOGIT_DIMS) at N = 96."""
    return override(load_config("default"), {
        "data.data_dir": digits_data_dir,
        "model.mlp_hidden_dims": (32,),
        "model.encoder_dim": 32,
        "model.embed_dim": 16,
        "train.global_batch_size": N,
    })


def compiled_step(config):
    """The jitted train step of `config` on 8 devices, compiled for abstract inputs."""
    run = build(config, sharding.make_mesh(NUM_DEVICES))
    spec = input_pipeline.train_dataset(config).element_spec
    _, abstract = run.init_state(spec)
    batch = {
        key: jax.ShapeDtypeStruct(
            (N, *spec[key].shape[1:]), spec[key].dtype.as_numpy_dtype,
            sharding=sharding.data_sharding(run.mesh),
        )
        for key in ("a", "b")
    }
    return run.jit_train_step(abstract).lower(abstract, batch).compile()


def compiled_loss_gradient(config):
    """The configured loss's value and gradient (wrt `za`, `zb` and the scalars) alone,
    on the embeddings of the global batch, compiled like the step."""
    run = build(config, sharding.make_mesh(NUM_DEVICES))
    dim = config.model.embed_dim
    batched = {
        key: jax.ShapeDtypeStruct((N, dim), np.float32, sharding=sharding.data_sharding(run.mesh))
        for key in ("za", "zb")
    }
    scalars = {"temperature"} | (run.loss.inputs & {"bias"})
    shared = {key: jax.ShapeDtypeStruct((), np.float32) for key in scalars}

    def loss(batched, shared):
        return run.global_loss(batched, shared, None)[0]

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(batched, shared).compile()


def instructions(compiled, opcode):
    """`(result dims, [operand dims])` of every `opcode` instruction in the compiled HLO
    (operands with array results; instruction names are unique in a module)."""
    parsed = _INSTRUCTION.findall(compiled.as_text())
    dims = {name: tuple(int(d) for d in shape.split(",") if d) for name, shape, _, _ in parsed}
    return [
        (dims[name], [dims[o] for o in re.findall(r"%([\w.-]+)", operands) if o in dims])
        for name, _, op, operands in parsed
        if op == opcode
    ]


def logit_dots(compiled):
    """How many dot instructions read or write a block of logits (N^2 work each)."""
    is_logits = lambda dims: len(dims) == 2 and set(dims) <= LOGIT_DIMS  # noqa: E731
    return sum(
        any(is_logits(dims) for dims in [result, *operands])
        for result, operands in instructions(compiled, "dot")
    )


@pytest.mark.parametrize("name", ["clip", "siglip"])
@pytest.mark.parametrize("chunk_size", [None, 24])
def test_step_does_the_losss_n2_work_only(config, name, chunk_size):
    """The step's logit matmuls are the loss's own forward and backward: the metrics
    come from its statistics, not from another pass."""
    config = override(config, {"loss.name": name, "loss.chunk_size": chunk_size})
    own = logit_dots(compiled_loss_gradient(config))
    assert own >= 2  # the logits and at least one gradient product
    assert logit_dots(compiled_step(config)) == own


@pytest.mark.parametrize("micro_batch_size", [48])
def test_grad_cached_step_pays_for_the_loss_once(config, micro_batch_size):
    """Gradient caching embeds twice but computes the streamed loss's forward and
    backward once."""
    config = override(config, {
        "loss.chunk_size": 24, "train.micro_batch_size": micro_batch_size,
    })
    assert logit_dots(compiled_step(config)) == logit_dots(compiled_loss_gradient(config))


def gathers_of_the_global_batch(compiled):
    """The all-gathers whose result has N rows."""
    return [result for result, _ in instructions(compiled, "all-gather")
            if result and result[0] == N]


def test_ring_step_gathers_no_global_batch_and_needs_less_memory(config):
    config = override(config, {"model.embed_dim": 256})  # the gathered [N, D] dominates
    ring = compiled_step(override(config, {"loss.collective": "ring"}))
    gathered = compiled_step(config)
    assert gathers_of_the_global_batch(gathered)  # the check sees the all-gather mode's
    assert gathers_of_the_global_batch(ring) == []
    ring_bytes = ring.memory_analysis().temp_size_in_bytes
    gathered_bytes = gathered.memory_analysis().temp_size_in_bytes
    assert ring_bytes < gathered_bytes

