"""The sliding window that Conv and the pools share: their window attributes (auto_pad resolved, a 1-D window as a
plane of height 1), the 2-D Window a kernel reads, the zero- or -inf-padded planes in scratch whose taps a CPU kernel
reads at unit stride, the taps of a window of any rank, and registration by spatial rank."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import NodeContext, out_shape, register, shape_of

DEPTHWISE_CHANNEL_BLOCK = 8
"""Channels of a depthwise conv (or a MaxPool) that run one after the other on one padded plane in scratch
(conv._depthwise, pool._pool_planes) on a CPU: the plane is rewritten while it is still in cache, instead of each
channel filling a fresh one (MobileNetV2's 112x112 stride-2 depthwise conv wrote 5 MB of scratch beside its 4.8 MB
input)."""


SPATIAL_RANKS = (1, 2, 3)
"""The spatial ranks of the inputs a Conv or a pool takes: 1-D runs as 2-D (_as_plane), 3-D as a loop nest."""


def spatial_attrs(ctx: NodeContext, kernel_shape: list[int]) -> dict[str, Any]:
    """kernel_shape, strides, dilations and explicit pads (all begins, then all ends: [top, left, bottom, right] in
    2-D), with auto_pad resolved. A 1-D window comes out as a 2-D one of height 1 (_as_plane)."""
    x = ctx.inputs[0]
    rank = 0 if x is None else len(x.shape) - 2
    if rank not in SPATIAL_RANKS:
        raise ctx.unsupported("only 1-D, 2-D and 3-D spatial inputs (N, C, D...) are supported")
    assert x is not None  # no input is rank 0, refused above
    attrs, ones = ctx.node.attrs, [1] * rank
    strides = list(attrs.get("strides", ones))
    dilations = list(attrs.get("dilations", ones))
    pads = list(attrs.get("pads", [0] * 2 * rank))
    if any(len(v) != rank for v in (kernel_shape, strides, dilations)) or len(pads) != 2 * rank:
        raise ctx.unsupported(f"kernel_shape, strides, dilations and pads must cover the {rank} spatial axes")
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(x.shape[2:], kernel_shape, strides, dilations, upper=auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = [0] * 2 * rank
    window = {"kernel_shape": list(kernel_shape), "strides": strides, "dilations": dilations, "pads": pads}
    return _as_plane(window) if rank == 1 else window


def _as_plane(window: dict[str, list[int]]) -> dict[str, list[int]]:
    """A 1-D window as a 2-D one of height 1: an (N, C, W) tensor lies in memory as (N, C, 1, W) (and a 1-D conv's
    weight (M, C, k) as (M, C, 1, k)), so the 2-D kernels, their fast paths included, run it unchanged."""
    begin, end = window["pads"]
    return {
        "kernel_shape": [1, *window["kernel_shape"]],
        "strides": [1, *window["strides"]],
        "dilations": [1, *window["dilations"]],
        "pads": [0, begin, 0, end],
    }


def nchw(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """An (N, C, H, W) tensor's shape, or an (N, C, W) one's as (N, C, 1, W): the planes a 1-D window (_as_plane)
    slides over."""
    n, c, *plane = shape
    h, w = (1, *plane) if len(plane) == 1 else plane
    return n, c, h, w


def _spatial_rank(spec: KernelSpec) -> int:
    """The spatial axes a conv or pool kernel slides its window over: 2 (planes, 1-D ones included) or 3."""
    return len(spec.attrs["kernel_shape"])


def same_pads(spatial, kernel, strides, dilations, *, upper: bool) -> list[int]:
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


@dataclass(frozen=True)
class Window:
    """How a 2-D sliding window (a conv's kernel, a pool's) reads an NCHW input plane: the input and output plane
    sizes, the kernel's, strides, dilations and the top and left pads (the bottom and right ones only shape the
    output)."""

    height: int
    width: int
    out_height: int
    out_width: int
    kernel_height: int
    kernel_width: int
    stride_height: int
    stride_width: int
    dilation_height: int
    dilation_width: int
    pad_top: int
    pad_left: int

    @property
    def in_pixels(self) -> int:
        return self.height * self.width

    @property
    def out_pixels(self) -> int:
        return self.out_height * self.out_width


def window(spec: KernelSpec) -> Window:
    """The window of a conv or pool kernel, from its shapes and normalised attributes (see spatial_attrs)."""
    a = spec.attrs
    *_, h, w = nchw(shape_of(spec))
    *_, ho, wo = nchw(out_shape(spec))
    kh, kw = a["kernel_shape"]
    return Window(
        height=h,
        width=w,
        out_height=ho,
        out_width=wo,
        kernel_height=kh,
        kernel_width=kw,
        stride_height=a["strides"][0],
        stride_width=a["strides"][1],
        dilation_height=a["dilations"][0],
        dilation_width=a["dilations"][1],
        pad_top=a["pads"][0],
        pad_left=a["pads"][1],
    )


def fill_scratch(names: L.Names, start: L.Expr, begin: int, end: int, value: float | L.Expr = 0.0) -> list[L.Stmt]:
    """scratch[start + ow] = value for ow in [begin, end) (a constant, or an expression: an integer conv's zero
    point)."""
    if end <= begin:
        return []
    x = names.var("x")
    fill = value if isinstance(value, L.Expr) else L.const(value)
    return [L.Loop(x, end - begin, [L.Store("scratch", start + x + begin, fill)], True)]


def tap_input(geo: Window, oh: L.Expr, ow: L.Expr, r: L.Expr, s: L.Expr) -> tuple[L.Expr, L.Expr]:
    """Whether output (oh, ow)'s tap (r, s) reads inside the input plane, and the index in the plane it reads,
    clamped inside (so that a load guarded by the first never reads past the plane)."""
    ih = oh * geo.stride_height - geo.pad_top + r * geo.dilation_height
    iw = ow * geo.stride_width - geo.pad_left + s * geo.dilation_width
    inside = L.logical_and(
        L.compare("ge", ih, 0), L.compare("lt", ih, geo.height), L.compare("ge", iw, 0), L.compare("lt", iw, geo.width)
    )
    at = L.minimum(L.maximum(ih, 0), geo.height - 1) * geo.width + L.minimum(L.maximum(iw, 0), geo.width - 1)
    return inside, at


def tap_columns(geo: Window, s: int) -> tuple[int, int]:
    """[lo, hi): the output columns whose input column for tap column `s` lies inside the input."""
    shift = geo.pad_left - s * geo.dilation_width  # ow * sw - shift is the input column
    lo = max(0, -(-shift // geo.stride_width))
    hi = min(geo.out_width, (geo.width - 1 + shift) // geo.stride_width + 1)
    return min(lo, geo.out_width), max(min(lo, geo.out_width), hi)


def copy_to_scratch(
    names: L.Names,
    start: L.Expr,
    source: L.Expr,
    stride: int,
    begin: int,
    end: int,
    value_dtype: str = L.F32,
    scratch_dtype: str | None = None,
) -> list[L.Stmt]:
    """scratch[start + ow] = in0[source + ow * stride] for ow in [begin, end) (in0's values of `value_dtype`: I64
    for bytes; converted to `scratch_dtype` where given: a byte MaxPool's float planes)."""
    if end <= begin:
        return []
    x = names.var("x")
    ow = x + begin
    value: L.Expr = L.Load("in0", source + ow * stride, value_dtype)
    copy = L.Store("scratch", start + ow, value if scratch_dtype is None else L.Cast(value, scratch_dtype))
    return [L.Loop(x, end - begin, [copy], True)]


def padded_plane(geo: Window) -> tuple[int, int]:
    """Rows and columns of the input window every output reads, padding included."""
    return (
        (geo.out_height - 1) * geo.stride_height + (geo.kernel_height - 1) * geo.dilation_height + 1,
        (geo.out_width - 1) * geo.stride_width + (geo.kernel_width - 1) * geo.dilation_width + 1,
    )


def cpu_channel_block(channels: int) -> int:
    """DEPTHWISE_CHANNEL_BLOCK, or the largest power of two below it that divides `channels`."""
    size = DEPTHWISE_CHANNEL_BLOCK
    while channels % size:
        size //= 2
    return size


def _phase_length(geo: Window, phases: int) -> int:
    """Floats of one phase's run of a padded row split into `phases` (pad_plane)."""
    return -(-padded_plane(geo)[1] // phases)


def phased_plane_floats(geo: Window) -> int:
    """Floats of a depthwise conv's padded plane, its rows split into stride_width phases."""
    return padded_plane(geo)[0] * geo.stride_width * _phase_length(geo, geo.stride_width)


def pad_plane(
    names: L.Names,
    geo: Window,
    plane: L.Expr,
    source: L.Expr,
    phases: int = 1,
    fill: float = 0.0,
    value_dtype: str = L.F32,
) -> list[L.Stmt]:
    """The padded input window at scratch[plane] (float32): padded column j = q * phases + p of row i goes to
    scratch[plane + i * phases * length + p * length + q] (length = columns / phases, rounded up), holding
    x[source + (i - ph) * w + (j - pw)], `fill` outside the input. With one phase the rows are plain; with a
    window's horizontal stride as phases, each tap reads its outputs' columns at unit stride. x's values are of
    `value_dtype` (I64: bytes, converted to float32)."""
    i = names.var("i")
    rows, columns = padded_plane(geo)
    length = _phase_length(geo, phases)
    ih = i - geo.pad_top
    inside = L.logical_and(L.compare("ge", ih, 0), L.compare("lt", ih, geo.height))
    outside = L.binary("or", L.compare("lt", ih, 0), L.compare("ge", ih, geo.height))
    row: list[L.Stmt] = []
    zeros: list[L.Stmt] = []
    for phase in range(phases):
        start, count = plane + i * (phases * length) + phase * length, -(-(columns - phase) // phases)
        lo = min(count, max(0, -(-(geo.pad_left - phase) // phases)))
        hi = max(lo, min(count, (geo.width - 1 + geo.pad_left - phase) // phases + 1))
        first = source + ih * geo.width + (phase - geo.pad_left)
        row += (
            fill_scratch(names, start, 0, lo, fill)
            + copy_to_scratch(names, start, first, phases, lo, hi, value_dtype, None if value_dtype == L.F32 else L.F32)
            + fill_scratch(names, start, hi, count, fill)
        )
        zeros += fill_scratch(names, start, 0, count, fill)
    return [L.Loop(i, rows, [L.If(inside, row), L.If(outside, zeros)])]


def phased_tap(geo: Window, plane: L.Expr, oh: L.Var, ow: L.Var, r: L.Var, s: int) -> L.Expr:
    """Tap (r, s) of output (oh, ow) in a phased padded plane (pad_plane with the stride's phases): its phase's
    run, at ow + a constant."""
    phases, length = geo.stride_width, _phase_length(geo, geo.stride_width)
    row = plane + (oh * geo.stride_height + r * geo.dilation_height) * (phases * length)
    column = s * geo.dilation_width
    return L.Load("scratch", row + (column % phases) * length + ow + column // phases)


def window_tap(a: dict[str, Any], sizes: list[int], outs: list[L.Var], taps: list[L.Var]) -> tuple[L.Expr, L.Expr]:
    """(whether window tap `taps` of output `outs` lies inside the input of `sizes`, and its flat index there,
    clamped inside) for a window of any rank: kernel_shape, strides, dilations and begin pads in `a`."""
    coords = tap_coordinates(a, outs, taps)
    clamped = [L.minimum(L.maximum(i, 0), size - 1) for i, size in zip(coords, sizes)]
    return within(coords, [0] * len(sizes), sizes), L.flat_index(tuple(sizes), clamped)


def tap_coordinates(a: dict[str, Any], outs: list[L.Var], taps: list[L.Var]) -> list[L.Expr]:
    """The input coordinates of window tap `taps` of output `outs`, the begin pads not yet added back."""
    return [o * s - pad + k * d for o, k, s, d, pad in zip(outs, taps, a["strides"], a["dilations"], a["pads"])]


def within(coords: list[L.Expr], lows: list[int], highs: list[int]) -> L.Expr:
    """Whether lows[i] <= coords[i] < highs[i] on every axis."""
    return L.logical_and(
        *(L.logical_and(L.compare("ge", i, low), L.compare("lt", i, high)) for i, low, high in zip(coords, lows, highs))
    )


@dataclass(frozen=True)
class WindowLowering:
    """How a Conv or a pool lowers for one spatial rank (_spatial_rank): its kernel and the scratch floats it uses."""

    lower: Callable[[KernelSpec], list[L.Stmt]]
    scratch: Callable[[KernelSpec], int]


def no_scratch(spec: KernelSpec) -> int:
    return 0


def register_by_rank(ops: tuple[str, ...], lowerings: dict[int, WindowLowering], **options: Any) -> None:
    """Register `ops` with a lowering and a scratch size each picked by the kernel's spatial rank."""
    register(*ops, scratch_floats=lambda spec: lowerings[_spatial_rank(spec)].scratch(spec), **options)(
        lambda spec: lowerings[_spatial_rank(spec)].lower(spec)
    )
