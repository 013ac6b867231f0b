"""Data-movement ops: reshapes (a flat copy), Transpose, Concat and Pad."""

from __future__ import annotations

from typing import Any

from farm.codegen import loopir as L
from farm.ops.registry import NodeContext, activate, elementwise_loops, out_shape, prod, register, shape_of
from farm.specs import KernelSpec


def _no_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {}


@register("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", normalize=_no_attrs, data_inputs=(0,))
def _lower_copy(spec: KernelSpec) -> list[L.Stmt]:
    """Reshapes keep the row-major bytes: the kernel copies them (the planner may alias later)."""
    size = prod(out_shape(spec))
    return elementwise_loops(L.Names(), (size,), lambda v: activate(L.Load("in0", v[0]), spec.activation))


def _transpose_attrs(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.inputs[0].shape)
    return {"perm": [int(p) % rank for p in ctx.node.attrs.get("perm", range(rank - 1, -1, -1))]}


@register("Transpose", normalize=_transpose_attrs)
def _lower_transpose(spec: KernelSpec) -> list[L.Stmt]:
    perm, in_shape = spec.attrs["perm"], shape_of(spec)

    def value(v: list[L.Var]) -> L.Expr:
        indices: list[L.Expr] = [L.const(0)] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            indices[in_axis] = v[out_axis]
        return L.Load("in0", L.flat_index(in_shape, indices))

    return elementwise_loops(L.Names(), out_shape(spec), value)


def _concat_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"axis": int(ctx.node.attrs["axis"]) % len(ctx.outputs[0].shape)}


@register("Concat", normalize=_concat_attrs)
def _lower_concat(spec: KernelSpec) -> list[L.Stmt]:
    """Each input copied into its slice of the output along `axis`."""
    names, axis, shape = L.Names(), spec.attrs["axis"], out_shape(spec)
    body: list[L.Stmt] = []
    start = 0
    for i, info in enumerate(spec.inputs):
        def copy(v: list[L.Var], i: int = i, info=info, start: int = start) -> list[L.Stmt]:
            out_index = [x + start if axis_ == axis else x for axis_, x in enumerate(v)]
            value = activate(L.Load(f"in{i}", L.flat_index(info.shape, v)), spec.activation)
            return [L.Store("out0", L.flat_index(shape, out_index), value)]

        loops, _ = L.loop_nest(names, info.shape, copy, parallel=True)
        body += loops
        start += info.shape[axis]
    return body


def _pad_attrs(ctx: NodeContext) -> dict[str, Any]:
    """pads and the constant from attributes (opset < 11) or constant inputs (opset >= 11)."""
    attrs = ctx.node.attrs
    pads_input, value_input = ctx.constant(1), ctx.constant(2)
    if ctx.constant(3) is not None:
        raise ctx.unsupported("Pad's axes input is not supported")
    pads = [int(p) for p in (pads_input if pads_input is not None else attrs.get("pads", []))]
    value = float(value_input) if value_input is not None and value_input.size else float(attrs.get("value", 0.0))
    mode = attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise ctx.unsupported(f"Pad mode {mode!r} is not supported (constant, reflect, edge are)")
    return {"pads": pads, "value": value, "mode": mode}


def _reflect(i: L.Expr, size: int) -> L.Expr:
    folded = L.select(L.compare("lt", i, 0), -i, i)
    return L.select(L.compare("ge", folded, size), 2 * (size - 1) - folded, folded)


PAD_MODES = {
    "constant": lambda i, size: L.minimum(L.maximum(i, 0), size - 1),
    "edge": lambda i, size: L.minimum(L.maximum(i, 0), size - 1),
    "reflect": _reflect,
}


@register("Pad", normalize=_pad_attrs, data_inputs=(0,))
def _lower_pad(spec: KernelSpec) -> list[L.Stmt]:
    a, in_shape = spec.attrs, shape_of(spec)
    rank, source_index = len(in_shape), PAD_MODES[a["mode"]]

    def value(v: list[L.Var]) -> L.Expr:
        coords = [x - a["pads"][axis] for axis, x in enumerate(v)]
        loaded = L.Load("in0", L.flat_index(in_shape, [source_index(c, n) for c, n in zip(coords, in_shape)]))
        if a["mode"] != "constant":
            return activate(loaded, spec.activation)
        inside = L.logical_and(*[L.logical_and(L.compare("ge", c, 0), L.compare("lt", c, n))
                                 for c, n in zip(coords, in_shape)]) if rank else None
        return activate(L.select(inside, loaded, a["value"]) if inside is not None else loaded, spec.activation)

    return elementwise_loops(L.Names(), out_shape(spec), value)
