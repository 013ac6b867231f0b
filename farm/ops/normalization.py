"""RMSNormalization (opset 23): LayerNormalization without the mean, lowered the way farm.ops.nn lowers it (one
work-item per normalised row)."""

from __future__ import annotations

from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.nn import _broadcast, _contiguous, _trailing
from farm.ops.reduce import over_rows
from farm.ops.registry import NodeContext, axis_in_range, prod, register, shape_of


def _rms_attrs(ctx: NodeContext) -> dict[str, Any]:
    """axis and epsilon. The statistics are float32 (stash_type 1, the only one farm computes in), and the scale
    must broadcast to the normalised shape (the axes from `axis` on): the kernel reads it at the broadcast index."""
    a, shape = ctx.node.attrs, ctx.inputs[0].shape
    if {info.dtype for info in ctx.inputs[:2]} != {"float32"}:
        raise ctx.unsupported("RMSNormalization computes on float32 only")
    if int(a.get("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {a['stash_type']} is not supported (1, float32, is)")
    axis = axis_in_range(ctx, a.get("axis", -1), len(shape))
    normalized, scale = shape[axis:], _trailing(ctx.inputs[1].shape, len(shape) - axis)
    fits = len(scale) <= len(normalized) and all(s in (1, n) for s, n in zip(reversed(scale), reversed(normalized)))
    if not fits:
        raise ctx.unsupported(f"scale of shape {list(ctx.inputs[1].shape)} doesn't broadcast to {list(normalized)}")
    return {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5))}


@register("RMSNormalization", normalize=_rms_attrs)
def _lower_rms_normalization(spec: KernelSpec) -> list[L.Stmt]:
    """y = x / sqrt(mean(x^2) + epsilon) * scale over the axes from `axis` on."""
    names, a, shape = L.Names(), spec.attrs, shape_of(spec)
    normalized = shape[a["axis"]:]
    length = prod(normalized)
    scale = ("in1", _trailing(shape_of(spec, 1), len(normalized)))
    factor = names.local("inv_rms")

    def row(o: L.Expr, _: L.Expr) -> list[L.Stmt]:
        base = o * length
        x = lambda v: L.Load("in0", base + L.flat_index(normalized, v))  # noqa: E731
        squares = _contiguous(names, base, length)(
            lambda i: [L.Assign(factor, factor + L.Load("in0", i) * L.Load("in0", i))])
        mean_square = factor * (1.0 / length) + a["epsilon"]
        loops, _ = L.loop_nest(names, normalized, lambda v: [
            L.Store("out0", base + L.flat_index(normalized, v), x(v) * factor * L.Load(*_broadcast(scale, normalized, v)))])
        return [L.Assign(factor, L.const(0.0)), *squares, L.Assign(factor, 1.0 / L.call("sqrt", mean_square)), *loops]

    return over_rows(names, prod(shape[:a["axis"]]), 1, row)
