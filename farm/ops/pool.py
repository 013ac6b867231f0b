"""The pools: MaxPool and AveragePool over planes (a CPU's on padded planes) or volumes (a loop nest), LpPool
over any number of spatial axes, GlobalAveragePool and GlobalMaxPool."""

from __future__ import annotations

import math
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.quantize import BYTE_INTS, QUANT_RANGES
from farm.ops.reduce import NEG_INF, absolute
from farm.ops.registry import CORE_DTYPES, NodeContext, activate, out_shape, prod, register, shape_of
from farm.ops.window import (
    Window,
    WindowLowering,
    cpu_channel_block,
    nchw,
    no_scratch,
    pad_plane,
    padded_plane,
    phased_plane_floats,
    phased_tap,
    register_by_rank,
    same_pads,
    spatial_attrs,
    tap_coordinates,
    window,
    window_tap,
    within,
)

BYTE_POOLS = BYTE_INTS
"""The integer dtypes MaxPool takes (ONNX's, from opset 12): its max is taken in float32, exact for bytes."""


def _x(spec: KernelSpec, index: L.Expr) -> L.Expr:
    """x[index] as a float32: a byte MaxPool's values converted (exactly)."""
    if spec.inputs[0].dtype in BYTE_POOLS:
        return L.Cast(L.Load("in0", index, L.I64), L.F32)
    return L.Load("in0", index)


def _stored(spec: KernelSpec, value: L.Expr) -> L.Expr:
    """A pool's float32 result as out0 holds it: a byte MaxPool's max is one of its inputs, converted back (a
    window wholly in the padding, whose max is -inf, gives the dtype's least value)."""
    dtype = spec.outputs[0].dtype
    if dtype not in BYTE_POOLS:
        return value
    low, high = QUANT_RANGES[dtype]
    return L.Cast(L.minimum(L.maximum(value, float(low)), float(high)), L.I64)


def _input_at(
    spec: KernelSpec, geo: Window, base: L.Expr, oh: L.Expr, ow: L.Expr, r: L.ExprLike, s: L.ExprLike, fill: float
) -> L.Expr:
    """x[base + ih*W + iw] for the window tap (r, s) of output (oh, ow), or `fill` in the padding."""
    ih = oh * geo.stride_height - geo.pad_top + L.wrap(r, L.I64) * geo.dilation_height
    iw = ow * geo.stride_width - geo.pad_left + L.wrap(s, L.I64) * geo.dilation_width
    inside = L.logical_and(
        L.compare("ge", ih, 0), L.compare("lt", ih, geo.height), L.compare("ge", iw, 0), L.compare("lt", iw, geo.width)
    )
    clamped = L.minimum(L.maximum(ih, 0), geo.height - 1) * geo.width + L.minimum(L.maximum(iw, 0), geo.width - 1)
    return L.select(inside, _x(spec, base + clamped), fill)


def _pool_attrs(ctx: NodeContext) -> dict[str, Any]:
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        raise ctx.unsupported("MaxPool's Indices output is not supported")
    attrs = spatial_attrs(ctx, list(ctx.node.attrs["kernel_shape"]))
    attrs["count_include_pad"] = int(ctx.node.attrs.get("count_include_pad", 0))
    return attrs


def _lower_pool_planes(spec: KernelSpec) -> list[L.Stmt]:
    """Max or average over each window of a plane (or a 1-D input's row: _as_plane); the average divides by the
    window's count under count_include_pad. A CPU's pools read padded planes instead (_pool_planes)."""
    if _pools_planes(spec):
        return _pool_planes(spec)
    names, a = L.Names(), spec.attrs
    n, c, h, w = nchw(shape_of(spec))
    _, _, ho, wo = nchw(out_shape(spec))
    geo = window(spec)
    plane, y, x, r, s = names.var("p"), names.var("y"), names.var("x"), names.var("r"), names.var("s")
    acc, count = names.local(), names.local("cnt")
    is_max = spec.op == "MaxPool"
    tap = _input_at(spec, geo, plane * (h * w), y, x, r, s, -math.inf if is_max else 0.0)
    update: list[L.Stmt] = [L.Assign(acc, L.maximum(acc, tap) if is_max else acc + tap)]
    if not is_max:
        update.append(L.Assign(count, count + L.select(_counted(geo, a, y, x, r, s), 1.0, 0.0)))
    kh, kw = a["kernel_shape"]
    result = acc if is_max else acc / count
    inner = [
        L.Assign(acc, L.const(-math.inf if is_max else 0.0)),
        L.Assign(count, L.const(0.0)),
        L.Loop(r, kh, [L.Loop(s, kw, update)]),
        L.Store("out0", (plane * ho + y) * wo + x, _stored(spec, activate(result, spec.activation))),
    ]
    return [L.Loop(plane, n * c, [L.Loop(y, ho, [L.Loop(x, wo, inner, True)], True)], True)]


def _pools_planes(spec: KernelSpec) -> bool:
    """Whether the pool runs on padded planes (_pool_planes): any 2-D pool for a CPU (a GPU wants a work-item per
    output)."""
    return spec.for_cpu


def _pool_plane_scratch(spec: KernelSpec) -> int:
    """A pool's padded planes on a CPU (_pool_planes): one per block of channels. Sized so for any spec (the memory
    plan reads the unspecialised one); the other renderers' pools read no scratch."""
    n, c, *_ = shape_of(spec)
    if _taps_inside(window(spec)):
        return 0
    return n * c // cpu_channel_block(n * c) * phased_plane_floats(window(spec))


def _taps_inside(geo: Window) -> bool:
    """Whether every tap of every output lies inside the input (no pads, no window past the last row or column):
    then the pool reads its input in place (_pool_planes), with no padded copy."""
    rows, columns = padded_plane(geo)
    return geo.pad_top == geo.pad_left == 0 and rows <= geo.height and columns <= geo.width


def _pool_planes(spec: KernelSpec) -> list[L.Stmt]:
    """A pool as the depthwise conv runs (conv._depthwise): each channel's window copied into a plane padded with
    -inf (MaxPool) or 0 (AveragePool), its columns split by the stride's phases, shared by a block of channels, then
    every output the max or the sum of its taps read at unit stride (vectorised), an average divided by its count
    (_tap_count). Guarding every tap and reading stride-2 taps two floats apart ran ResNet-50's 3x3 stride-2
    MaxPool at half onnxruntime's speed, and Inception's 3x3 AveragePools at 0.47x. A pool whose taps all lie
    inside its input (_taps_inside) reads it in place instead, unguarded, its taps stride apart: the copy was a
    whole extra pass over the input (VGG-19's 2x2 stride-2 MaxPools 0.69-0.91x the time without it on one Xeon
    core; SqueezeNet's unpadded 3x3 stride-2 ones the same either way)."""
    names, geo = L.Names(), window(spec)
    n, c, h, w = nchw(shape_of(spec))
    size = cpu_channel_block(n * c)
    block, index = names.var("cb"), names.var("c")
    channel = block * size + index
    plane = block * phased_plane_floats(geo)
    oh, ow, r, acc = names.var("y"), names.var("x"), names.var("r"), names.local()
    is_max = spec.op == "MaxPool"
    inside = _taps_inside(geo)

    def tap(s: int) -> L.Expr:
        if inside:
            row = oh * geo.stride_height + r * geo.dilation_height
            return _x(spec, channel * (h * w) + row * w + ow * geo.stride_width + s * geo.dilation_width)
        return phased_tap(geo, plane, oh, ow, r, s)

    taps: list[L.Stmt] = [
        L.Assign(acc, L.maximum(acc, tap(s)) if is_max else acc + tap(s)) for s in range(geo.kernel_width)
    ]
    result = acc if is_max else acc / (_tap_count(geo, spec.attrs, oh, 0) * _tap_count(geo, spec.attrs, ow, 1))
    out_index = (channel * geo.out_height + oh) * geo.out_width + ow
    fill = -math.inf if is_max else 0.0
    inner = [
        L.Assign(acc, L.const(fill)),
        L.Loop(r, geo.kernel_height, taps),
        L.Store("out0", out_index, _stored(spec, activate(result, spec.activation))),
    ]
    outputs = [L.Loop(oh, geo.out_height, [L.Loop(ow, geo.out_width, inner)])]
    value_dtype = L.I64 if spec.inputs[0].dtype in BYTE_POOLS else L.F32
    copy = [] if inside else pad_plane(names, geo, plane, channel * (h * w), geo.stride_width, fill, value_dtype)
    per_channel = copy + outputs
    return [L.Loop(block, n * c // size, [L.Loop(index, size, per_channel)], True)]


def _tap_count(geo: Window, attrs: dict[str, Any], out: L.Var, axis: int) -> L.Expr:
    """How many of an output's taps along `axis` (0: rows, 1: columns) an average counts (_counts_along), as a
    float: the taps are unrolled, so the count is arithmetic on the output's index alone."""
    count: L.Expr = L.const(0.0)
    for tap in range(geo.kernel_height if axis == 0 else geo.kernel_width):
        count = count + L.select(_counts_along(geo, attrs, out, tap, axis), 1.0, 0.0)
    return count


def _counted(geo: Window, attrs: dict, y: L.Var, x: L.Var, r: L.Var, s: L.Var) -> L.Expr:
    """Whether tap (r, s) of output (y, x) counts towards the average (_counts_along, on both axes)."""
    return L.logical_and(_counts_along(geo, attrs, y, r, 0), _counts_along(geo, attrs, x, s, 1))


def _counts_along(geo: Window, attrs: dict[str, Any], out: L.Var, tap: L.ExprLike, axis: int) -> L.Expr:
    """Whether an output's tap along `axis` (0: rows, 1: columns) counts towards the average: inside the input, or
    inside the pads under count_include_pad."""
    stride, pad, dilation, size = (
        (geo.stride_height, geo.pad_top, geo.dilation_height, geo.height)
        if axis == 0
        else (geo.stride_width, geo.pad_left, geo.dilation_width, geo.width)
    )
    pads = attrs["pads"] if attrs["count_include_pad"] else [0, 0, 0, 0]
    return within([out * stride - pad + L.wrap(tap, L.I64) * dilation], [-pads[axis]], [size + pads[axis + 2]])


def _lower_pool_volumes(spec: KernelSpec) -> list[L.Stmt]:
    """MaxPool or AveragePool over 3 spatial axes as a plain loop nest, a first correct version: a work-item per
    output element, its window in a serial loop nest. Taps in the padding are -inf for the max and add nothing to
    the average, whose count includes them under count_include_pad (up to the end pads: a ceil_mode window past
    them counts only what lies inside them, as in 2-D)."""
    names, a = L.Names(), spec.attrs
    n, c, *sizes = shape_of(spec)
    shape = (n * c, *out_shape(spec)[2:])
    acc, count = names.local(), names.local("cnt")
    is_max = spec.op == "MaxPool"

    def element(v: list[L.Var]) -> list[L.Stmt]:
        def tap(taps: list[L.Var]) -> list[L.Stmt]:
            inside, at = window_tap(a, sizes, v[1:], taps)
            value = L.select(inside, _x(spec, v[0] * prod(sizes) + at), -math.inf if is_max else 0.0)
            if is_max:
                return [L.Assign(acc, L.maximum(acc, value))]
            counted = L.select(_counted_tap(a, sizes, v[1:], taps), 1.0, 0.0)
            return [L.Assign(acc, acc + value), L.Assign(count, count + counted)]

        window, _ = L.loop_nest(names, tuple(a["kernel_shape"]), tap)
        result = acc if is_max else acc / count
        return [
            L.Assign(acc, L.const(-math.inf if is_max else 0.0)),
            L.Assign(count, L.const(0.0)),
            *window,
            L.Store("out0", L.flat_index(shape, v), _stored(spec, activate(result, spec.activation))),
        ]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body


def _counted_tap(a: dict[str, Any], sizes: list[int], outs: list[L.Var], taps: list[L.Var]) -> L.Expr:
    """Whether a tap counts towards the average (any rank): inside the input, or inside the pads under
    count_include_pad."""
    rank = len(sizes)
    pads = a["pads"] if a["count_include_pad"] else [0] * 2 * rank
    highs = [size + end for size, end in zip(sizes, pads[rank:])]
    return within(tap_coordinates(a, outs, taps), [-begin for begin in pads[:rank]], highs)


POOL_LOWERINGS = {
    2: WindowLowering(_lower_pool_planes, _pool_plane_scratch),
    3: WindowLowering(_lower_pool_volumes, no_scratch),
}
"""MaxPool and AveragePool by spatial rank: planes (1-D ones as planes of height 1), volumes as a loop nest."""


register_by_rank(("AveragePool",), POOL_LOWERINGS, normalize=_pool_attrs, data_inputs=(0,))
register_by_rank(("MaxPool",), POOL_LOWERINGS, normalize=_pool_attrs, data_inputs=(0,), dtypes=CORE_DTYPES | BYTE_POOLS)


def _lp_pool_attrs(ctx: NodeContext) -> dict[str, Any]:
    """LpPool's window over any number of spatial axes (N, C, D1, D2, ...): kernel_shape, strides, dilations and
    explicit pads (all begins, then all ends) with auto_pad resolved, and the integer power p. ceil_mode only
    shapes the output, which shape inference gives."""
    x, a = ctx.inputs[0], ctx.node.attrs
    if x is None or len(x.shape) < 3 or x.dtype != "float32":
        raise ctx.unsupported("LpPool needs a float32 input of shape (N, C, D1, ...)")
    rank = len(x.shape) - 2
    kernel = [int(k) for k in a.get("kernel_shape", ())]
    strides, dilations = ([int(v) for v in a.get(name, [1] * rank)] for name in ("strides", "dilations"))
    pads = [int(v) for v in a.get("pads", [0] * 2 * rank)]
    if any(len(v) != rank for v in (kernel, strides, dilations)) or len(pads) != 2 * rank:
        raise ctx.unsupported(f"kernel_shape, strides, dilations and pads must cover the {rank} spatial axes")
    if min(kernel + strides + dilations) < 1 or min(pads) < 0:
        raise ctx.unsupported("kernel_shape, strides and dilations must be positive and pads not negative")
    auto_pad = a.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(x.shape[2:], kernel, strides, dilations, upper=auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = [0] * 2 * rank
    p = float(a.get("p", 2))
    if p != int(p) or p < 1:
        raise ctx.unsupported(f"p={p:g} is not supported (integer powers from 1 are)")
    return {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "p": int(p)}


def _lp_tap(
    names: L.Names, a: dict[str, Any], spatial: tuple[int, ...], plane: L.Expr, out_vars: list[L.Var], taps: list[L.Var]
) -> tuple[list[L.Stmt], L.Expr]:
    """(statements, |x|^p) of one window tap, 0 where the tap lies in the padding (or past the input, under
    ceil_mode)."""
    inside, at = window_tap(a, list(spatial), out_vars, taps)
    scope = M.Scope(names)
    x = absolute(L.Load("in0", plane * prod(spatial) + at))
    return scope.stmts, L.select(inside, M.integer_power(scope, x, a["p"]), 0.0)


@register("LpPool", normalize=_lp_pool_attrs)
def _lower_lp_pool(spec: KernelSpec) -> list[L.Stmt]:
    """(sum of |x|^p over each window) ^ (1/p); the padding contributes nothing. Any number of spatial axes: one
    work-item per output element, its taps in a serial loop nest."""
    names, a = L.Names(), spec.attrs
    n, c, *spatial = shape_of(spec)
    out_spatial = out_shape(spec)[2:]
    total = names.local("sum")

    def element(v: list[L.Var]) -> list[L.Stmt]:
        def tap(taps: list[L.Var]) -> list[L.Stmt]:
            stmts, value = _lp_tap(names, a, tuple(spatial), v[0], v[1:], taps)
            return [*stmts, L.Assign(total, total + value)]

        window, _ = L.loop_nest(names, tuple(a["kernel_shape"]), tap)
        root = {1: total, 2: L.call("sqrt", total)}.get(a["p"], L.call("exp", L.call("log", total) * (1.0 / a["p"])))
        return [L.Assign(total, L.const(0.0)), *window, L.Store("out0", L.flat_index((n * c, *out_spatial), v), root)]

    body, _ = L.loop_nest(names, (n * c, *out_spatial), element, parallel=True)
    return body


def _no_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {}


@register("GlobalAveragePool", "GlobalMaxPool", normalize=_no_attrs)
def _lower_global_pool(spec: KernelSpec) -> list[L.Stmt]:
    names = L.Names()
    shape = shape_of(spec)
    planes, size = shape[0] * shape[1], prod(shape[2:])
    p, i, acc = names.var("p"), names.var("i"), names.local()
    tap = L.Load("in0", p * size + i)
    is_max = spec.op == "GlobalMaxPool"
    result = acc if is_max else acc * (1.0 / size)
    return [
        L.Loop(
            p,
            planes,
            parallel=True,
            body=[
                L.Assign(acc, L.const(NEG_INF if is_max else 0.0)),
                L.Loop(i, size, [L.Assign(acc, L.maximum(acc, tap) if is_max else acc + tap)]),
                L.Store("out0", p, activate(result, spec.activation)),
            ],
        )
    ]
