"""GridSample: the input sampled at the points a grid gives, step for step as ONNX's reference
(onnx/reference/ops/op_grid_sample.py, itself PyTorch's grid_sampler) computes them.

Each grid point (x, y[, z] in [-1, 1], the last spatial axis first) is denormalised onto the input's axes, rounded
half to even under `nearest`, and, when it falls outside the borders ([-0.5, size - 0.5], or [0, size - 1] with
align_corners), clamped into [0, size - 1] (`border`) or reflected about them (`reflection`). Its neighbours (one,
two or four per axis for nearest, linear and cubic) are then read with the same padding: 0 outside the input
(`zeros`), the index clamped (`border`) or reflected (`reflection`). Every spatial rank ONNX allows runs: 4-D
inputs, and from opset 20 (where the modes are linear/nearest/cubic instead of bilinear/nearest/bicubic) any rank
from 3 (1-D, 3-D volumetric, ... sampling).

The grid is data, so every float becomes an index only after a guard that maps NaN and values far outside the
input to a bound (a cast of either is undefined) and every index is clamped before its load: no grid value reads
outside the input.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import product
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.mathfns import Scope, is_odd_integer, round_half_even
from farm.ops.registry import NodeContext, register

# The mode names of each opset (16 named them after the 2-D case), by canonical mode.
MODE_NAMES = {
    16: {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"},
    20: {"linear": "linear", "nearest": "nearest", "cubic": "cubic"},
}
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_ALPHA = -0.75
TAP_LIMIT = 256
"""The most input reads one output may combine (taps per axis ** spatial axes): cubic sampling in 4 spatial
dimensions; past it the kernel's code would grow with each axis fourfold."""
TAPS_PER_AXIS = {"nearest": 1, "linear": 2, "cubic": 4}
GUARD = 4
"""How far outside [0, size - 1] a coordinate is clamped before it becomes an integer: past every neighbour."""

# A tap along one axis: (index as a float holding an integer, weight or None for nearest's single tap).
Tap = tuple[L.Expr, L.Expr | None]


def _mode(ctx: NodeContext) -> str:
    """The canonical mode, from the names of the node's opset."""
    names = MODE_NAMES[20 if ctx.opset >= 20 else 16]
    mode = ctx.node.attrs.get("mode", "linear" if ctx.opset >= 20 else "bilinear")
    if mode not in names:
        raise ctx.unsupported(f"mode {mode!r} is not supported at opset {ctx.opset} ({', '.join(names)} are)")
    return names[mode]


def _check_shapes(ctx: NodeContext, mode: str) -> None:
    """float32 input and grid; a 4-D input (any rank from 3 from opset 20) with a grid of the same batch and one
    component per spatial axis, and no more than TAP_LIMIT taps per output."""
    x, grid = ctx.input_info(0), ctx.input_info(1)
    if x.dtype != "float32" or grid.dtype != "float32":
        raise ctx.unsupported(f"input {x.dtype} and grid {grid.dtype}: only float32 is supported")
    if len(x.shape) != 4 and (ctx.opset < 20 or len(x.shape) < 3):
        raise ctx.unsupported(f"a rank-{len(x.shape)} input is not supported at opset {ctx.opset}")
    spatial = len(x.shape) - 2
    if len(grid.shape) != len(x.shape) or grid.shape[0] != x.shape[0] or grid.shape[-1] != spatial:
        raise ctx.unsupported(f"grid {list(grid.shape)} does not fit input {list(x.shape)}")
    if min(x.shape[2:]) < 1:
        raise ctx.unsupported("an input with an empty spatial axis has nothing to sample")
    if TAPS_PER_AXIS[mode] ** spatial > TAP_LIMIT:
        raise ctx.unsupported(f"{mode} sampling in {spatial} spatial dimensions reads more than {TAP_LIMIT} taps")


def _grid_sample_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Canonical mode, padding and align_corners."""
    mode, padding = _mode(ctx), ctx.node.attrs.get("padding_mode", "zeros")
    if padding not in PADDING_MODES:
        raise ctx.unsupported(f"padding_mode {padding!r} is not supported ({', '.join(PADDING_MODES)} are)")
    _check_shapes(ctx, mode)
    return {"mode": mode, "padding": padding, "align_corners": bool(int(ctx.node.attrs.get("align_corners", 0)))}


def _borders(size: int, align_corners: bool) -> tuple[float, float]:
    """The coordinates a point may take before padding applies."""
    return (0.0, float(size - 1)) if align_corners else (-0.5, size - 0.5)


def _denormalize(g: L.Expr, size: int, align_corners: bool) -> L.Expr:
    """[-1, 1] onto the input axis: the centres of the end pixels (align_corners) or their outer edges."""
    if align_corners:
        return (g + 1.0) / 2.0 * float(size - 1)
    return ((g + 1.0) * float(size) - 1.0) / 2.0


def _clamped(x: L.Expr, low: float, high: float) -> L.Expr:
    """x clamped into [low, high] by comparisons that send NaN to `low` (so that a cast of it is defined)."""
    return L.select(L.compare("lt", x, high), L.select(L.compare("gt", x, low), x, low), high)


def _reflect(s: Scope, x: L.Expr, low: float, high: float) -> L.Expr:
    """x reflected about low and high until it lies between them (the reference's _gs_reflect); a zero-width
    range (one pixel under align_corners) maps everything to its one coordinate, as PyTorch does."""
    span = high - low
    if span == 0:
        return L.const(low)
    x = s.bind(x)
    below = s.bind(L.compare("lt", x, low))
    distance = s.bind(L.select(below, low - x, x - high))
    turns = s.bind(L.call("floor", distance / span))
    rest = s.bind(distance - turns * span)
    from_low = L.compare("ne", below, is_odd_integer(s, turns))
    return L.select(from_low, low + rest, high - rest)


def _padded_coordinate(s: Scope, x: L.Expr, padding: str, size: int, align_corners: bool) -> L.Expr:
    """The coordinate after the reference's border step: outside the borders, clamped or reflected."""
    if padding == "zeros":
        return x
    low, high = _borders(size, align_corners)
    x = s.bind(x)
    outside = L.binary("or", L.compare("lt", x, low), L.compare("gt", x, high))
    inside = _clamped(x, 0.0, float(size - 1)) if padding == "border" else _reflect(s, x, low, high)
    return L.select(outside, inside, x)


def _nearest_taps(s: Scope, x: L.Expr) -> list[Tap]:
    return [(x, None)]


def _linear_taps(s: Scope, x: L.Expr) -> list[Tap]:
    low = s.bind(L.call("floor", x))
    t = s.bind(x - low)
    return [(low, 1.0 - t), (low + 1.0, t)]


def _cubic_weights(s: Scope, t: L.Expr) -> list[L.Expr]:
    """The four weights of taps floor - 1 .. floor + 2 at fraction t (the reference's _gs_get_cubic_coeffs)."""
    a = CUBIC_ALPHA
    outer = lambda d: ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a  # noqa: E731 (1 <= d <= 2)
    inner = lambda d: ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0  # noqa: E731 (0 <= d <= 1)
    u = s.bind(1.0 - t)
    return [outer(t + 1.0), inner(t), inner(u), outer(u + 1.0)]


def _cubic_taps(s: Scope, x: L.Expr) -> list[Tap]:
    low = s.bind(L.call("floor", x))
    t = s.bind(x - low)
    return [(low + float(offset), w) for offset, w in zip((-1, 0, 1, 2), _cubic_weights(s, t))]


TAPS: dict[str, Callable[[Scope, L.Expr], list[Tap]]] = {
    "nearest": _nearest_taps,
    "linear": _linear_taps,
    "cubic": _cubic_taps,
}


def _tap_index(s: Scope, at: L.Expr, padding: str, size: int, align_corners: bool) -> tuple[L.Expr, L.Expr | None]:
    """(index to load, whether the tap lies inside the input or None when it always reads) for the float index
    `at` under the padding mode; the index is always inside [0, size)."""
    guarded = s.bind(L.Cast(_clamped(at, -float(GUARD), float(size - 1 + GUARD)), L.I64))
    safe = L.minimum(L.maximum(guarded, 0), size - 1)
    if padding == "zeros":
        inside = L.logical_and(L.compare("ge", guarded, 0), L.compare("lt", guarded, size))
        return s.bind(safe), s.bind(inside)
    if padding == "border":
        return s.bind(safe), None
    low, high = _borders(size, align_corners)
    reflected = L.Cast(_clamped(_reflect(s, L.to_float(guarded), low, high), 0.0, float(size - 1)), L.I64)
    return s.bind(reflected), None


def _axis_taps(s: Scope, spec: KernelSpec, g: L.Expr, size: int) -> list[tuple[L.Expr, L.Expr | None, L.Expr | None]]:
    """(index, inside or None, weight or None) of each neighbour of grid coordinate g along an axis of `size`."""
    a = spec.attrs
    coordinate = _denormalize(g, size, a["align_corners"])
    if a["mode"] == "nearest":
        coordinate = round_half_even(s, coordinate)
    coordinate = s.bind(_padded_coordinate(s, coordinate, a["padding"], size, a["align_corners"]))
    return [
        (*_tap_index(s, at, a["padding"], size, a["align_corners"]), weight)
        for at, weight in TAPS[a["mode"]](s, coordinate)
    ]


def _interpolated(x_shape: tuple[int, ...], n: L.Expr, c: L.Expr, axes: list) -> L.Expr:
    """The weighted sum over every combination of one tap per axis (0 for a tap outside the input)."""
    total: L.Expr | None = None
    for taps in product(*axes):
        term: L.Expr = L.Load("in0", L.flat_index(x_shape, [n, c, *(index for index, _, _ in taps)]))
        insides = [inside for _, inside, _ in taps if inside is not None]
        if insides:
            term = L.select(L.logical_and(*insides), term, 0.0)
        for _, _, weight in taps:
            term = term if weight is None else term * weight
        total = term if total is None else total + term
    assert total is not None, "every axis has a tap, so there is at least one combination"
    return total


@register("GridSample", normalize=_grid_sample_attrs)
def _lower_grid_sample(spec: KernelSpec) -> list[L.Stmt]:
    """A work-item per (batch, output point): its taps and weights once, then a loop over the channels."""
    x, grid = spec.inputs
    batch, channels, *sizes = x.shape
    out = spec.outputs[0].shape
    names = L.Names()

    def point(v: list[L.Var]) -> list[L.Stmt]:
        s, n, where = Scope(names), v[0], v[1:]
        rank = len(sizes)
        axes = [
            _axis_taps(s, spec, L.Load("in1", L.flat_index(grid.shape, [n, *where, rank - 1 - axis])), size)
            for axis, size in enumerate(sizes)
        ]
        c = names.var("c")
        value = _interpolated(x.shape, n, c, axes)
        return [*s.stmts, L.Loop(c, channels, [L.Store("out0", L.flat_index(out, [n, c, *where]), value)])]

    body, _ = L.loop_nest(names, (batch, *out[2:]), point, parallel=True)
    return body
