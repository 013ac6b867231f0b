"""The scatters: ScatterElements, Scatter (its name before opset 11) and ScatterND.

Each kernel copies data to the output (a parallel loop), then applies the updates one after another in the order of
the indices (a serial loop nest, one worker): ONNX leaves duplicate indices under reduction "none" undefined, and
the serial order gives what onnxruntime and ONNX's reference give, the last write winning; the reductions
read-modify-write, so they need the order too. Indices are data, so each one is wrapped (negatives count from the
end) and clamped into its axis, as the gathers do: an out-of-range index writes a valid element, never memory
outside the output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.indexing import _wrap_index
from farm.ops.registry import NodeContext, axis_in_range, elementwise_loops, register
from farm.ops.tensor import load, value_dtype

# How an update meets the value already there. max and min are onnxruntime's std::max(old, update) and
# std::min(old, update): a NaN already in the output stays, a NaN update is ignored.
REDUCTIONS: dict[str, Callable[[L.Expr, L.Expr], L.Expr]] = {
    "none": lambda old, new: new,
    "add": lambda old, new: old + new,
    "mul": lambda old, new: old * new,
    "max": L.maximum,
    "min": L.minimum,
}
NUMERIC = frozenset({"float32", "int64", "int32"})
INDICES = frozenset({"int64", "int32"})


def _reduction(ctx: NodeContext) -> str:
    """The reduction, refused where farm doesn't compute it (an unknown name, arithmetic on bool data), after the
    dtypes (data the kernels store, int64 or int32 indices)."""
    data, indices = ctx.input_info(0).dtype, ctx.input_info(1).dtype
    if data not in NUMERIC | {"bool"} or indices not in INDICES:
        raise ctx.unsupported(f"{data} data with {indices} indices is not supported")
    reduction = str(ctx.node.attrs.get("reduction", "none"))
    if reduction not in REDUCTIONS:
        raise ctx.unsupported(f"reduction {reduction!r} is not supported ({', '.join(REDUCTIONS)} are)")
    if reduction != "none" and ctx.input_info(0).dtype not in NUMERIC:
        raise ctx.unsupported(f"reduction {reduction!r} on {ctx.input_info(0).dtype} data is not supported")
    return reduction


def _scatter_elements_attrs(ctx: NodeContext) -> dict[str, Any]:
    """axis and reduction; indices and updates must have data's rank, one shape, and fit inside data on every
    axis but `axis` (the kernel writes at those coordinates unchecked)."""
    data, indices, updates = (ctx.input_info(i).shape for i in range(3))
    axis = axis_in_range(ctx, ctx.node.attrs.get("axis", 0), len(data))
    fits = all(i <= d for a, (i, d) in enumerate(zip(indices, data)) if a != axis)
    if len(indices) != len(data) or updates != indices or not fits:
        raise ctx.unsupported(
            f"indices {list(indices)} and updates {list(updates)} don't fit data {list(data)} along axis {axis}"
        )
    return {"axis": axis, "reduction": _reduction(ctx)}


def _scatter_nd_attrs(ctx: NodeContext) -> dict[str, Any]:
    """The reduction; updates must have the shape indices.shape[:-1] + data.shape[k:], k = indices.shape[-1]."""
    data, indices, updates = (ctx.input_info(i).shape for i in range(3))
    depth = indices[-1] if indices else 0
    if not 1 <= depth <= len(data) or updates != indices[:-1] + data[depth:]:
        raise ctx.unsupported(f"indices {list(indices)} and updates {list(updates)} don't fit data {list(data)}")
    return {"reduction": _reduction(ctx)}


def _copy_then_update(spec: KernelSpec, target: Callable[[list[L.Var]], L.Expr]) -> list[L.Stmt]:
    """out0 = in0, then for each element u of updates (in2), in order: out0[t] = reduce(out0[t], updates[u]) where
    t = target(u's loop variables) is the flat output index."""
    names, data, updates = L.Names(), spec.inputs[0], spec.inputs[2]
    combine = REDUCTIONS[spec.attrs["reduction"]]
    copy = elementwise_loops(names, data.shape, lambda v: load("in0", data, L.flat_index(data.shape, v)))
    at = names.local("at", L.I64)

    def update(v: list[L.Var]) -> list[L.Stmt]:
        old = L.Load("out0", at, value_dtype(data))
        return [
            L.Assign(at, target(v)),
            L.Store("out0", at, combine(old, load("in2", updates, L.flat_index(updates.shape, v)))),
        ]

    updates_in_order, _ = L.loop_nest(names, updates.shape, update)  # serial: the order is the semantics
    return copy + updates_in_order


def _lower_scatter_elements(spec: KernelSpec) -> list[L.Stmt]:
    """out[i... with the axis index replaced by indices[i...]] <- updates[i...]."""
    axis, (data, indices, _) = spec.attrs["axis"], spec.inputs

    def target(v: list[L.Var]) -> L.Expr:
        index = _wrap_index(load("in1", indices, L.flat_index(indices.shape, v)), data.shape[axis])
        return L.flat_index(data.shape, [index if a == axis else i for a, i in enumerate(v)])

    return _copy_then_update(spec, target)


# Scatter (opsets 9 and 10) is ScatterElements without the reduction attribute.
register("ScatterElements", "Scatter", normalize=_scatter_elements_attrs)(_lower_scatter_elements)


@register("ScatterND", normalize=_scatter_nd_attrs)
def _lower_scatter_nd(spec: KernelSpec) -> list[L.Stmt]:
    """out[indices[j..., :], s...] <- updates[j..., s...]: each index tuple names a slice of data."""
    data, indices, _ = spec.inputs
    depth, tuple_rank = indices.shape[-1], len(indices.shape) - 1

    def target(v: list[L.Var]) -> L.Expr:
        picked = [
            _wrap_index(load("in1", indices, L.flat_index(indices.shape, [*v[:tuple_rank], L.const(k)])), data.shape[k])
            for k in range(depth)
        ]
        return L.flat_index(data.shape, [*picked, *v[tuple_rank:]])

    return _copy_then_update(spec, target)
