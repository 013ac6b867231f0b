"""Neural-network ops: convolution, transposed convolution and matrix products (through the IR's Gemm primitive),
pools, normalisations, the softmax family."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from farm.errors import BuildError
from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.reduce import ReduceLayout, absolute, axis_view, over_rows
from farm.ops.registry import NodeContext, activate, axis_in_range, out_shape, prod, register, shape_of

NEG_INF = -3.4028234663852886e38
COLUMN_ALIGNMENT = 16
"""Floats per cache line (64 bytes): im2col rows start at multiples of it, and output planes that fill their vectors
of this many floats this badly run transposed (_pixels_as_rows)."""
SMALL_PLANE_WASTE = 1.15
"""Padded-to-vectors / actual pixels above which a conv runs pixels as rows: 7x7 (1.31) and 5x5 (1.28) do, 14x14
(1.06) and 28x28 (1.0) don't."""
COLUMN_BAND_BYTES = 1 << 19
"""The most bytes of im2col matrix a CPU conv builds at once (_column_bands): a quarter of a 2 MB L2, leaving room
for the weights the GEMM streams beside it."""
IMPLICIT_MIN_DEPTH = 64
"""The fewest taps (k) for which a CPU conv runs as an implicit GEMM (_implicit): each tile's scattered stores into
the NCHW output must be worth its k loop. ResNet's 7x7 stem (147 taps) went from 97 to 173 GFLOP/s implicit,
MobileNetV2's 3x3 stem on 3 channels (27 taps) from 140 to 84, so it keeps im2col."""
BANDED_WEIGHT_BYTES = 1 << 20
"""The most bytes of weights a banded conv reads once per band (half of a 2 MB L2, where they stay)."""
TRANSPOSED_OPERAND_BYTES = 1 << 20
"""The most bytes of column matrix plus one panel of weights for which a conv runs pixels as rows: half of a
2 MB L2, so that both stay in cache while the panel passes over the matrix."""
WEIGHT_PANEL_COLUMNS = 48
"""Columns of a weight panel in that estimate (the AVX-512 default tile's 3 vectors of 16)."""
DEPTHWISE_CHANNEL_BLOCK = 8
"""Channels of a depthwise conv (or a MaxPool) that run one after the other on one padded plane in scratch
(_depthwise, _max_pool_planes) on a CPU: the plane is rewritten while it is still in cache, instead of each channel
filling a fresh one (MobileNetV2's 112x112 stride-2 depthwise conv wrote 5 MB of scratch beside its 4.8 MB input)."""


SPATIAL_RANKS = (1, 2, 3)
"""The spatial ranks of the inputs a Conv or a pool takes: 1-D runs as 2-D (_as_plane), 3-D as a loop nest."""


def _spatial_attrs(ctx: NodeContext, kernel_shape: list[int]) -> dict[str, Any]:
    """kernel_shape, strides, dilations and explicit pads (all begins, then all ends: [top, left, bottom, right] in
    2-D), with auto_pad resolved. A 1-D window comes out as a 2-D one of height 1 (_as_plane)."""
    x = ctx.inputs[0]
    rank = 0 if x is None else len(x.shape) - 2
    if rank not in SPATIAL_RANKS:
        raise ctx.unsupported("only 1-D, 2-D and 3-D spatial inputs (N, C, D...) are supported")
    attrs, ones = ctx.node.attrs, [1] * rank
    strides = list(attrs.get("strides", ones))
    dilations = list(attrs.get("dilations", ones))
    pads = list(attrs.get("pads", [0] * 2 * rank))
    if any(len(v) != rank for v in (kernel_shape, strides, dilations)) or len(pads) != 2 * rank:
        raise ctx.unsupported(f"kernel_shape, strides, dilations and pads must cover the {rank} spatial axes")
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(x.shape[2:], kernel_shape, strides, dilations, upper=auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = [0] * 2 * rank
    window = {"kernel_shape": list(kernel_shape), "strides": strides, "dilations": dilations, "pads": pads}
    return _as_plane(window) if rank == 1 else window


def _as_plane(window: dict[str, list[int]]) -> dict[str, list[int]]:
    """A 1-D window as a 2-D one of height 1: an (N, C, W) tensor lies in memory as (N, C, 1, W) (and a 1-D conv's
    weight (M, C, k) as (M, C, 1, k)), so the 2-D kernels, their fast paths included, run it unchanged."""
    begin, end = window["pads"]
    return {"kernel_shape": [1, *window["kernel_shape"]], "strides": [1, *window["strides"]],
            "dilations": [1, *window["dilations"]], "pads": [0, begin, 0, end]}


def _nchw(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """An (N, C, H, W) tensor's shape, or an (N, C, W) one's as (N, C, 1, W): the planes a 1-D window (_as_plane)
    slides over."""
    n, c, *plane = shape
    h, w = (1, *plane) if len(plane) == 1 else plane
    return n, c, h, w


def _spatial_rank(spec: KernelSpec) -> int:
    """The spatial axes a conv or pool kernel slides its window over: 2 (planes, 1-D ones included) or 3."""
    return len(spec.attrs["kernel_shape"])


def _same_pads(spatial, kernel, strides, dilations, *, upper: bool) -> list[int]:
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


def _conv_attrs(ctx: NodeContext) -> dict[str, Any]:
    group = _checked_group(ctx)
    weight = ctx.inputs[1]
    kernel = [int(k) for k in ctx.node.attrs.get("kernel_shape", weight.shape[2:])]
    if tuple(kernel) != tuple(weight.shape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the weight's {list(weight.shape[2:])}")
    attrs = _spatial_attrs(ctx, kernel)
    attrs["group"] = group
    attrs["constant_weight"] = ctx.node.inputs[1] in ctx.constants  # then the build may pre-pack it
    if ctx.node.residual:
        attrs["residual"] = True
    return attrs


def _checked_group(ctx: NodeContext) -> int:
    """`group` must split the input channels into groups that each match the weight's input channels, and the
    output channels evenly (else the kernel would read past its buffers or divide by zero)."""
    group = int(ctx.node.attrs.get("group", 1))
    x, weight = ctx.inputs[0], ctx.inputs[1]
    if group < 1:
        raise ctx.unsupported(f"attribute 'group' is {group}; it must be at least 1")
    if x is None or weight is None or len(weight.shape) != len(x.shape):
        raise ctx.unsupported("the weight must be a tensor [M, C/group, k...] of the input's rank")
    if x.shape[1] != weight.shape[1] * group or weight.shape[0] % group:
        raise ctx.unsupported(
            f"input {ctx.node.inputs[0]!r} has {x.shape[1]} channels but weight {ctx.node.inputs[1]!r} of shape "
            f"{list(weight.shape)} with group {group} expects {weight.shape[1] * group} (and M divisible by group)")
    return group


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


def _window(spec: KernelSpec) -> Window:
    """The window of a conv or pool kernel, from its shapes and normalised attributes (see _spatial_attrs)."""
    a = spec.attrs
    *_, h, w = _nchw(shape_of(spec))
    *_, ho, wo = _nchw(out_shape(spec))
    kh, kw = a["kernel_shape"]
    return Window(height=h, width=w, out_height=ho, out_width=wo, kernel_height=kh, kernel_width=kw,
                  stride_height=a["strides"][0], stride_width=a["strides"][1], dilation_height=a["dilations"][0],
                  dilation_width=a["dilations"][1], pad_top=a["pads"][0], pad_left=a["pads"][1])


@dataclass(frozen=True)
class GroupedChannels:
    """The channels of a grouped (transposed) convolution: each of `groups` groups maps in_channels_per_group
    input channels to out_channels_per_group output channels, for each of `batch` images."""

    batch: int
    in_channels: int
    out_channels: int
    groups: int

    @property
    def in_channels_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_channels_per_group(self) -> int:
        return self.out_channels // self.groups


def _channels(spec: KernelSpec) -> GroupedChannels:
    n, c, *_ = shape_of(spec)
    return GroupedChannels(batch=n, in_channels=c, out_channels=out_shape(spec)[1], groups=spec.attrs["group"])


@dataclass(frozen=True)
class ConvGeometry(Window, GroupedChannels):
    """The sizes a 2-D Conv lowers with: its window and its channels."""

    @property
    def column_rows(self) -> int:
        """Rows of a group's im2col matrix (one per input channel and kernel tap): the GEMM's k."""
        return self.in_channels_per_group * self.kernel_height * self.kernel_width

    @property
    def column_stride(self) -> int:
        """Floats from one im2col row to the next: the output pixels rounded up to a multiple of COLUMN_ALIGNMENT,
        so that every row starts on a cache line and the GEMM's vector loads never straddle two (14x14 outputs,
        196 floats a row, read three lines in four split: light ResNet-50's 3x3 convs at 14x14 156 -> 184 GFLOP/s
        on one Xeon core)."""
        return _aligned(self.out_pixels)


def _conv_geometry(spec: KernelSpec) -> ConvGeometry:
    return ConvGeometry(**asdict(_channels(spec)), **asdict(_window(spec)))


def _pixels_as_rows(spec: KernelSpec, geo: ConvGeometry) -> bool:
    """Whether the conv's GEMM runs transposed: out^T (pixels x channels) = columns^T @ W^T, the pixels as the
    micro-kernel's rows and the output channels as its vector columns. Chosen when the output plane fills its
    vectors badly (7x7 = 49 pixels fill 3 vectors of 16 and 1 float of a fourth; 512 channels fill 32), the
    weights are constant (they are then packed as a transposed B) and the column matrix with one panel of weights
    fits TRANSPOSED_OPERAND_BYTES: each panel of weights passes over all of the column matrix, which must stay in
    cache (light ResNet-50 on one Xeon core: 7x7 pointwise convs 146-161 -> 171-174 GFLOP/s transposed, but its
    7x7 3x3 convs, whose 4608 x 64 column matrix does not fit beside a panel, 147 -> 95)."""
    waste = _aligned(geo.out_pixels) / geo.out_pixels
    channel_waste = _aligned(geo.out_channels_per_group) / geo.out_channels_per_group
    stride = geo.out_pixels if _is_pointwise(geo) else geo.column_stride
    operand_bytes = geo.column_rows * (stride + WEIGHT_PANEL_COLUMNS) * 4
    return (bool(spec.attrs.get("constant_weight")) and waste > SMALL_PLANE_WASTE and channel_waste < waste
            and operand_bytes <= TRANSPOSED_OPERAND_BYTES)


def _is_pointwise(geo: ConvGeometry) -> bool:
    """A 1x1, stride-1, unpadded conv reads its input as the GEMM's B matrix directly: no im2col."""
    window = (geo.kernel_height, geo.kernel_width, geo.stride_height, geo.stride_width, geo.pad_top, geo.pad_left)
    return window == (1, 1, 1, 1, 0, 0)


def _is_depthwise(geo: GroupedChannels) -> bool:
    return geo.in_channels_per_group == 1 and geo.out_channels_per_group == 1


def _conv_plane_scratch(spec: KernelSpec) -> int:
    geo = _conv_geometry(spec)
    if _is_depthwise(geo):
        return geo.batch * (geo.out_channels // _channel_block(spec, geo.out_channels)) * _phased_plane_floats(geo)
    if _is_pointwise(geo):
        return 0
    padded = geo.in_channels_per_group * prod(_padded_plane(geo))
    return max(padded, _banded_scratch(geo, _band_rows(geo)))


def _input_at(geo: Window, base: L.Expr, oh: L.Expr, ow: L.Expr, r: L.ExprLike, s: L.ExprLike,
              fill: float) -> L.Expr:
    """x[base + ih*W + iw] for the window tap (r, s) of output (oh, ow), or `fill` in the padding."""
    ih = oh * geo.stride_height - geo.pad_top + L.wrap(r, L.I64) * geo.dilation_height
    iw = ow * geo.stride_width - geo.pad_left + L.wrap(s, L.I64) * geo.dilation_width
    inside = L.logical_and(L.compare("ge", ih, 0), L.compare("lt", ih, geo.height),
                           L.compare("ge", iw, 0), L.compare("lt", iw, geo.width))
    clamped = L.minimum(L.maximum(ih, 0), geo.height - 1) * geo.width + L.minimum(L.maximum(iw, 0), geo.width - 1)
    return L.select(inside, L.Load("in0", base + clamped), fill)


@dataclass(frozen=True)
class ColumnBand:
    """The output rows [first_row, first_row + rows) whose im2col columns go to scratch[start ...], each im2col row
    `stride` floats from the next: the whole plane (first row 0, the plane's column_stride), or one band of a
    conv whose column matrix is built and consumed band by band (_banded_columns)."""

    first_row: L.Expr
    rows: int
    start: L.Expr
    stride: int


def _im2col(names: L.Names, geo: ConvGeometry, x_base: L.Expr, band: ColumnBand) -> list[L.Stmt]:
    """scratch[band.start + (c*kh*kw + r*kw + s) * band.stride + y*Wo + ow] = x[c, ih, iw] (0 in the padding) for
    the band's output rows y (oh = band.first_row + y), one group.

    One work-item per (c, y) writes its row of every tap (r, s). The tap columns s are unrolled (not the rows:
    an 11x11 kernel unrolled both ways took LLVM minutes), so each one's columns inside the input are a constant
    range: there a plain copy (vectorised, no guard), zeros on either side, and
    zeros for the whole row where the tap's input row is padding. (With the guard on every element the copy ran at
    5 GB/s and took more time than the GEMM it feeds in small convs.)"""
    c, y, r = names.var("c"), names.var("y"), names.var("r")
    ih = (band.first_row + y) * geo.stride_height - geo.pad_top + r * geo.dilation_height
    inside = L.logical_and(L.compare("ge", ih, 0), L.compare("lt", ih, geo.height))
    outside = L.binary("or", L.compare("lt", ih, 0), L.compare("ge", ih, geo.height))
    taps: list[L.Stmt] = []
    for s in range(geo.kernel_width):
        start = band.start + ((c * geo.kernel_height + r) * geo.kernel_width + s) * band.stride + y * geo.out_width
        lo, hi = _tap_columns(geo, s)
        source = x_base + c * geo.in_pixels + ih * geo.width + (s * geo.dilation_width - geo.pad_left)
        row = (_fill(names, start, 0, lo) + _copy(names, start, source, geo.stride_width, lo, hi)
               + _fill(names, start, hi, geo.out_width))
        taps += [L.If(inside, row), L.If(outside, _fill(names, start, 0, geo.out_width))]
    rows = L.Loop(y, band.rows, [L.Loop(r, geo.kernel_height, taps)], True)
    return [L.Loop(c, geo.in_channels_per_group, [rows], True)]


def _tap_columns(geo: Window, s: int) -> tuple[int, int]:
    """[lo, hi): the output columns whose input column for tap column `s` lies inside the input."""
    shift = geo.pad_left - s * geo.dilation_width  # ow * sw - shift is the input column
    lo = max(0, -(-shift // geo.stride_width))
    hi = min(geo.out_width, (geo.width - 1 + shift) // geo.stride_width + 1)
    return min(lo, geo.out_width), max(min(lo, geo.out_width), hi)


def _fill(names: L.Names, start: L.Expr, begin: int, end: int, value: float = 0.0) -> list[L.Stmt]:
    """scratch[start + ow] = value for ow in [begin, end)."""
    if end <= begin:
        return []
    x = names.var("x")
    return [L.Loop(x, end - begin, [L.Store("scratch", start + x + begin, L.const(value))], True)]


def _copy(names: L.Names, start: L.Expr, source: L.Expr, stride: int, begin: int, end: int) -> list[L.Stmt]:
    """scratch[start + ow] = in0[source + ow * stride] for ow in [begin, end)."""
    if end <= begin:
        return []
    x = names.var("x")
    ow = x + begin
    return [L.Loop(x, end - begin, [L.Store("scratch", start + ow, L.Load("in0", source + ow * stride))], True)]


def _bias_activation_epilogue(names: L.Names, spec: KernelSpec, rows: int, cols: int, batches: int,
                              bias: str | None) -> list[L.Stmt]:
    """out[b, m, p] = act(out[b, m, p] + bias[m]) after a Gemm wrote the raw products."""
    if bias is None and spec.activation is None:
        return []
    b, m, p = names.var("b"), names.var("m"), names.var("p")
    index = (b * rows + m) * cols + p
    value: L.Expr = L.Load("out0", index)
    if bias is not None:
        value = value + L.Load(bias, m)
    store = L.Store("out0", index, activate(value, spec.activation))
    return [L.Loop(b, batches, [L.Loop(m, rows, [L.Loop(p, cols, [store], True)], True)], True)]


def _padded_plane(geo: Window) -> tuple[int, int]:
    """Rows and columns of the input window every output reads, padding included."""
    return ((geo.out_height - 1) * geo.stride_height + (geo.kernel_height - 1) * geo.dilation_height + 1,
            (geo.out_width - 1) * geo.stride_width + (geo.kernel_width - 1) * geo.dilation_width + 1)


def _depthwise(names: L.Names, spec: KernelSpec, geo: ConvGeometry) -> list[L.Stmt]:
    """Direct depthwise conv, one work-item per (batch, block of _channel_block channels): each channel's input
    window is first copied into a zero-padded plane in scratch (rows of zeros, copy, zeros), its columns split by
    the stride's phases (_pad_plane), then every output sums its taps with plain loads at unit stride along the
    row, no padding guard (vectorised). Guarding every tap instead ran the small maps of mobilenetv2 at 5-11
    GFLOP/s; reading a stride-2 conv's taps two floats apart kept MobileNetV2's stride-2 depthwise convs at 8-16
    GFLOP/s. The channels of a block share one plane (DEPTHWISE_CHANNEL_BLOCK)."""
    n, block, index = names.var("n"), names.var("cb"), names.var("c")
    size = _channel_block(spec, geo.out_channels)
    ch = block * size + index
    plane = (n * (geo.out_channels // size) + block) * _phased_plane_floats(geo)
    source = (n * geo.in_channels + ch) * geo.in_pixels
    per_channel = (_pad_plane(names, geo, plane, source, geo.stride_width)
                   + _depthwise_outputs(names, spec, geo, plane, n, ch))
    return [L.Loop(n, geo.batch, [L.Loop(block, geo.out_channels // size, [L.Loop(index, size, per_channel)],
                                         True)], True)]


def _channel_block(spec: KernelSpec, channels: int) -> int:
    """Channels per block of a depthwise conv on a CPU (_cpu_channel_block); one elsewhere: a GPU runs a work-item
    per block, and needs them all. The memory plan sizes scratch from the unspecialised spec, so a depthwise conv
    gets the most planes, those a GPU needs."""
    return _cpu_channel_block(channels) if spec.for_cpu else 1


def _cpu_channel_block(channels: int) -> int:
    """DEPTHWISE_CHANNEL_BLOCK, or the largest power of two below it that divides `channels`."""
    size = DEPTHWISE_CHANNEL_BLOCK
    while channels % size:
        size //= 2
    return size


def _phase_length(geo: Window, phases: int) -> int:
    """Floats of one phase's run of a padded row split into `phases` (_pad_plane)."""
    return -(-_padded_plane(geo)[1] // phases)


def _phased_plane_floats(geo: Window) -> int:
    """Floats of a depthwise conv's padded plane, its rows split into stride_width phases."""
    return _padded_plane(geo)[0] * geo.stride_width * _phase_length(geo, geo.stride_width)


def _pad_plane(names: L.Names, geo: Window, plane: L.Expr, source: L.Expr, phases: int = 1,
               fill: float = 0.0) -> list[L.Stmt]:
    """The padded input window at scratch[plane]: padded column j = q * phases + p of row i goes to
    scratch[plane + i * phases * length + p * length + q] (length = columns / phases, rounded up), holding
    x[source + (i - ph) * w + (j - pw)], `fill` outside the input. With one phase the rows are plain; with a
    window's horizontal stride as phases, each tap reads its outputs' columns at unit stride."""
    i = names.var("i")
    rows, columns = _padded_plane(geo)
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
        row += (_fill(names, start, 0, lo, fill) + _copy(names, start, first, phases, lo, hi)
                + _fill(names, start, hi, count, fill))
        zeros += _fill(names, start, 0, count, fill)
    return [L.Loop(i, rows, [L.If(inside, row), L.If(outside, zeros)])]


def _depthwise_outputs(names: L.Names, spec: KernelSpec, geo: ConvGeometry, plane: L.Expr, n: L.Var,
                       ch: L.Expr) -> list[L.Stmt]:
    """out[n, ch, oh, ow] = bias + sum over taps of the phased padded plane times the channel's weights (the tap
    columns unrolled: each reads its phase's run at ow + a constant)."""
    oh, ow, r, acc = names.var("y"), names.var("x"), names.var("r"), names.local()
    taps: list[L.Stmt] = []
    for s in range(geo.kernel_width):
        weight = L.Load("in1", (ch * geo.kernel_height + r) * geo.kernel_width + s)
        taps.append(L.Assign(acc, acc + _phased_tap(geo, plane, oh, ow, r, s) * weight))
    init = L.Load("in2", ch) if len(spec.inputs) > 2 else L.const(0.0)
    out_index = ((n * geo.out_channels + ch) * geo.out_height + oh) * geo.out_width + ow
    inner = [L.Assign(acc, init), L.Loop(r, geo.kernel_height, taps),
             L.Store("out0", out_index, activate(acc, spec.activation))]
    return [L.Loop(oh, geo.out_height, [L.Loop(ow, geo.out_width, inner)])]


def _phased_tap(geo: Window, plane: L.Expr, oh: L.Var, ow: L.Var, r: L.Var, s: int) -> L.Expr:
    """Tap (r, s) of output (oh, ow) in a phased padded plane (_pad_plane with the stride's phases): its phase's
    run, at ow + a constant."""
    phases, length = geo.stride_width, _phase_length(geo, geo.stride_width)
    row = plane + (oh * geo.stride_height + r * geo.dilation_height) * (phases * length)
    column = s * geo.dilation_width
    return L.Load("scratch", row + (column % phases) * length + ow + column // phases)


def _lower_conv_planes(spec: KernelSpec) -> list[L.Stmt]:
    """A 2-D (or 1-D: _as_plane) Conv as im2col + GEMM per (batch, group): out[m, p] = W[m, k] @ col[k, p] (or its transpose, see
    _pixels_as_rows; or band by band, see _column_bands), bias, residual and activation applied as the GEMM stores
    its tiles."""
    names, geo = L.Names(), _conv_geometry(spec)
    residual = _conv_residual(spec)
    if _is_depthwise(geo):
        return _depthwise(names, spec, geo)
    n, g = names.var("n"), names.var("g")
    x_base = (n * geo.in_channels + g * geo.in_channels_per_group) * geo.in_pixels
    out_offset = (n * geo.out_channels + g * geo.out_channels_per_group) * geo.out_pixels
    bias = "in2" if len(spec.inputs) > 2 + (spec.attrs.get("residual") is True) else None
    epilogue = functools.partial(_gemm_epilogue, spec, bias, g * geo.out_channels_per_group, residual=residual)
    if _implicit(spec, geo):
        per_group = _implicit_gemm(spec, geo, names, g, x_base, out_offset, epilogue)
    elif _is_pointwise(geo) or _pixels_as_rows(spec, geo):
        per_group = _whole_plane(spec, geo, names, g, x_base, out_offset, epilogue)
    else:
        band_rows = _column_bands(spec, geo)
        per_group = [stmt for band in _bands(geo, band_rows, names) for stmt in
                     _band(spec, geo, names, g, x_base, out_offset, epilogue, band)]
    return [L.Loop(n, geo.batch, [L.Loop(g, geo.groups, per_group)])]


def _implicit(spec: KernelSpec, geo: ConvGeometry) -> bool:
    """Whether a conv runs as an implicit GEMM on a CPU (_implicit_gemm): a kernel wider than 1x1 (a strided 1x1
    conv reads each input value once, so its whole padded input passes again for every panel of weights: light
    ResNet-50's 256 -> 512 one at 56 -> 28 ran at 90 GFLOP/s instead of 160-179 through im2col), constant weights
    (packed as a transposed B), at least IMPLICIT_MIN_DEPTH taps, and a CPU spec (OpenCL's renderer reads A as a
    matrix)."""
    return (spec.for_cpu and geo.kernel_height * geo.kernel_width > 1
            and geo.column_rows >= IMPLICIT_MIN_DEPTH and bool(spec.attrs.get("constant_weight")))


def _implicit_gemm(spec: KernelSpec, geo: ConvGeometry, names: L.Names, g: L.Var, x_base: L.Expr,
                   out_offset: L.Expr, epilogue: Callable[..., L.GemmEpilogue | None]) -> list[L.Stmt]:
    """out^T (pixels x channels) = the zero-padded input read as its im2col matrix (loopir.ImplicitColumns) @ W^T
    (packed as a transposed B): the input is copied once into a padded plane per channel (its own size), and no
    column matrix (kh x kw times the input) is written and read back. Direct convolution's data flow, through
    the GEMM micro-kernel: ResNet-18's 3x3 convs on one Xeon core went from 85-161 to 112-207 GFLOP/s (the model
    from 1.52x to 1.21x onnxruntime's time)."""
    rows, columns = _padded_plane(geo)
    plane = rows * columns
    c = names.var("c")
    pad = [L.Loop(c, geo.in_channels_per_group,
                  _pad_plane(names, geo, c * plane, x_base + c * geo.in_pixels), True)]
    window = L.ImplicitColumns(geo.out_width, geo.stride_height * columns, geo.stride_width, plane, geo.kernel_height,
                               geo.kernel_width, geo.dilation_height * columns, geo.dilation_width)
    group_out, kdim = geo.out_channels_per_group, geo.column_rows
    gemm = L.Gemm(a="scratch", a_offset=L.const(0), lda=0, b="in1", b_offset=g * (group_out * kdim), ldb=kdim,
                  c="out0", c_offset=out_offset, ldc=geo.out_pixels, m=geo.out_pixels, n=group_out, k=kdim,
                  b_panels=True, b_transposed=True, c_transposed=True, a_window=window,
                  epilogue=epilogue(bias_on_columns=True, residual_offset=out_offset))
    return [*pad, gemm]


def _whole_plane(spec: KernelSpec, geo: ConvGeometry, names: L.Names, g: L.Var, x_base: L.Expr,
                 out_offset: L.Expr, epilogue: Callable[..., L.GemmEpilogue | None]) -> list[L.Stmt]:
    """A pointwise conv's GEMM on its input, or a small plane's transposed GEMM on its whole column matrix."""
    if _is_pointwise(geo):
        columns, stmts = ("in0", x_base, geo.out_pixels), []
    else:
        columns = ("scratch", L.const(0), geo.column_stride)
        stmts = _im2col(names, geo, x_base, ColumnBand(L.const(0), geo.out_height, L.const(0), geo.column_stride))
    transposed = _pixels_as_rows(spec, geo)
    gemm = CONV_GEMMS[transposed](spec, geo, g, columns, out_offset, geo.out_pixels)
    gemm.epilogue = epilogue(bias_on_columns=transposed, residual_offset=out_offset)
    return [*stmts, gemm]


def _band(spec: KernelSpec, geo: ConvGeometry, names: L.Names, g: L.Var, x_base: L.Expr, out_offset: L.Expr,
          epilogue: Callable[..., L.GemmEpilogue | None], band: tuple[L.Var | None, ColumnBand]) -> list[L.Stmt]:
    """im2col of one band of output rows, then the GEMM of all output channels by the band's pixels; a parallel
    loop over the bands when `band` carries its index variable."""
    index, columns = band
    pixels = columns.rows * geo.out_width
    offset = out_offset + columns.first_row * geo.out_width
    gemm = _channels_by_pixels(spec, geo, g, ("scratch", columns.start, columns.stride), offset, pixels)
    gemm.epilogue = epilogue(residual_offset=offset)
    body = [*_im2col(names, geo, x_base, columns), gemm]
    return body if index is None else [L.Loop(index, _band_count(geo, columns.rows), body, True)]


def _column_bands(spec: KernelSpec, geo: ConvGeometry) -> int:
    """Output rows per band of a conv whose column matrix is built and consumed band by band on a CPU
    (_band_rows); the whole plane (out_height) for any other spec (OpenCL's GEMM launch wants the whole matrix)."""
    return _band_rows(geo) if spec.for_cpu else geo.out_height


def _band_rows(geo: ConvGeometry) -> int:
    """Output rows per band so that a band's columns are still in cache when the GEMM reads them
    (COLUMN_BAND_BYTES); the whole plane (out_height) when it fits, or when the weights are too big to be read
    again for every band (BANDED_WEIGHT_BYTES: ResNet-18's 7x7 convs, 9.4 MB of weights in three bands, ran at
    59 GFLOP/s instead of 85). Light ResNet-50's 56x56 3x3 convs wrote and re-read a 7.2 MB column matrix."""
    row_bytes = geo.column_rows * geo.out_width * 4
    weight_bytes = geo.out_channels_per_group * geo.column_rows * 4
    if geo.column_rows * geo.column_stride * 4 <= COLUMN_BAND_BYTES or weight_bytes > BANDED_WEIGHT_BYTES:
        return geo.out_height
    return max(1, min(geo.out_height, COLUMN_BAND_BYTES // row_bytes))


def _band_count(geo: ConvGeometry, rows: int) -> int:
    return geo.out_height // rows


def _bands(geo: ConvGeometry, rows: int, names: L.Names) -> list[tuple[L.Var | None, ColumnBand]]:
    """The bands of `rows` output rows (a parallel loop over the full ones, the band variable its index), then
    the rest; one band of every row when `rows` is the plane's height."""
    stride = _aligned(rows * geo.out_width)
    if rows >= geo.out_height:
        return [(None, ColumnBand(L.const(0), geo.out_height, L.const(0), geo.column_stride))]
    index, full = names.var("band"), _band_count(geo, rows)
    bands = [(index, ColumnBand(index * rows, rows, index * (geo.column_rows * stride), stride))]
    rest = geo.out_height - full * rows
    if rest:
        bands.append((None, ColumnBand(L.const(full * rows), rest, L.const(full * geo.column_rows * stride),
                                       _aligned(rest * geo.out_width))))
    return bands


def _aligned(floats: int) -> int:
    """`floats` rounded up to a whole number of cache lines (COLUMN_ALIGNMENT floats)."""
    return -(-floats // COLUMN_ALIGNMENT) * COLUMN_ALIGNMENT


def _banded_scratch(geo: ConvGeometry, rows: int) -> int:
    """Floats of scratch the bands of `rows` rows use (at least the whole plane's, so that the memory plan, made
    before the target is known, covers both forms)."""
    full = _band_count(geo, rows)
    rest = geo.out_height - full * rows
    banded = geo.column_rows * (full * _aligned(rows * geo.out_width) + (_aligned(rest * geo.out_width) if rest else 0))
    return max(banded, geo.column_rows * geo.column_stride)


RESIDUAL_IN_PLACE = "in_place"
"""A conv's `residual` attribute when its output buffer holds the residual as it starts (set by the planner's
_residuals_in_place, never by a model): it reads the residual where it writes."""


def _conv_residual(spec: KernelSpec) -> str | None:
    """Where a conv that absorbed a skip connection's Add (passes.fuse_residual_adds) finds the residual it adds
    to its output: its last input, which must have the output's shape, or its output itself (RESIDUAL_IN_PLACE).
    None without one. The attribute may come from a message, so its value and the shapes are checked."""
    residual = spec.attrs.get("residual")
    if residual is None or residual is False:
        return None
    if residual not in (True, RESIDUAL_IN_PLACE) or _is_depthwise(_channels(spec)):
        raise BuildError(f"Conv with a residual: the attribute is true or {RESIDUAL_IN_PLACE!r} (got {residual!r}), "
                         f"and the conv not depthwise")
    if residual == RESIDUAL_IN_PLACE:
        return "out0"
    if len(spec.inputs) < 3 or spec.inputs[-1] != spec.outputs[0]:
        raise BuildError(f"Conv with a residual: its last input {spec.inputs[-1]} must be laid out like its output "
                         f"{spec.outputs[0]}")
    return f"in{len(spec.inputs) - 1}"


def _gemm_epilogue(spec: KernelSpec, bias: str | None, bias_offset: L.Expr, bias_on_columns: bool = False,
                  residual: str | None = None, residual_offset: L.Expr | None = None) -> L.GemmEpilogue | None:
    """The GEMM epilogue of a kernel whose output is the GEMM's C: its bias (a buffer, None without), a residual
    laid out like C (which may be C itself: _conv_residual), and the spec's fused activation; None when there is
    none of them."""
    if bias is None and residual is None and spec.activation is None:
        return None
    activation = None if spec.activation is None else (spec.activation.kind, tuple(spec.activation.params))
    return L.GemmEpilogue(bias=bias, bias_offset=bias_offset if bias else None, bias_on_columns=bias_on_columns,
                          residual=residual, residual_offset=residual_offset if residual else None,
                          activation=activation)


def _channels_by_pixels(spec: KernelSpec, geo: ConvGeometry, g: L.Var, columns: tuple[str, L.Expr, int],
                        out_offset: L.Expr, pixels: int) -> L.Gemm:
    """out (channels x `pixels` from out_offset) = W (channels x taps, read in the micro-kernel's row panels when
    constant) @ the column matrix (taps x pixels)."""
    buffer, offset, stride = columns
    group_out, kdim = geo.out_channels_per_group, geo.column_rows
    return L.Gemm(a="in1", a_offset=g * (group_out * kdim), lda=kdim, b=buffer, b_offset=offset, ldb=stride,
                  c="out0", c_offset=out_offset, ldc=geo.out_pixels, m=group_out, n=pixels, k=kdim,
                  a_panels=bool(spec.attrs.get("constant_weight")))


def _pixels_by_channels(spec: KernelSpec, geo: ConvGeometry, g: L.Var, columns: tuple[str, L.Expr, int],
                        out_offset: L.Expr, pixels: int) -> L.Gemm:
    """out^T (pixels x channels) = the column matrix read transposed (pixels x taps) @ W^T (taps x channels,
    packed as a transposed constant B), stored transposed into out."""
    buffer, offset, stride = columns
    group_out, kdim = geo.out_channels_per_group, geo.column_rows
    return L.Gemm(a=buffer, a_offset=offset, lda=stride, b="in1", b_offset=g * (group_out * kdim), ldb=kdim,
                  c="out0", c_offset=out_offset, ldc=geo.out_pixels, m=pixels, n=group_out, k=kdim,
                  a_transposed=True, b_panels=True, b_transposed=True, c_transposed=True)


CONV_GEMMS = {False: _channels_by_pixels, True: _pixels_by_channels}
"""The conv's GEMM by _pixels_as_rows."""


def _lower_conv_volumes(spec: KernelSpec) -> list[L.Stmt]:
    """A 3-D Conv as a plain loop nest, a first correct version (no im2col, no GEMM): a work-item per output element
    sums its window over its group's input channels (taps in the padding read as 0), then adds the bias and the
    residual (read at the element it writes, so it may be the output itself) and applies the activation."""
    names, a, channels = L.Names(), spec.attrs, _channels(spec)
    _, _, *sizes = shape_of(spec)
    kernel, shape = tuple(a["kernel_shape"]), out_shape(spec)
    residual = _conv_residual(spec)
    has_bias = len(spec.inputs) > 2 + (a.get("residual") is True)
    acc, c = names.local(), names.var("c")

    def element(v: list[L.Var]) -> list[L.Stmt]:
        n, m, outs = v[0], v[1], v[2:]
        first = (m // channels.out_channels_per_group) * channels.in_channels_per_group
        plane = (n * channels.in_channels + first + c) * prod(sizes)
        weights = (m * channels.in_channels_per_group + c) * prod(kernel)

        def tap(taps: list[L.Var]) -> list[L.Stmt]:
            inside, at = _window_tap(a, sizes, outs, taps)
            x = L.select(inside, L.Load("in0", plane + at), 0.0)
            return [L.Assign(acc, acc + x * L.Load("in1", weights + L.flat_index(kernel, taps)))]

        window, _ = L.loop_nest(names, kernel, tap)
        value: L.Expr = acc + L.Load("in2", m) if has_bias else acc
        value = value if residual is None else value + L.Load(residual, L.flat_index(shape, v))
        return [L.Assign(acc, L.const(0.0)), L.Loop(c, channels.in_channels_per_group, window),
                L.Store("out0", L.flat_index(shape, v), activate(value, spec.activation))]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body


def _window_tap(a: dict[str, Any], sizes: list[int], outs: list[L.Var], taps: list[L.Var]) -> tuple[L.Expr, L.Expr]:
    """(whether window tap `taps` of output `outs` lies inside the input of `sizes`, and its flat index there,
    clamped inside) for a window of any rank: kernel_shape, strides, dilations and begin pads in `a`."""
    coords = _tap_coordinates(a, outs, taps)
    clamped = [L.minimum(L.maximum(i, 0), size - 1) for i, size in zip(coords, sizes)]
    return _within(coords, [0] * len(sizes), sizes), L.flat_index(tuple(sizes), clamped)


def _tap_coordinates(a: dict[str, Any], outs: list[L.Var], taps: list[L.Var]) -> list[L.Expr]:
    """The input coordinates of window tap `taps` of output `outs`, the begin pads not yet added back."""
    return [o * s - pad + k * d for o, k, s, d, pad in zip(outs, taps, a["strides"], a["dilations"], a["pads"])]


def _within(coords: list[L.Expr], lows: list[int], highs: list[int]) -> L.Expr:
    """Whether lows[i] <= coords[i] < highs[i] on every axis."""
    return L.logical_and(*(L.logical_and(L.compare("ge", i, low), L.compare("lt", i, high))
                           for i, low, high in zip(coords, lows, highs)))


@dataclass(frozen=True)
class WindowLowering:
    """How a Conv or a pool lowers for one spatial rank (_spatial_rank): its kernel and the scratch floats it uses."""

    lower: Callable[[KernelSpec], list[L.Stmt]]
    scratch: Callable[[KernelSpec], int]


def _no_scratch(spec: KernelSpec) -> int:
    return 0


def register_by_rank(ops: tuple[str, ...], lowerings: dict[int, WindowLowering], **options: Any) -> None:
    """Register `ops` with a lowering and a scratch size each picked by the kernel's spatial rank."""
    register(*ops, scratch_floats=lambda spec: lowerings[_spatial_rank(spec)].scratch(spec), **options)(
        lambda spec: lowerings[_spatial_rank(spec)].lower(spec))


CONV_LOWERINGS = {2: WindowLowering(_lower_conv_planes, _conv_plane_scratch),
                  3: WindowLowering(_lower_conv_volumes, _no_scratch)}
"""Conv by spatial rank: planes (1-D ones as planes of height 1) through the GEMM paths, volumes as a loop nest."""


register_by_rank(("Conv",), CONV_LOWERINGS, normalize=_conv_attrs)


def _conv_transpose_attrs(ctx: NodeContext) -> dict[str, Any]:
    """kernel_shape, strides, dilations, group and the begin pad of each spatial axis (all the kernel needs besides
    the output shape; output_padding and end pads only shape the output)."""
    x, a = ctx.inputs[0], ctx.node.attrs
    spatial = len(x.shape) - 2
    if spatial < 1:
        raise ctx.unsupported("ConvTranspose needs at least one spatial axis (N, C, D...)")
    ones = [1] * spatial
    kernel = [int(k) for k in a.get("kernel_shape", ctx.inputs[1].shape[2:])]
    strides, dilations = list(a.get("strides", ones)), list(a.get("dilations", ones))
    return {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": int(a.get("group", 1)),
            "pads": _transpose_pad_begins(ctx, kernel, strides, dilations)}


def _transpose_pad_begins(ctx: NodeContext, kernel: list[int], strides: list[int], dilations: list[int]) -> list[int]:
    """Begin pads: from `pads`, or, for output_shape or SAME auto_pad, from the total padding that yields the target
    size, split as ONNX says (the odd one at the end for SAME_UPPER, at the begin otherwise)."""
    a, sizes = ctx.node.attrs, ctx.inputs[0].shape[2:]
    auto_pad = a.get("auto_pad", "NOTSET")
    if "output_shape" not in a and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return [0] * len(sizes) if auto_pad == "VALID" else list(a.get("pads", [0] * 2 * len(sizes)))[:len(sizes)]
    targets = list(a["output_shape"])[-len(sizes):] if "output_shape" in a else [n * s for n, s in zip(sizes, strides)]
    output_padding = list(a.get("output_padding", [0] * len(sizes)))
    begins = []
    for n, k, s, d, extra, target in zip(sizes, kernel, strides, dilations, output_padding, targets):
        total = s * (n - 1) + extra + (k - 1) * d + 1 - target
        begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    return begins


@dataclass(frozen=True)
class ConvTransposeGeometry(GroupedChannels):
    """The sizes a ConvTranspose lowers with: per group, W^T is (column_rows, in_channels_per_group) and the column
    buffer (column_rows, in_pixels), column_rows being out_channels_per_group times the `taps` of the kernel."""

    in_sizes: list[int]
    out_sizes: list[int]
    taps: int

    @property
    def in_pixels(self) -> int:
        return prod(self.in_sizes)

    @property
    def column_rows(self) -> int:
        return self.out_channels_per_group * self.taps

    @property
    def column_start(self) -> int:
        """Where the column buffer starts in the scratch: after every group's W^T."""
        return self.groups * self.column_rows * self.in_channels_per_group


def _conv_transpose_geometry(spec: KernelSpec) -> ConvTransposeGeometry:
    _, _, *sizes = shape_of(spec)
    _, _, *out_sizes = out_shape(spec)
    return ConvTransposeGeometry(**asdict(_channels(spec)), in_sizes=sizes, out_sizes=out_sizes,
                                 taps=prod(spec.attrs["kernel_shape"]))


def _conv_transpose_scratch(spec: KernelSpec) -> int:
    geo = _conv_transpose_geometry(spec)
    return geo.column_start + geo.column_rows * geo.in_pixels


def _unflatten(index: L.Expr, shape: tuple[int, ...]) -> list[L.Expr]:
    """The row-major coordinates of flat `index` in `shape` (divisions by constants, once per element)."""
    coords: list[L.Expr] = []
    for position, extent in enumerate(reversed(shape)):
        coords.append(index if position == len(shape) - 1 else index % extent)
        index = index // extent
    return coords[::-1]


def _transpose_weights(names: L.Names, geo: ConvTransposeGeometry) -> list[L.Stmt]:
    """scratch[g, row, c] = W[g * in_channels_per_group + c, row] (row = output channel in group * K + tap): W^T
    per group, one work-item per weight."""
    source, group_in = names.var("w"), geo.in_channels_per_group
    group, channel, row = _unflatten(source, (geo.groups, group_in, geo.column_rows))
    store = L.Store("scratch", (group * geo.column_rows + row) * group_in + channel, L.Load("in1", source))
    return [L.Loop(source, geo.column_start, [store], parallel=True)]


def _taps_landing_on(o: L.Expr, j: L.Var, size: int, kernel: int, stride: int, dilation: int,
                     pad: int) -> tuple[int, L.Expr, list[L.Expr], L.Expr]:
    """Along one axis, the taps whose contribution lands on output coordinate `o`: tap k of input i lands on
    o = i * stride - pad + k * dilation. Returns (extent of the loop over j, the input coordinate at j (clamped
    inside the input), the conditions for a real contribution, the tap k at j). Where dilation is invertible modulo
    the stride, only the taps of the one residue class that can land are visited (k = k0 + j * stride), else every
    tap with a divisibility check."""
    shifted = o + pad
    if stride > 1 and math.gcd(dilation, stride) == 1:
        residue = shifted % stride if pad >= 0 else (shifted % stride + stride) % stride
        k = (residue * pow(dilation, -1, stride)) % stride + j * stride
        extent, conditions = -(-kernel // stride), [L.compare("lt", k, kernel)]
    else:
        k, extent, conditions = j, kernel, []
    t = shifted - k * dilation
    conditions += [L.compare("ge", t, 0), L.compare("lt", t, size * stride)]
    if stride > 1 and math.gcd(dilation, stride) != 1:
        conditions.append(L.compare("eq", t % stride, 0))
    return extent, L.minimum(L.maximum(t // stride, 0), size - 1), conditions, k


def _col2im(names: L.Names, spec: KernelSpec, geo: ConvTransposeGeometry, batch: L.Var, group: L.Var) -> list[L.Stmt]:
    """Each output pixel of the group sums the column entries of the taps that land on it: one work-item per
    pixel, so that no two write one element."""
    a = spec.attrs
    pixel, acc = names.var("p"), names.local()
    channel, *outs = _unflatten(pixel, (geo.out_channels_per_group, *geo.out_sizes))
    loop_vars = [names.var("j") for _ in a["kernel_shape"]]
    extents, inputs, taps, valid = [], [], [], []
    for o, j, size, kernel, stride, dilation, pad in zip(outs, loop_vars, geo.in_sizes, a["kernel_shape"],
                                                         a["strides"], a["dilations"], a["pads"]):
        extent, source, conditions, k = _taps_landing_on(o, j, size, kernel, stride, dilation, pad)
        extents.append(extent)
        inputs.append(source)
        taps.append(k)
        valid += conditions
    tap = L.flat_index(tuple(a["kernel_shape"]), taps)
    column = geo.column_start + (channel * geo.taps + tap) * geo.in_pixels + L.flat_index(tuple(geo.in_sizes), inputs)
    in_range = L.minimum(L.maximum(column, geo.column_start), geo.column_start + geo.column_rows * geo.in_pixels - 1)
    accumulate: list[L.Stmt] = [L.Assign(acc, acc + L.select(L.logical_and(*valid), L.Load("scratch", in_range), 0.0))]
    for j, extent in reversed(list(zip(loop_vars, extents))):
        accumulate = [L.Loop(j, extent, accumulate)]
    out_channel = group * geo.out_channels_per_group + channel
    init = L.Load("in2", out_channel) if len(spec.inputs) > 2 else L.const(0.0)
    out_index = (batch * geo.groups + group) * (geo.out_channels_per_group * prod(geo.out_sizes)) + pixel
    body = [L.Assign(acc, init), *accumulate, L.Store("out0", out_index, activate(acc, spec.activation))]
    return [L.Loop(pixel, geo.out_channels_per_group * prod(geo.out_sizes), body, parallel=True)]


@register("ConvTranspose", normalize=_conv_transpose_attrs, scratch_floats=_conv_transpose_scratch)
def _lower_conv_transpose(spec: KernelSpec) -> list[L.Stmt]:
    """ConvTranspose over any number of spatial axes, per (batch, group): a Gemm of W^T (column_rows,
    in_channels_per_group) by the input (in_channels_per_group, in_pixels) into a column buffer (column_rows,
    in_pixels) of every tap's contribution, then col2im with a work-item per output pixel gathering its
    contributions (no two work-items write one pixel), bias and activation included."""
    names, geo = L.Names(), _conv_transpose_geometry(spec)
    batch, group = names.var("n"), names.var("g")
    group_in, pixels = geo.in_channels_per_group, geo.in_pixels
    gemm = L.Gemm(a="scratch", a_offset=group * (geo.column_rows * group_in), lda=group_in,
                  b="in0", b_offset=(batch * geo.in_channels + group * group_in) * pixels, ldb=pixels,
                  c="scratch", c_offset=L.const(geo.column_start), ldc=pixels,
                  m=geo.column_rows, n=pixels, k=group_in)
    per_group = [gemm, *_col2im(names, spec, geo, batch, group)]
    return _transpose_weights(names, geo) + [L.Loop(batch, geo.batch, [L.Loop(group, geo.groups, per_group)])]


def _gemm_attrs(ctx: NodeContext) -> dict[str, Any]:
    a = ctx.node.attrs
    attrs = {"alpha": float(a.get("alpha", 1.0)), "beta": float(a.get("beta", 1.0)),
             "transA": int(a.get("transA", 0)), "transB": int(a.get("transB", 0))}
    _check_gemm_shapes(ctx, attrs["transA"], attrs["transB"])
    attrs["constant_weight"] = ctx.node.inputs[1] in ctx.constants  # then the build may pre-pack B
    return attrs


def _check_gemm_shapes(ctx: NodeContext, trans_a: int, trans_b: int) -> None:
    """op(A) is M x K, op(B) K x N and Y M x N: the kernel indexes A, B and Y by these, so a mismatch would read or
    write past a buffer (the frontend refuses what ONNX's strict inference finds; this holds whatever it found)."""
    a, b, y = ctx.inputs[0].shape, ctx.inputs[1].shape, ctx.outputs[0].shape
    if len(a) != 2 or len(b) != 2:
        raise ctx.unsupported(f"Gemm's A {list(a)} and B {list(b)} must be matrices")
    m, k = (a[1], a[0]) if trans_a else a
    k_b, n = (b[1], b[0]) if trans_b else b
    if k != k_b or y != (m, n):
        raise ctx.unsupported(f"Gemm of A {list(a)} (transA={trans_a}) and B {list(b)} (transB={trans_b}) can't give "
                              f"Y {list(y)}")


@register("Gemm", normalize=_gemm_attrs)
def _lower_gemm(spec: KernelSpec) -> list[L.Stmt]:
    """Y = alpha * op(A) @ op(B) + beta * C; the plain layout goes through the Gemm primitive, and so does a
    constant B stored transposed (transB, as exporters write linear layers): its pre-packing turns it."""
    names, a = L.Names(), spec.attrs
    rows, cols = out_shape(spec)
    depth = shape_of(spec, 0)[0 if a["transA"] else 1]
    constant_b = bool(a.get("constant_weight"))
    if not a["transA"] and (not a["transB"] or constant_b):
        ldb = depth if a["transB"] else cols
        body: list[L.Stmt] = [L.Gemm("in0", L.const(0), depth, "in1", L.const(0), ldb, "out0", L.const(0), cols,
                                     rows, cols, depth, b_panels=constant_b, b_transposed=bool(a["transB"]))]
        product = lambda m, n: L.Load("out0", m * cols + n)  # noqa: E731
    else:
        body, product = [], None
    m, n, k, acc = names.var("m"), names.var("n"), names.var("k"), names.local()
    value: L.Expr = acc if product is None else product(m, n)
    value = value * a["alpha"] if a["alpha"] != 1.0 else value
    if len(spec.inputs) > 2 and a["beta"] != 0.0:
        value = value + L.Load("in2", L.broadcast_index(shape_of(spec, 2), (rows, cols), [m, n])) * a["beta"]
    store = L.Store("out0", m * cols + n, activate(value, spec.activation))
    if product is not None:
        return body + [L.Loop(m, rows, [L.Loop(n, cols, [store], True)], True)]
    a_index = k * rows + m if a["transA"] else m * depth + k
    b_index = n * depth + k if a["transB"] else k * cols + n
    dot = L.Loop(k, depth, [L.Assign(acc, acc + L.Load("in0", a_index) * L.Load("in1", b_index))])
    return [L.Loop(m, rows, [L.Loop(n, cols, [L.Assign(acc, L.const(0.0)), dot, store], True)], True)]


def _matmul_attrs(ctx: NodeContext) -> dict[str, Any]:
    """MatMul has no attributes; the operands' inner dims must agree (the kernel indexes both by them)."""
    a, b = ctx.inputs[0].shape, ctx.inputs[1].shape
    if not a or not b or a[-1] != (b[0] if len(b) == 1 else b[-2]):
        raise ctx.unsupported(f"MatMul of {list(a)} and {list(b)}: the inner dims differ")
    return {"constant_weight": True} if ctx.node.inputs[1] in ctx.constants else {}  # then the build may pre-pack B


@register("MatMul", normalize=_matmul_attrs)
def _lower_matmul(spec: KernelSpec) -> list[L.Stmt]:
    """numpy matmul: batch dims broadcast, 1-D operands as in numpy. Float32 goes through Gemm (one per output
    batch, the batch loop parallel), integers through a loop nest."""
    names = L.Names()
    a_shape, b_shape, o_shape = shape_of(spec, 0), shape_of(spec, 1), out_shape(spec)
    a_mat = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b_mat = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    batch = tuple(o_shape[: len(o_shape) - (len(a_shape) > 1) - (len(b_shape) > 1)])
    if spec.inputs[0].dtype != "float32":
        return _matmul_loops(names, spec, a_mat, b_mat, batch)
    gemms = _matmul_gemms(names, a_mat, b_mat, batch, bool(spec.attrs.get("constant_weight")))
    return gemms + _bias_activation_epilogue(names, spec, 1, prod(o_shape), 1, None)


def _matmul_gemms(names: L.Names, a_mat: tuple[int, ...], b_mat: tuple[int, ...], batch: tuple[int, ...],
                  constant_b: bool) -> list[L.Stmt]:
    """One Gemm when B is shared by every batch and A holds them all (the batches are just more rows of A, as in
    a transformer's linear layers); else a Gemm per batch, in one flat parallel loop when each operand either
    holds every batch or is shared (attention's [B, H, S, D] products), a parallel loop nest when it broadcasts.
    A constant B (a layer's weights) is read pre-packed (b_panels); every Gemm's B offset is a whole k x n block."""
    rows, depth, cols = a_mat[-2], a_mat[-1], b_mat[-1]
    a_batch, b_batch, batches = a_mat[:-2], b_mat[:-2], prod(batch)
    if prod(b_batch) == 1 and prod(a_batch) == batches:
        return [L.Gemm("in0", L.const(0), depth, "in1", L.const(0), cols, "out0", L.const(0), cols,
                       batches * rows, cols, depth, b_panels=constant_b)]
    if prod(a_batch) in (1, batches) and prod(b_batch) in (1, batches):
        b = names.var("b")

        def offset(operand_batch: tuple[int, ...], size: int) -> L.Expr:
            return b * size if prod(operand_batch) == batches else L.const(0)

        gemm = L.Gemm("in0", offset(a_batch, rows * depth), depth, "in1", offset(b_batch, depth * cols), cols,
                      "out0", b * (rows * cols), cols, rows, cols, depth, b_panels=constant_b)
        return [L.Loop(b, batches, [gemm], parallel=True)]

    def gemm_at(v: list[L.Var]) -> list[L.Stmt]:
        a_off = L.broadcast_index(a_batch, batch, v) * (rows * depth)
        b_off = L.broadcast_index(b_batch, batch, v) * (depth * cols)
        c_off = L.flat_index(batch, v) * (rows * cols)
        return [L.Gemm("in0", a_off, depth, "in1", b_off, cols, "out0", c_off, cols, rows, cols, depth,
                       b_panels=constant_b)]

    body, _ = L.loop_nest(names, batch, gemm_at, parallel=True)
    return body


def _matmul_loops(names: L.Names, spec: KernelSpec, a_mat: tuple[int, ...], b_mat: tuple[int, ...],
                  batch: tuple[int, ...]) -> list[L.Stmt]:
    """Integer matmul: out[b, m, n] = sum over k of a[b, m, k] * b[b, k, n], batches broadcast."""
    rows, depth, cols = a_mat[-2], a_mat[-1], b_mat[-1]
    k, acc = names.var("k"), names.local("acc", L.I64)

    def element(v: list[L.Var]) -> list[L.Stmt]:
        bv, m, n = v[:-2], v[-2], v[-1]
        a_index = (L.broadcast_index(a_mat[:-2], batch, bv) * rows + m) * depth + k
        b_index = (L.broadcast_index(b_mat[:-2], batch, bv) * depth + k) * cols + n
        product = L.Load("in0", a_index, L.I64) * L.Load("in1", b_index, L.I64)
        out_index = L.flat_index((*batch, rows, cols), v)
        return [L.Assign(acc, L.const(0)), L.Loop(k, depth, [L.Assign(acc, acc + product)]),
                L.Store("out0", out_index, activate(acc, spec.activation))]

    body, _ = L.loop_nest(names, (*batch, rows, cols), element, parallel=True)
    return body


def _pool_attrs(ctx: NodeContext) -> dict[str, Any]:
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        raise ctx.unsupported("MaxPool's Indices output is not supported")
    attrs = _spatial_attrs(ctx, list(ctx.node.attrs["kernel_shape"]))
    attrs["count_include_pad"] = int(ctx.node.attrs.get("count_include_pad", 0))
    return attrs


def _lower_pool_planes(spec: KernelSpec) -> list[L.Stmt]:
    """Max or average over each window of a plane (or a 1-D input's row: _as_plane); the average divides by the
    window's count under count_include_pad. A MaxPool on a CPU reads padded planes instead (_max_pool_planes)."""
    if _pools_planes(spec):
        return _max_pool_planes(spec)
    names, a = L.Names(), spec.attrs
    n, c, h, w = _nchw(shape_of(spec))
    _, _, ho, wo = _nchw(out_shape(spec))
    geo = _window(spec)
    plane, y, x, r, s = names.var("p"), names.var("y"), names.var("x"), names.var("r"), names.var("s")
    acc, count = names.local(), names.local("cnt")
    is_max = spec.op == "MaxPool"
    tap = _input_at(geo, plane * (h * w), y, x, r, s, -math.inf if is_max else 0.0)
    update = [L.Assign(acc, L.maximum(acc, tap) if is_max else acc + tap)]
    if not is_max:
        update.append(L.Assign(count, count + L.select(_counted(geo, a, y, x, r, s), 1.0, 0.0)))
    kh, kw = a["kernel_shape"]
    result = acc if is_max else acc / count
    inner = [L.Assign(acc, L.const(-math.inf if is_max else 0.0)), L.Assign(count, L.const(0.0)),
             L.Loop(r, kh, [L.Loop(s, kw, update)]),
             L.Store("out0", (plane * ho + y) * wo + x, activate(result, spec.activation))]
    return [L.Loop(plane, n * c, [L.Loop(y, ho, [L.Loop(x, wo, inner, True)], True)], True)]


def _pools_planes(spec: KernelSpec) -> bool:
    """Whether the pool runs on padded planes (_max_pool_planes): a MaxPool for a CPU (padding an average would
    need its counts kept apart; a GPU wants a work-item per output)."""
    return spec.op == "MaxPool" and spec.for_cpu


def _pool_plane_scratch(spec: KernelSpec) -> int:
    """A MaxPool's padded planes on a CPU (_max_pool_planes): one per block of channels. Sized so for any spec (the
    memory plan reads the unspecialised one); the other renderers' MaxPool reads no scratch."""
    if spec.op != "MaxPool":
        return 0
    n, c, *_ = shape_of(spec)
    return n * c // _cpu_channel_block(n * c) * _phased_plane_floats(_window(spec))


def _max_pool_planes(spec: KernelSpec) -> list[L.Stmt]:
    """MaxPool as the depthwise conv runs (_depthwise): each channel's window copied into a plane padded with -inf,
    its columns split by the stride's phases, shared by a block of channels, then every output the max of its taps
    read at unit stride (vectorised). Guarding every tap and reading stride-2 taps two floats apart ran ResNet-50's
    3x3 stride-2 MaxPool in 0.29 ms, against onnxruntime's 0.16."""
    names, geo = L.Names(), _window(spec)
    n, c, h, w = _nchw(shape_of(spec))
    size = _cpu_channel_block(n * c)
    block, index = names.var("cb"), names.var("c")
    channel = block * size + index
    plane = block * _phased_plane_floats(geo)
    oh, ow, r, acc = names.var("y"), names.var("x"), names.var("r"), names.local()
    taps = [L.Assign(acc, L.maximum(acc, _phased_tap(geo, plane, oh, ow, r, s))) for s in range(geo.kernel_width)]
    out_index = (channel * geo.out_height + oh) * geo.out_width + ow
    outputs = [L.Loop(oh, geo.out_height, [L.Loop(ow, geo.out_width, [
        L.Assign(acc, L.const(-math.inf)), L.Loop(r, geo.kernel_height, taps),
        L.Store("out0", out_index, activate(acc, spec.activation))])])]
    per_channel = _pad_plane(names, geo, plane, channel * (h * w), geo.stride_width, -math.inf) + outputs
    return [L.Loop(block, n * c // size, [L.Loop(index, size, per_channel)], True)]


def _counted(geo: Window, attrs: dict, y: L.Var, x: L.Var, r: L.Var, s: L.Var) -> L.Expr:
    """Whether tap (r, s) counts towards the average: inside the input, or inside the pads under count_include_pad."""
    ih = y * geo.stride_height - geo.pad_top + r * geo.dilation_height
    iw = x * geo.stride_width - geo.pad_left + s * geo.dilation_width
    pads = attrs["pads"] if attrs["count_include_pad"] else [0, 0, 0, 0]
    return L.logical_and(L.compare("ge", ih, -pads[0]), L.compare("lt", ih, geo.height + pads[2]),
                         L.compare("ge", iw, -pads[1]), L.compare("lt", iw, geo.width + pads[3]))


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
            inside, at = _window_tap(a, sizes, v[1:], taps)
            value = L.select(inside, L.Load("in0", v[0] * prod(sizes) + at), -math.inf if is_max else 0.0)
            if is_max:
                return [L.Assign(acc, L.maximum(acc, value))]
            counted = L.select(_counted_tap(a, sizes, v[1:], taps), 1.0, 0.0)
            return [L.Assign(acc, acc + value), L.Assign(count, count + counted)]

        window, _ = L.loop_nest(names, tuple(a["kernel_shape"]), tap)
        result = acc if is_max else acc / count
        return [L.Assign(acc, L.const(-math.inf if is_max else 0.0)), L.Assign(count, L.const(0.0)), *window,
                L.Store("out0", L.flat_index(shape, v), activate(result, spec.activation))]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body


def _counted_tap(a: dict[str, Any], sizes: list[int], outs: list[L.Var], taps: list[L.Var]) -> L.Expr:
    """Whether a tap counts towards the average (any rank): inside the input, or inside the pads under
    count_include_pad."""
    rank = len(sizes)
    pads = a["pads"] if a["count_include_pad"] else [0] * 2 * rank
    highs = [size + end for size, end in zip(sizes, pads[rank:])]
    return _within(_tap_coordinates(a, outs, taps), [-begin for begin in pads[:rank]], highs)


POOL_LOWERINGS = {2: WindowLowering(_lower_pool_planes, _pool_plane_scratch),
                  3: WindowLowering(_lower_pool_volumes, _no_scratch)}
"""MaxPool and AveragePool by spatial rank: planes (1-D ones as planes of height 1), volumes as a loop nest."""


register_by_rank(("MaxPool", "AveragePool"), POOL_LOWERINGS, normalize=_pool_attrs, data_inputs=(0,))


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
        pads = _same_pads(x.shape[2:], kernel, strides, dilations, upper=auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = [0] * 2 * rank
    p = float(a.get("p", 2))
    if p != int(p) or p < 1:
        raise ctx.unsupported(f"p={p:g} is not supported (integer powers from 1 are)")
    return {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "p": int(p)}


def _lp_tap(names: L.Names, a: dict[str, Any], spatial: tuple[int, ...], plane: L.Expr, out_vars: list[L.Var],
            taps: list[L.Var]) -> tuple[list[L.Stmt], L.Expr]:
    """(statements, |x|^p) of one window tap, 0 where the tap lies in the padding (or past the input, under
    ceil_mode)."""
    inside, at = _window_tap(a, list(spatial), out_vars, taps)
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
        return [L.Assign(total, L.const(0.0)), *window,
                L.Store("out0", L.flat_index((n * c, *out_spatial), v), root)]

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
    return [L.Loop(p, planes, parallel=True, body=[
        L.Assign(acc, L.const(NEG_INF if is_max else 0.0)),
        L.Loop(i, size, [L.Assign(acc, L.maximum(acc, tap) if is_max else acc + tap)]),
        L.Store("out0", p, activate(result, spec.activation)),
    ])]


def _lrn_attrs(ctx: NodeContext) -> dict[str, Any]:
    """LRN's attributes; `size` (the channel window) must be at least 1, it divides alpha."""
    a = ctx.node.attrs
    if int(a.get("size", 0)) < 1:
        raise ctx.unsupported(f"attribute 'size' is {a.get('size')}; it must be at least 1")
    return {"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)), "beta": float(a.get("beta", 0.75)),
            "bias": float(a.get("bias", 1.0))}


def _lrn_window(size: int, channels: int) -> tuple[int, int]:
    """The channels before the centre and the loop's extent of LRN's window, the window clipped to the channels.

    ONNX sums channels max(0, c - floor((size-1)/2)) .. min(C-1, c + ceil((size-1)/2)); neither side reaches past
    C-1 channels, so clipping both to that gives the same sum for every c, and a hostile size (2**62) costs a loop
    of at most 2C-1 steps instead of a kernel that never ends. The divisor stays the model's `size`."""
    before = (size - 1) // 2
    after = size - 1 - before
    clipped_before, clipped_after = min(before, channels - 1), min(after, channels - 1)
    return clipped_before, clipped_before + clipped_after + 1


@register("LRN", normalize=_lrn_attrs)
def _lower_lrn(spec: KernelSpec) -> list[L.Stmt]:
    """y = x / (bias + alpha/size * sum of x^2 over the channel window)^beta."""
    names, a = L.Names(), spec.attrs
    n, c, h, w = shape_of(spec)
    hw = h * w
    b, ch, i, j, acc = names.var("b"), names.var("c"), names.var("i"), names.var("j"), names.local()
    before, window = _lrn_window(a["size"], c)
    other = ch - before + j
    inside = L.logical_and(L.compare("ge", other, 0), L.compare("lt", other, c))
    x_other = L.Load("in0", (b * c + L.minimum(L.maximum(other, 0), c - 1)) * hw + i)
    center = (b * c + ch) * hw + i
    base = a["bias"] + acc * (a["alpha"] / a["size"])
    value = L.Load("in0", center) * L.call("exp", L.call("log", base) * (-a["beta"]))
    return [L.Loop(b, n, [L.Loop(ch, c, [L.Loop(i, hw, [
        L.Assign(acc, L.const(0.0)),
        L.Loop(j, window, [L.Assign(acc, acc + L.select(inside, x_other * x_other, 0.0))]),
        L.Store("out0", center, activate(value, spec.activation)),
    ], True)], True)], True)]


def _bn_attrs(ctx: NodeContext) -> dict[str, Any]:
    if len([o for o in ctx.node.outputs if o]) > 1:
        raise ctx.unsupported("BatchNormalization in training mode (extra outputs) is not supported")
    return {"epsilon": float(ctx.node.attrs.get("epsilon", 1e-5))}


@register("BatchNormalization", normalize=_bn_attrs)
def _lower_batchnorm(spec: KernelSpec) -> list[L.Stmt]:
    """y = (x - mean[c]) * scale[c] / sqrt(var[c] + eps) + bias[c] (inference form)."""
    names, shape = L.Names(), shape_of(spec)
    n, c, inner = shape[0], shape[1], prod(shape[2:])
    b, ch, i = names.var("b"), names.var("c"), names.var("i")
    index = (b * c + ch) * inner + i
    scale = L.Load("in1", ch) / L.call("sqrt", L.Load("in4", ch) + spec.attrs["epsilon"])
    value = (L.Load("in0", index) - L.Load("in3", ch)) * scale + L.Load("in2", ch)
    store = L.Store("out0", index, activate(value, spec.activation))
    return [L.Loop(b, n, [L.Loop(ch, c, [L.Loop(i, inner, [store], True)], True)], True)]


def _softmax_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Softmax as (outer, length, inner): before opset 13 it covers every axis from `axis` on, later just `axis`."""
    shape = ctx.inputs[0].shape
    legacy = ctx.opset < 13
    axis = axis_in_range(ctx, ctx.node.attrs.get("axis", 1 if legacy else -1), len(shape))
    length = prod(shape[axis:]) if legacy else shape[axis]
    inner = 1 if legacy else prod(shape[axis + 1:])
    return {"outer": prod(shape[:axis]), "length": length, "inner": inner}


def _along(a: dict[str, Any], o: L.Expr, t: L.Expr) -> Callable[[L.ExprLike], L.Expr]:
    """Flat index of element k of row (o, t) of a tensor seen as (outer, length, inner)."""
    base = o * (a["length"] * a["inner"]) + t
    return lambda k: base + k * a["inner"]


def _row_max(names: L.Names, x_at: Callable[[L.Expr], L.Expr], length: int, top: L.Var) -> list[L.Stmt]:
    i = names.var("i")
    return [L.Assign(top, L.const(NEG_INF)), L.Loop(i, length, [L.Assign(top, L.maximum(top, x_at(i)))])]


Tail = Callable[[Callable[[L.Expr], L.Expr], Callable[[L.Expr], L.Expr], L.Var, L.Var, L.Var, int], list[L.Stmt]]


def _rows_after_max(spec: KernelSpec, tail: Tail) -> list[L.Stmt]:
    """The softmax family per row: the row's max into `top`, `total` zeroed, then tail(x, at, i, top, total,
    length); subtracting the max keeps large logits from overflowing."""
    names, a = L.Names(), spec.attrs
    i, top, total = names.var("i"), names.local("mx"), names.local("sum")

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        at = _along(a, o, t)
        x = lambda k: L.Load("in0", at(k))  # noqa: E731
        return [*_row_max(names, x, a["length"], top), L.Assign(total, L.const(0.0)),
                *tail(x, at, i, top, total, a["length"])]

    return over_rows(names, a["outer"], a["inner"], row)


@register("Softmax", normalize=_softmax_attrs)
def _lower_softmax(spec: KernelSpec) -> list[L.Stmt]:
    """exp(x - max) / sum, the exponentials stored once and scaled."""

    def tail(x, at, i, top, total, length):
        return [L.Loop(i, length, [L.Store("out0", at(i), L.call("exp", x(i) - top)),
                                   L.Assign(total, total + L.Load("out0", at(i)))]),
                L.Assign(total, 1.0 / total),
                L.Loop(i, length, [L.Store("out0", at(i), activate(L.Load("out0", at(i)) * total, spec.activation))])]

    return _rows_after_max(spec, tail)


@register("LogSoftmax", normalize=_softmax_attrs)
def _lower_log_softmax(spec: KernelSpec) -> list[L.Stmt]:
    """x - max - log(sum(exp(x - max))): log-sum-exp around the max."""

    def tail(x, at, i, top, total, length):
        return [L.Loop(i, length, [L.Assign(total, total + L.call("exp", x(i) - top))]),
                L.Assign(total, top + L.call("log", total)),
                L.Loop(i, length, [L.Store("out0", at(i), x(i) - total)])]

    return _rows_after_max(spec, tail)


@register("Hardmax", normalize=_softmax_attrs)
def _lower_hardmax(spec: KernelSpec) -> list[L.Stmt]:
    """1 at the first maximum of each row, 0 elsewhere."""
    names, a = L.Names(), spec.attrs
    i, best, where = names.var("i"), names.local("best"), names.local("at", L.I64)

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        at = _along(a, o, t)
        better = L.compare("gt", L.Load("in0", at(i)), best)
        return [L.Assign(best, L.Load("in0", at(0))), L.Assign(where, L.const(0)),
                L.Loop(i, a["length"], [L.Assign(where, L.select(better, i, where)),
                                        L.Assign(best, L.maximum(best, L.Load("in0", at(i))))]),
                L.Loop(i, a["length"], [L.Store("out0", at(i), L.select(L.compare("eq", i, where), 1.0, 0.0))])]

    return over_rows(names, a["outer"], a["inner"], row)


# ------------------------------------------------------------------------------------------------ normalisations

# Loops over the elements one statistic covers: over(body) calls body(input index) inside fresh loops.
Over = Callable[[Callable[[L.Expr], list[L.Stmt]]], list[L.Stmt]]


def _contiguous(names: L.Names, base: L.Expr, length: int) -> Over:
    """The `length` consecutive elements from `base`."""
    def over(body: Callable[[L.Expr], list[L.Stmt]]) -> list[L.Stmt]:
        i = names.var("i")
        return [L.Loop(i, length, body(base + i))]
    return over


def _moments(names: L.Names, over: Over, count: int) -> tuple[list[L.Stmt], L.Var, L.Var]:
    """Statements that set the mean and the variance of in0 over `over`'s elements, in two passes (squared
    deviations: accurate where E[x^2] - E[x]^2 would cancel)."""
    mean, variance = names.local("mean"), names.local("var")
    x = lambda index: L.Load("in0", index)  # noqa: E731
    stmts = [L.Assign(mean, L.const(0.0)), *over(lambda i: [L.Assign(mean, mean + x(i))]),
             L.Assign(mean, mean * (1.0 / count)),
             L.Assign(variance, L.const(0.0)),
             *over(lambda i: [L.Assign(variance, variance + (x(i) - mean) * (x(i) - mean))]),
             L.Assign(variance, variance * (1.0 / count))]
    return stmts, mean, variance


def _standardize(names: L.Names, over: Over, count: int, epsilon: float) -> tuple[list[L.Stmt], L.Var, L.Var]:
    """Statements that set the mean and 1 / sqrt(variance + epsilon)."""
    stmts, mean, variance = _moments(names, over, count)
    return stmts + [L.Assign(variance, 1.0 / L.call("sqrt", variance + epsilon))], mean, variance


# LayerNormalization's optional outputs after Y, in order.
LAYERNORM_STATISTICS = ("mean", "inv_std")


def _layernorm_attrs(ctx: NodeContext) -> dict[str, Any]:
    """axis, epsilon, and which of the optional Mean and InvStdDev outputs the node has (they are the kernel's
    outputs after Y, in that order)."""
    a = ctx.node.attrs
    if int(a.get("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {a['stash_type']} is not supported (1, float32, is)")
    shape = ctx.inputs[0].shape
    axis = axis_in_range(ctx, a.get("axis", -1), len(shape))
    for info in ctx.inputs[1:]:
        if info is not None and len(_trailing(info.shape, len(shape) - axis)) > len(shape) - axis:
            raise ctx.unsupported(f"scale/bias of shape {list(info.shape)} don't broadcast to {list(shape[axis:])}")
    outputs = ctx.node.outputs
    statistics = [name for i, name in enumerate(LAYERNORM_STATISTICS, 1) if i < len(outputs) and outputs[i]]
    return {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5)), "statistics": statistics}


def _trailing(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`shape` without leading ones beyond `rank` axes (a scale of shape (1, 1, C) for normalised shape (C,))."""
    extra = max(len(shape) - rank, 0)
    return shape[extra:] if all(d == 1 for d in shape[:extra]) else shape


@register("LayerNormalization", normalize=_layernorm_attrs)
def _lower_layernorm(spec: KernelSpec) -> list[L.Stmt]:
    """y = (x - mean) / sqrt(var + eps) * scale + bias over the axes from `axis` on; scale and bias broadcast to
    that normalised shape. One work-item per normalised row, which also writes the row's requested statistics."""
    names, a, shape = L.Names(), spec.attrs, shape_of(spec)
    normalized = shape[a["axis"]:]
    length = prod(normalized)
    params = [(f"in{i}", _trailing(shape_of(spec, i), len(normalized))) for i in range(1, len(spec.inputs))]

    def row(o: L.Expr, _: L.Expr) -> list[L.Stmt]:
        base = o * length
        stats, mean, scale = _standardize(names, _contiguous(names, base, length), length, a["epsilon"])

        def store(v: list[L.Var]) -> list[L.Stmt]:
            value = (L.Load("in0", base + L.flat_index(normalized, v)) - mean) * scale
            value = value * L.Load(*_broadcast(params[0], normalized, v))
            if len(params) > 1:
                value = value + L.Load(*_broadcast(params[1], normalized, v))
            return [L.Store("out0", base + L.flat_index(normalized, v), value)]

        loops, _ = L.loop_nest(names, normalized, store)
        values = {"mean": mean, "inv_std": scale}
        return stats + loops + [L.Store(f"out{k}", o, values[name]) for k, name in enumerate(a["statistics"], 1)]

    return over_rows(names, prod(shape[:a["axis"]]), 1, row)


def _broadcast(param: tuple[str, tuple[int, ...]], shape: tuple[int, ...], v: list[L.Var]) -> tuple[str, L.Expr]:
    buf, param_shape = param
    return buf, L.broadcast_index(param_shape, shape, v)


def _epsilon_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"epsilon": float(ctx.node.attrs.get("epsilon", 1e-5))}


@register("InstanceNormalization", normalize=_epsilon_attrs)
def _lower_instancenorm(spec: KernelSpec) -> list[L.Stmt]:
    """Each (batch, channel) plane normalised on its own, then scale[c] and bias[c]: a work-item per plane."""
    names, shape = L.Names(), shape_of(spec)
    channels, size = shape[1], prod(shape[2:])
    plane = names.var("p")
    over = _contiguous(names, plane * size, size)
    stats, mean, scale = _standardize(names, over, size, spec.attrs["epsilon"])
    channel = plane % channels
    factor = names.local("factor")
    normalize = over(lambda i: [L.Store("out0", i, (L.Load("in0", i) - mean) * factor + L.Load("in2", channel))])
    return [L.Loop(plane, shape[0] * channels, [*stats, L.Assign(factor, scale * L.Load("in1", channel)), *normalize],
                   parallel=True)]


def _groupnorm_attrs(ctx: NodeContext) -> dict[str, Any]:
    """num_groups, epsilon, and whether scale and bias hold a value per channel (opset 21) or per group (18)."""
    a = ctx.node.attrs
    groups, channels = int(a["num_groups"]), ctx.inputs[0].shape[1]
    if channels % groups:
        raise ctx.unsupported(f"{channels} channels don't split into {groups} groups")
    if int(a.get("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {a['stash_type']} is not supported (1, float32, is)")
    return {"groups": groups, "epsilon": float(a.get("epsilon", 1e-5)), "per_channel": int(ctx.opset >= 21)}


@register("GroupNormalization", normalize=_groupnorm_attrs)
def _lower_groupnorm(spec: KernelSpec) -> list[L.Stmt]:
    """The channels of each group (with their spatial extent) normalised together: a work-item per (batch, group)."""
    names, a, shape = L.Names(), spec.attrs, shape_of(spec)
    groups, per_group, size = a["groups"], shape[1] // a["groups"], prod(shape[2:])
    unit, channel, i = names.var("u"), names.var("c"), names.var("i")
    base = unit * (per_group * size)
    stats, mean, scale = _standardize(names, _contiguous(names, base, per_group * size), per_group * size,
                                      a["epsilon"])
    param = (unit % groups) * per_group + channel if a["per_channel"] else unit % groups
    index = base + channel * size + i
    value = (L.Load("in0", index) - mean) * scale * L.Load("in1", param) + L.Load("in2", param)
    return [L.Loop(unit, shape[0] * groups, [
        *stats, L.Loop(channel, per_group, [L.Loop(i, size, [L.Store("out0", index, value)])])], parallel=True)]


def _mvn_attrs(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.inputs[0].shape)
    return {"axes": sorted({axis_in_range(ctx, axis, rank) for axis in ctx.node.attrs.get("axes", [0, 2, 3])})}


@register("MeanVarianceNormalization", normalize=_mvn_attrs)
def _lower_mvn(spec: KernelSpec) -> list[L.Stmt]:
    """(x - mean) / (sqrt(var) + 1e-9) over `axes`, as ONNX's function body defines it."""
    names = L.Names()
    inv_std = names.local("inv_std")
    layout = ReduceLayout.of(shape_of(spec), spec.attrs["axes"])

    def per_output(_: L.Expr, base: L.Expr) -> list[L.Stmt]:
        over: Over = lambda body: layout.over_reduced(names, base, body)  # noqa: E731
        stats, mean, variance = _moments(names, over, layout.count)
        return [*stats, L.Assign(inv_std, 1.0 / (L.call("sqrt", variance) + 1e-9)),
                *over(lambda i: [L.Store("out0", i, (L.Load("in0", i) - mean) * inv_std)])]

    return layout.over_outputs(names, per_output)


def _lp_attrs(ctx: NodeContext) -> dict[str, Any]:
    p = int(ctx.node.attrs.get("p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"LpNormalization p={p} is not supported (1 and 2 are)")
    shape = ctx.inputs[0].shape
    outer, length, inner = axis_view(shape, axis_in_range(ctx, ctx.node.attrs.get("axis", -1), len(shape)))
    return {"p": p, "outer": outer, "length": length, "inner": inner}


@register("LpNormalization", normalize=_lp_attrs)
def _lower_lp_normalization(spec: KernelSpec) -> list[L.Stmt]:
    """x / ||row||_p along the axis; a zero row gives zeros, as onnxruntime does."""
    names, a = L.Names(), spec.attrs
    i, norm = names.var("i"), names.local("norm")
    magnitude = (lambda x: x * x) if a["p"] == 2 else absolute

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        at = _along(a, o, t)
        x = L.Load("in0", at(i))
        total = L.call("sqrt", norm) if a["p"] == 2 else norm
        return [L.Assign(norm, L.const(0.0)), L.Loop(i, a["length"], [L.Assign(norm, norm + magnitude(x))]),
                L.Assign(norm, L.select(L.compare("eq", norm, 0.0), 0.0, 1.0 / total)),
                L.Loop(i, a["length"], [L.Store("out0", at(i), x * norm)])]

    return over_rows(names, a["outer"], a["inner"], row)
