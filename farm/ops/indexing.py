"""Ops whose values come from index arithmetic: the gathers (Gather, GatherElements, GatherND), OneHot, the
generators (Shape, Size, Range, ConstantOfShape, EyeLike) and resampling (Resize, Upsample).

Indices are data (int64 or int32 buffers), so a gather clamps each one into range after wrapping negatives: an
out-of-range index reads a valid element instead of memory outside the buffer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import ALL_DTYPES, NodeContext, axis_in_range, elementwise_loops, out_shape, register
from farm.ops.tensor import axis_attr, load, no_attrs, scalar, typed_const, value_dtype


def _wrap_index(index: L.Expr, size: int) -> L.Expr:
    """A possibly negative index into an axis of `size`, wrapped and clamped into [0, size)."""
    wrapped = L.select(L.compare("lt", index, 0), index + size, index)
    return L.minimum(L.maximum(wrapped, 0), size - 1)


# -------------------------------------------------------------------------------------------------- gathers


@register("Gather", normalize=axis_attr, dtypes=ALL_DTYPES)
def _lower_gather(spec: KernelSpec) -> list[L.Stmt]:
    """out[a..., j..., b...] = data[a..., indices[j...], b...] (embedding lookups: axis 0 of a [V, D] table)."""
    axis, (data, indices) = spec.attrs["axis"], spec.inputs
    rank = len(indices.shape)

    def value(v: list[L.Var]) -> L.Expr:
        index = _wrap_index(load("in1", indices, L.flat_index(indices.shape, v[axis : axis + rank])), data.shape[axis])
        return load("in0", data, L.flat_index(data.shape, [*v[:axis], index, *v[axis + rank :]]))

    return elementwise_loops(L.Names(), out_shape(spec), value)


# ---------------------------------------------------------------------------------------------- generators


def _shape_attrs(ctx: NodeContext) -> dict[str, Any]:
    """The dims Shape returns (opset 15's start and end clamp like a Python slice)."""
    shape = ctx.input_info(0).shape
    start, end = int(ctx.node.attrs.get("start", 0)), ctx.node.attrs.get("end")
    return {"values": list(shape[start : None if end is None else int(end)])}


def _size_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"values": [ctx.input_info(0).size]}


@register("Shape", normalize=_shape_attrs, data_inputs=(), dtypes=ALL_DTYPES)
@register("Size", normalize=_size_attrs, data_inputs=(), dtypes=ALL_DTYPES)
def _lower_constant_values(spec: KernelSpec) -> list[L.Stmt]:
    """Store the static values (usually folded into constants before planning; kept for graph outputs)."""
    dtype = value_dtype(spec.outputs[0])
    return [L.Store("out0", L.const(i), typed_const(v, dtype)) for i, v in enumerate(spec.attrs["values"])]


def _constant_of_shape_attrs(ctx: NodeContext) -> dict[str, Any]:
    value = ctx.node.attrs.get("value")
    return {"value": 0.0 if value is None else scalar(value)}


@register("ConstantOfShape", normalize=_constant_of_shape_attrs, data_inputs=(), dtypes=ALL_DTYPES)
def _lower_constant_of_shape(spec: KernelSpec) -> list[L.Stmt]:
    value = typed_const(spec.attrs["value"], value_dtype(spec.outputs[0]))
    return elementwise_loops(L.Names(), out_shape(spec), lambda v: value)


@register("Range", normalize=no_attrs, data_inputs=(0, 2), dtypes=ALL_DTYPES)
def _lower_range(spec: KernelSpec) -> list[L.Stmt]:
    """out[i] = start + i * delta, start and delta read from their inputs (the output length is static)."""
    dtype = value_dtype(spec.outputs[0])
    start, delta = (load(f"in{i}", spec.inputs[i], L.const(0)) for i in (0, 1))
    step = (lambda i: L.Cast(i, dtype)) if dtype in L.FLOATS else (lambda i: i)
    return elementwise_loops(L.Names(), out_shape(spec), lambda v: start + step(v[0]) * delta)


@register("GatherElements", normalize=axis_attr, dtypes=ALL_DTYPES)
def _lower_gather_elements(spec: KernelSpec) -> list[L.Stmt]:
    """out[i...] = data[i... with the axis index replaced by indices[i...]]."""
    axis, (data, indices) = spec.attrs["axis"], spec.inputs

    def value(v: list[L.Var]) -> L.Expr:
        index = _wrap_index(load("in1", indices, L.flat_index(indices.shape, v)), data.shape[axis])
        return load("in0", data, L.flat_index(data.shape, [index if a == axis else i for a, i in enumerate(v)]))

    return elementwise_loops(L.Names(), out_shape(spec), value)


def _gather_nd_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"batch_dims": int(ctx.node.attrs.get("batch_dims", 0))}


@register("GatherND", normalize=_gather_nd_attrs, dtypes=ALL_DTYPES)
def _lower_gather_nd(spec: KernelSpec) -> list[L.Stmt]:
    """out[b..., j..., s...] = data[b..., indices[b..., j..., :], s...]: each index tuple picks a slice of data."""
    batch, (data, indices) = spec.attrs["batch_dims"], spec.inputs
    depth = indices.shape[-1]
    tuple_rank = len(indices.shape) - 1

    def value(v: list[L.Var]) -> L.Expr:
        prefix = v[:tuple_rank]
        picked = [
            _wrap_index(load("in1", indices, L.flat_index(indices.shape, [*prefix, L.const(k)])), data.shape[batch + k])
            for k in range(depth)
        ]
        return load("in0", data, L.flat_index(data.shape, [*v[:batch], *picked, *v[tuple_rank:]]))

    return elementwise_loops(L.Names(), out_shape(spec), value)


# ---------------------------------------------------------------------------------------------- OneHot, EyeLike


def _one_hot_attrs(ctx: NodeContext) -> dict[str, Any]:
    return axis_attr(ctx, len(ctx.outputs[0].shape), default=-1)


@register("OneHot", normalize=_one_hot_attrs, data_inputs=(0, 2), dtypes=ALL_DTYPES)
def _lower_one_hot(spec: KernelSpec) -> list[L.Stmt]:
    """out[..., d, ...] = values[1] where d == indices[...] (negatives count from depth), else values[0]. The depth
    is the output's extent along `axis`, so it needs no constant."""
    axis, (indices, values), shape = spec.attrs["axis"], spec.inputs, out_shape(spec)
    depth = shape[axis]

    def value(v: list[L.Var]) -> L.Expr:
        index: L.Expr = load("in0", indices, L.flat_index(indices.shape, v[:axis] + v[axis + 1 :]))
        index = L.Cast(index, L.I64) if index.dtype != L.I64 else index
        index = L.select(L.compare("lt", index, 0), index + depth, index)
        return L.select(
            L.compare("eq", v[axis], index), load("in1", values, L.const(1)), load("in1", values, L.const(0))
        )

    return elementwise_loops(L.Names(), shape, value)


def _eye_like_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"k": int(ctx.node.attrs.get("k", 0))}


@register("EyeLike", normalize=_eye_like_attrs, data_inputs=(), dtypes=ALL_DTYPES)
def _lower_eye_like(spec: KernelSpec) -> list[L.Stmt]:
    """Ones on the k-th diagonal, zeros elsewhere, in the output's dtype (only the input's shape matters)."""
    dtype = value_dtype(spec.outputs[0])
    one, zero = typed_const(1, dtype), typed_const(0, dtype)
    return elementwise_loops(
        L.Names(), out_shape(spec), lambda v: L.select(L.compare("eq", v[1] - v[0], spec.attrs["k"]), one, zero)
    )


# ---------------------------------------------------------------------------------------------- Resize, Upsample
#
# Shapes are static and scales constant, so normalisation maps every output coordinate of every resized axis to
# the input with onnxruntime's own float32 arithmetic (numpy float32, step for step). Nearest rounding is
# discontinuous (recomputing it in the kernel under fast-math could pick the other neighbour at a tie), so its
# indices are fixed here: as integer steps (x * num + offset) // den where they follow them (integer up- and
# downsampling always do), else as a table that the kernel's prologue writes into its scratch buffer. Linear
# interpolation is continuous, so the kernel computes its coordinates from the affine map. Under
# tf_crop_and_resize, the output coordinates that map inside the input form an interval, compared as integers.

F32 = np.float32
RESIZE_MODES = ("nearest", "linear")


def _half_pixel(x: np.ndarray, scale: F32, size_out: int, size_in: int, roi: tuple[F32, F32]) -> np.ndarray:
    return (x + F32(0.5)) / scale - F32(0.5)


def _pytorch_half_pixel(x: np.ndarray, scale: F32, size_out: int, size_in: int, roi: tuple[F32, F32]) -> np.ndarray:
    return _half_pixel(x, scale, size_out, size_in, roi) if size_out > 1 else np.zeros_like(x)


def _align_corners(x: np.ndarray, scale: F32, size_out: int, size_in: int, roi: tuple[F32, F32]) -> np.ndarray:
    return np.zeros_like(x) if size_out == 1 else x * F32(size_in - 1) / F32(size_out - 1)


def _tf_crop_and_resize(x: np.ndarray, scale: F32, size_out: int, size_in: int, roi: tuple[F32, F32]) -> np.ndarray:
    start, end = roi
    if size_out > 1:
        return start * F32(size_in - 1) + (x * (end - start) * F32(size_in - 1)) / F32(size_out - 1)
    return np.full_like(x, F32(0.5 * float(start + end) * float(size_in - 1)))


def _half_pixel_symmetric(x: np.ndarray, scale: F32, size_out: int, size_in: int, roi: tuple[F32, F32]) -> np.ndarray:
    adjustment = F32(size_out) / (scale * F32(size_in))
    offset = F32(size_in) / F32(2) * (F32(1) - adjustment)
    return (float(offset) + (x.astype(np.float64) + 0.5) / float(scale) - 0.5).astype(F32)


# onnxruntime's GetOriginalCoordinateFromResizedCoordinate: output coordinate -> input coordinate, in float32.
COORDINATE_TRANSFORMS = {
    "half_pixel": _half_pixel,
    "asymmetric": lambda x, scale, size_out, size_in, roi: x / scale,
    "pytorch_half_pixel": _pytorch_half_pixel,
    "tf_half_pixel_for_nn": lambda x, scale, size_out, size_in, roi: (x + F32(0.5)) / scale,
    "align_corners": _align_corners,
    "tf_crop_and_resize": _tf_crop_and_resize,
    "half_pixel_symmetric": _half_pixel_symmetric,
}


def _round_half_away(x: np.ndarray) -> np.ndarray:
    """C's round(): halves away from zero (in float64, where x + 0.5 is exact for any float32 x)."""
    wide = x.astype(np.float64)
    return np.sign(wide) * np.floor(np.abs(wide) + 0.5)


# onnxruntime's GetNearestPixelFromOriginal: (coordinate, downsampling) -> index; "simple" is Resize-10/Upsample's.
NEAREST_MODES = {
    "simple": lambda x, down: np.ceil(x) if down else np.trunc(x),
    "round_prefer_floor": lambda x, down: np.where(x == np.trunc(x) + F32(0.5), np.floor(x), _round_half_away(x)),
    "round_prefer_ceil": lambda x, down: _round_half_away(x),
    "floor": lambda x, down: np.floor(x),
    "ceil": lambda x, down: np.ceil(x),
}


def _nearest_sampling(coords: np.ndarray, size_in: int, nearest: str, downsampling: bool) -> dict[str, list]:
    """The source index of every output coordinate, as integer steps where they fit, else as a table."""
    index = np.clip(NEAREST_MODES[nearest](coords, downsampling), 0, size_in - 1).astype(np.int64)
    steps = _floor_steps(index, size_in)
    return {"index": index.tolist()} if steps is None else {"steps": steps}


def _floor_steps(index: np.ndarray, size_in: int) -> list[int] | None:
    """[num, offset, den] with index[i] == (i * num + offset) // den for every i, num/den being size_in/size_out
    in lowest terms, when some offset fits."""
    size_out = len(index)
    common = math.gcd(size_in, size_out)
    num, den = size_in // common, size_out // common
    i = np.arange(size_out)
    offset = int(np.max(index * den - i * num))
    return [num, offset, den] if np.array_equal((i * num + offset) // den, index) else None


def _linear_sampling(coords: np.ndarray) -> dict[str, list]:
    """The affine map coordinate = i * slope + origin (continuous interpolation tolerates its float rounding)."""
    slope = float(coords[-1] - coords[0]) / (len(coords) - 1) if len(coords) > 1 else 0.0
    return {"affine": [slope, float(coords[0])]}


def _inside(coords: np.ndarray, size_in: int) -> list[int]:
    """[first, last]: the output coordinates that map inside the input (an interval, the map being monotonic)."""
    inside = np.flatnonzero((coords >= 0) & (coords <= size_in - 1))
    return [int(inside[0]), int(inside[-1])] if inside.size else [0, -1]


def _resize_options(ctx: NodeContext) -> dict[str, Any]:
    """mode, coordinate transform and nearest rounding as the node's opset defines them."""
    a = ctx.node.attrs
    mode = a.get("mode", "nearest")
    if mode not in RESIZE_MODES:
        raise ctx.unsupported(f"mode {mode!r} is not supported (nearest and linear are)")
    if int(a.get("antialias", 0)):
        raise ctx.unsupported("antialias=1 is not supported")
    if mode == "linear" and ctx.input_info(0).dtype != "float32":
        raise ctx.unsupported(f"linear mode on {ctx.input_info(0).dtype} data is not supported (float32 is)")
    modern = ctx.node.op_type == "Resize" and ctx.opset >= 11
    transform = a.get("coordinate_transformation_mode", "half_pixel") if modern else "asymmetric"
    nearest = a.get("nearest_mode", "round_prefer_floor") if modern else "simple"
    if transform not in COORDINATE_TRANSFORMS:
        raise ctx.unsupported(f"coordinate_transformation_mode {transform!r} is not supported")
    if nearest not in NEAREST_MODES:
        raise ctx.unsupported(f"nearest_mode {nearest!r} is not supported")
    return {"mode": mode, "transform": transform, "nearest": nearest}


def _per_axis(values: np.ndarray, axes: list[int], rank: int, default: float) -> list[float]:
    """Values given for `axes` (opset 18) spread over every axis, `default` elsewhere."""
    spread = [default] * rank
    for axis, value in zip(axes, values):
        spread[axis] = value
    return spread


def _resize_scales(ctx: NodeContext, axes: list[int]) -> list[F32]:
    """The float32 scale of every axis as onnxruntime uses it: given, or out/in from sizes after
    keep_aspect_ratio_policy."""
    shape, rank = ctx.input_info(0).shape, len(ctx.input_info(0).shape)
    scales_index = 2 if ctx.node.op_type == "Resize" and ctx.opset >= 11 else 1
    scales = ctx.constant(scales_index)
    if scales is not None and scales.size:
        return [F32(s) for s in _per_axis(scales.astype(F32), axes, rank, 1.0)]
    sizes = ctx.constant(3)
    if sizes is None:
        raise ctx.unsupported("Resize needs scales or sizes")
    wanted = _per_axis(sizes, axes, rank, 0)
    ratios = [F32(wanted[i]) / F32(shape[i]) if i in axes else F32(1) for i in range(rank)]
    policy = ctx.node.attrs.get("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise ctx.unsupported(f"keep_aspect_ratio_policy {policy!r} is not supported")
    if policy == "stretch":
        return ratios
    chosen = (min if policy == "not_larger" else max)(ratios[i] for i in axes)
    return [chosen if i in axes else F32(1) for i in range(rank)]


def _resize_roi(ctx: NodeContext, axes: list[int], rank: int) -> list[tuple[F32, F32]]:
    """(start, end) of every axis: the roi input under tf_crop_and_resize, else (0, 1) (unused)."""
    roi = ctx.constant(1)
    if roi is None or not roi.size:
        raise ctx.unsupported("tf_crop_and_resize needs a constant roi")
    half = len(roi) // 2
    starts, ends = (
        _per_axis(roi[:half].astype(F32), axes, rank, 0.0),
        _per_axis(roi[half:].astype(F32), axes, rank, 1.0),
    )
    return [(F32(start), F32(end)) for start, end in zip(starts, ends)]


def _resize_attrs(ctx: NodeContext) -> dict[str, Any]:
    """The sampling of every axis that changes (an axis of scale 1 maps each index to itself, as in onnxruntime),
    and, under tf_crop_and_resize, the extrapolation value and each axis's inside interval."""
    options = _resize_options(ctx)
    in_shape, out = ctx.input_info(0).shape, ctx.outputs[0].shape
    rank = len(in_shape)
    axes = [axis_in_range(ctx, axis, rank) for axis in ctx.node.attrs.get("axes", range(rank))]
    scales = _resize_scales(ctx, axes)
    crop = options["transform"] == "tf_crop_and_resize"
    roi = _resize_roi(ctx, axes, rank) if crop else [(F32(0), F32(1))] * rank
    samplings = []
    for axis in (axis for axis in range(rank) if scales[axis] != F32(1)):
        coords = COORDINATE_TRANSFORMS[options["transform"]](
            np.arange(out[axis], dtype=F32), scales[axis], out[axis], in_shape[axis], roi[axis]
        )
        sampling = (
            _nearest_sampling(coords, in_shape[axis], options["nearest"], bool(scales[axis] < 1))
            if options["mode"] == "nearest"
            else _linear_sampling(coords)
        )
        samplings.append({"axis": axis, **sampling, **({"inside": _inside(coords, in_shape[axis])} if crop else {})})
    extrapolation = float(ctx.node.attrs.get("extrapolation_value", 0.0)) if crop else None
    return {"mode": options["mode"], "axes": samplings, "extrapolation": extrapolation}


def _table_offsets(spec: KernelSpec) -> list[int]:
    """Where each axis's index table starts in the scratch buffer (-1 for axes without one)."""
    offsets, at = [], 0
    for sampling in spec.attrs["axes"]:
        offsets.append(at if "index" in sampling else -1)
        at += len(sampling.get("index", ()))
    return offsets


def _resize_scratch(spec: KernelSpec) -> int:
    return sum(len(sampling.get("index", ())) for sampling in spec.attrs["axes"])


def _write_tables(spec: KernelSpec) -> list[L.Stmt]:
    """The prologue: every index table stored into scratch (as floats, exact below 2**24)."""
    return [
        L.Store("scratch", L.const(at + i), L.const(float(index)))
        for sampling, at in zip(spec.attrs["axes"], _table_offsets(spec))
        if at >= 0
        for i, index in enumerate(sampling["index"])
    ]


def _nearest_index(sampling: dict[str, Any], at: int, v: L.Expr) -> L.Expr:
    """The source index of output coordinate v: (v * num + offset) // den (kept non-negative for the truncating
    division), or the table entry."""
    if at >= 0:
        return L.Cast(L.Load("scratch", at + v), L.I64)
    num, offset, den = sampling["steps"]
    lift = -(offset // den) if offset < 0 else 0
    return (v * num + (offset + lift * den)) / den - lift


def _nearest_value(spec: KernelSpec, v: list[L.Var]) -> L.Expr:
    x = spec.inputs[0]
    indices: list[L.Expr] = list(v)
    for sampling, at in zip(spec.attrs["axes"], _table_offsets(spec)):
        indices[sampling["axis"]] = _nearest_index(sampling, at, v[sampling["axis"]])
    return load("in0", x, L.flat_index(x.shape, indices))


def _linear_neighbours(sampling: dict[str, Any], size: int, v: L.Expr) -> tuple[L.Expr, L.Expr, L.Expr]:
    """(low index, high index, high's weight) at output coordinate v: the coordinate clamped into the input, its
    floor and the next index (clamped), the fraction between them (onnxruntime's SetupUpsampleBilinear)."""
    slope, origin = sampling["affine"]
    coord = L.minimum(L.maximum(L.to_float(v) * slope + origin, 0.0), float(size - 1))
    low = L.Cast(coord, L.I64)
    return low, L.minimum(low + 1, size - 1), coord - L.to_float(low)


def _linear_value(spec: KernelSpec, v: list[L.Var]) -> L.Expr:
    """The weighted sum over the 2**k corners of the k resized axes' neighbours."""
    x, samplings = spec.inputs[0], spec.attrs["axes"]
    neighbours = [_linear_neighbours(s, x.shape[s["axis"]], v[s["axis"]]) for s in samplings]
    total: L.Expr | None = None
    for corner in range(2 ** len(samplings)):
        indices: list[L.Expr] = list(v)
        weight: L.Expr | None = None
        for bit, (sampling, (low, high, fraction)) in enumerate(zip(samplings, neighbours)):
            upper = (corner >> bit) & 1
            indices[sampling["axis"]] = high if upper else low
            factor = fraction if upper else 1.0 - fraction
            weight = factor if weight is None else weight * factor
        term: L.Expr = load("in0", x, L.flat_index(x.shape, indices))
        term = term if weight is None else term * weight
        total = term if total is None else total + term
    assert total is not None, "2 ** k corners: at least one"
    return total


RESAMPLERS = {"nearest": _nearest_value, "linear": _linear_value}


def _outside(spec: KernelSpec, v: list[L.Var]) -> L.Expr | None:
    """Whether output element v maps outside the input on some axis (tf_crop_and_resize), or None if it can't."""
    outside: L.Expr | None = None
    for sampling in spec.attrs["axes"]:
        first, last = sampling.get("inside", (0, spec.outputs[0].shape[sampling["axis"]] - 1))
        if first == 0 and last == spec.outputs[0].shape[sampling["axis"]] - 1:
            continue
        i = v[sampling["axis"]]
        here = L.binary("or", L.compare("lt", i, first), L.compare("gt", i, last))
        outside = here if outside is None else L.binary("or", outside, here)
    return outside


def _lower_resize(spec: KernelSpec) -> list[L.Stmt]:
    def value(v: list[L.Var]) -> L.Expr:
        sampled = RESAMPLERS[spec.attrs["mode"]](spec, v)
        outside = _outside(spec, v)
        if outside is None:
            return sampled
        return L.select(outside, typed_const(spec.attrs["extrapolation"], sampled.dtype), sampled)

    return _write_tables(spec) + elementwise_loops(L.Names(), out_shape(spec), value)


register("Resize", "Upsample", normalize=_resize_attrs, data_inputs=(0,), scratch_floats=_resize_scratch)(_lower_resize)
