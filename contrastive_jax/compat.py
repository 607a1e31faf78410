"""The JAX APIs that moved within the supported range, each behind one function.

contrastive_jax supports jax 0.7.2 (what Colab's runtimes ship; `constraints/minimum.txt`)
up to the newest release; CI tests both ends. Everything that differs between them is
here, and nowhere else checks a version:

- shard_map's varying-axis typing: jax < 0.10 keeps it in ``aval.vma``, jax ≥ 0.10 in
  ``aval.manual_axis_type.varying``.
- The varying-axis typing of a ``jax.ShapeDtypeStruct`` (a Pallas call's output):
  ``vma=`` before jax 0.10, ``manual_axis_type=`` after.
- Marking a value as varying over an axis: ``jax.lax.pvary`` (jax 0.7.2 has only it),
  later ``jax.lax.pcast(x, axis, to="varying")``.
- The coordination service's client, which has no public accessor (orbax reads the same
  private attribute).
"""

import jax


def varying_axes(x: jax.Array) -> frozenset:
    """Mesh axes over which ``x`` is typed as varying inside ``jax.shard_map``.

    Empty outside shard_map, under ``pmap`` and with ``check_vma=False``.
    """
    aval = jax.typeof(x)
    if hasattr(aval, "vma"):  # jax < 0.10
        return frozenset(aval.vma)
    return frozenset(aval.manual_axis_type.varying)


def typed_like(shape, dtype, like: jax.Array) -> jax.ShapeDtypeStruct:
    """A ``jax.ShapeDtypeStruct`` varying over the mesh axes ``like`` varies over."""
    aval = jax.typeof(like)
    if hasattr(aval, "vma"):  # jax < 0.10
        return jax.ShapeDtypeStruct(shape, dtype, vma=aval.vma)
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=aval.manual_axis_type)


def cast_varying(x: jax.Array, axis_name) -> jax.Array:
    """``x``, typed as varying over ``axis_name`` (a name or a tuple; its value unchanged).

    A replicated value used in a per-device computation gets per-device gradient shares;
    typed as varying, its transpose sums those shares over the devices. Axes ``x``
    already varies over are left as they are.
    """
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    missing = tuple(name for name in names if name not in varying_axes(x))
    if not missing:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)


def distributed_client():
    """The multi-process coordination service's key-value client (None before
    ``jax.distributed.initialize``)."""
    from jax._src import distributed

    return distributed.global_state.client
