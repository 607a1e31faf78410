"""What a compiled XLA program holds at its peak, buffer by buffer, read from XLA's own
dumps (``--xla_dump_to`` with ``--xla_dump_hlo_as_text``): the live-range file names the
values live at the peak and their bytes, the optimized HLO says what made each one (its
shape, dtype and the ``op_name`` JAX gave it). `peak_buffers` joins the two; `kind_of`
sorts a value into what it is for the backward pass (parameters, optimizer state,
gradients, activations per block, the attention's probabilities, the loss's copies).

Used by ``bench_step_memory_worker``; imports neither JAX nor XLA.
"""

from __future__ import annotations

import collections
import math
import pathlib
import re

ARGUMENT = "(argument)"  # how `instructions` begins the op_name of the program's arguments
# `%name = dtype[dims]{layout} op(...)` (an instruction), `%name (...) -> ... {` (a computation)
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) ")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_PEAK = re.compile(r"^\s*Live ranges at \d+ \(peak\):")
_LIVE = re.compile(r"^\s+(\S+)\{[^}]*\}: (\d+) bytes")
_BLOCK = re.compile(r"\b(img|txt)/.*?encoderblock_(\d+)")


def dump_files(folder: pathlib.Path, module: str = "jit_train_step") -> tuple[pathlib.Path, pathlib.Path]:
    """`(optimized HLO, live ranges)` of the last dumped module named `module` in `folder`."""
    hlo = sorted(folder.glob(f"*.{module}.*after_optimizations.txt"))[-1]
    return hlo, hlo.with_name(hlo.name.replace(".txt", "-live-range.txt"))


def instructions(hlo_text: str) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """`name -> (dtype, shape, op_name)` of every array-valued instruction in `hlo_text`;
    a fusion's `op_name` is its fused computation's root's, else the last one named there
    (XLA puts none on the call, nor on the converts it adds); a program argument's is
    `ARGUMENT` and its path (``(argument) state.params['img']...``)."""
    found, roots, calls, computation, entry = {}, {}, {}, None, False
    for line in hlo_text.splitlines():
        start = _COMPUTATION.match(line)
        if start and line.rstrip().endswith("{"):
            computation, entry = start.group(1), line.startswith("ENTRY")
            continue
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, dtype, dims = match.groups()
        op_name = _OP_NAME.search(line)
        shape = tuple(int(d) for d in dims.split(",") if d)
        op_name = op_name.group(1) if op_name else ""
        if entry and " parameter(" in line:
            op_name = f"{ARGUMENT} {op_name}"  # its path in the jitted function's arguments
        found[name] = (dtype, shape, op_name)
        if op_name and (line.lstrip().startswith("ROOT") or computation not in roots or not roots[computation][1]):
            roots[computation] = (op_name, line.lstrip().startswith("ROOT"))
        called = _CALLS.search(line)
        if called and not op_name:
            calls[name] = called.group(1)
    for name, computation in calls.items():
        dtype, shape, _ = found[name]
        found[name] = (dtype, shape, roots.get(computation, ("", False))[0])
    return found


def live_at_peak(live_range_text: str) -> list[tuple[str, int]]:
    """`(value name, bytes)` of each value XLA lists as live at the program's peak."""
    values, inside = [], False
    for line in live_range_text.splitlines():
        if _PEAK.match(line):
            inside = True
            continue
        if inside:
            match = _LIVE.match(line)
            if not match:
                break
            values.append((match.group(1), int(match.group(2))))
    return values


def kind_of(name: str, shape: tuple[int, ...], op_name: str, param_shapes: frozenset) -> str:
    """What a value live at the peak is, for the backward pass:

    - "parameters", "optimizer state", "batch": the step's arguments, by their path
      (``state.params...``, ``state.opt_state...``, the others);
    - "gradients": made by the backward pass (``transpose(jvp(...))``), of a parameter's size;
    - "backward temporaries": the backward pass's other values;
    - "attention probabilities": the forward's [B, heads, L, L] arrays;
    - "parameter copies": the forward's arrays of a parameter's size (its casts to the
      compute dtype, its reshapes);
    - "activations": the forward's other arrays, kept for the backward pass;
    - "loss": what autodiff made outside the model (``jvp()``, ``transpose(jvp())``: the
      loss, either pass);
    - "optimizer update": what the step computes outside autodiff (the update, the
      gradients' norm and clipping, the metrics).
    """
    if op_name.startswith(ARGUMENT):
        if "opt_state" in op_name:
            return "optimizer state"
        return "parameters" if "params" in op_name else "batch"
    if "/jvp()/" in op_name or "transpose(jvp())" in op_name:
        return "loss"
    if "jvp(" not in op_name and op_name:
        return "optimizer update"
    parameter_sized = math.prod(shape) in {math.prod(p) for p in param_shapes}  # XLA reshapes some
    if "transpose(" in op_name:
        return "gradients" if parameter_sized else "backward temporaries"
    if len(shape) >= 4 and shape[-1] == shape[-2] and shape[-1] > 1:
        return "attention probabilities"
    return "parameter copies" if parameter_sized else "activations"


def peak_buffers(hlo_text: str, live_range_text: str) -> list[dict]:
    """Every value live at the peak: `name`, `bytes`, `dtype`, `shape`, `kind` (`kind_of`),
    `block` ("img 3", "txt 11", or "" outside the Transformer blocks) and `op_name`."""
    made = instructions(hlo_text)
    params = frozenset(
        shape
        for name, (_, shape, op_name) in made.items()
        if kind_of(name, shape, op_name, frozenset()) == "parameters"
    )
    rows = []
    for name, size in live_at_peak(live_range_text):
        dtype, shape, op_name = made.get(name, ("?", (), ""))
        block = _BLOCK.search(op_name)
        rows.append(
            {
                "name": name,
                "bytes": size,
                "dtype": dtype,
                "shape": list(shape),
                "kind": kind_of(name, shape, op_name, params),
                "block": f"{block.group(1)} {block.group(2)}" if block else "",
                "op_name": op_name,
            }
        )
    return rows


def grouped(rows: list[dict]) -> list[dict]:
    """`rows` summed by (kind, dtype, shape), the largest first: `count`, `bytes`."""
    groups: dict[tuple, dict] = collections.OrderedDict()
    for row in rows:
        key = (row["kind"], row["dtype"], tuple(row["shape"]))
        group = groups.setdefault(key, {"kind": key[0], "dtype": key[1], "shape": list(key[2]), "count": 0, "bytes": 0})
        group["count"] += 1
        group["bytes"] += row["bytes"]
    return sorted(groups.values(), key=lambda g: -g["bytes"])


def by_kind(rows: list[dict]) -> dict[str, int]:
    """Bytes live at the peak per kind, the largest first."""
    totals = collections.Counter()
    for row in rows:
        totals[row["kind"]] += row["bytes"]
    return dict(totals.most_common())
