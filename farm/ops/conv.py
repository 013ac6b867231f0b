"""Conv through the IR's Gemm primitive: a 2-D (or 1-D) Conv as im2col, pointwise, implicit or transposed GEMM per
(batch, group), a depthwise one as a direct kernel, a 3-D one as a loop nest. ConvTranspose (conv_transpose.py)
reuses its grouped channels, and the quantized convs (quantize.py) its group check."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from farm.errors import BuildError
from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import NodeContext, activate, gemm_epilogue, out_shape, prod, shape_of
from farm.ops.window import (
    Window,
    WindowLowering,
    copy_to_scratch,
    cpu_channel_block,
    fill_scratch,
    no_scratch,
    pad_plane,
    padded_plane,
    phased_plane_floats,
    phased_tap,
    register_by_rank,
    spatial_attrs,
    tap_columns,
    window,
    window_tap,
)

COLUMN_ALIGNMENT = 16
"""Floats per cache line (64 bytes): im2col rows start at multiples of it, and output planes that fill their vectors
of this many floats this badly run transposed (_pixels_as_rows)."""
SMALL_PLANE_WASTE = 1.10
"""_tiled_cost / actual pixels above which a conv runs pixels as rows: 7x7 (1.31), 5x5 (1.28) and 13x13 (1.14) do,
14x14 (1.06), 27x27 (1.03) and 28x28 (1.0) don't. Squeezenet's 13x13 pointwise convs ran 9-20% faster transposed
on one Xeon core (its 512 -> 1000 classifier conv 1.27 -> 1.15 ms); by vectors padded to 16 floats alone, 13x13
(1.04) looked like 14x14."""
WIDE_POINTWISE_WASTE = 1.05
"""The waste above which a pointwise conv of at least WIDE_POINTWISE_CHANNELS input and output channels runs pixels
as rows: 14x14 (1.06) does. In model order on one Xeon core, light ResNet-50's 14x14 pointwise convs (256 -> 1024,
1024 -> 256, 1024 -> 512) ran 0.87-0.93x the time transposed and Inception-v2's 576 -> 224 0.96x; with fewer
channels on either side the transposed GEMM lost or drew (576 -> 128, 160 and 192: 1.00-1.11x; 64, 128 and 160 ->
576: 1.04-1.10x, its copy of the input pixel-major not paid back by a short k)."""
WIDE_POINTWISE_CHANNELS = 224
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
PIXEL_MAJOR_MIN_PANELS = 8
"""The fewest panels of weights (output channels / WEIGHT_PANEL_COLUMNS) for which a pointwise conv that runs
pixels as rows copies its input pixel-major first (_copies_pixel_major)."""


def _conv_attrs(ctx: NodeContext) -> dict[str, Any]:
    group = checked_group(ctx)
    weight = ctx.input_info(1)
    kernel = [int(k) for k in ctx.node.attrs.get("kernel_shape", weight.shape[2:])]
    if tuple(kernel) != tuple(weight.shape[2:]):
        raise ctx.unsupported(f"kernel_shape {kernel} differs from the weight's {list(weight.shape[2:])}")
    attrs = spatial_attrs(ctx, kernel)
    attrs["group"] = group
    attrs["constant_weight"] = ctx.node.inputs[1] in ctx.constants  # then the build may pre-pack it
    if ctx.node.residual:
        attrs["residual"] = True
    return attrs


def checked_group(ctx: NodeContext) -> int:
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
            f"{list(weight.shape)} with group {group} expects {weight.shape[1] * group} (and M divisible by group)"
        )
    return group


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


def grouped_channels(spec: KernelSpec) -> GroupedChannels:
    """The channels of a (transposed) convolution's spec: its input's batch and channels, its output's channels."""
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
    return ConvGeometry(**asdict(grouped_channels(spec)), **asdict(window(spec)))


def _pixels_as_rows(spec: KernelSpec, geo: ConvGeometry) -> bool:
    """Whether the conv's GEMM runs transposed: out^T (pixels x channels) = columns^T @ W^T, the pixels as the
    micro-kernel's rows and the output channels as its vector columns. Chosen when the output plane fills its
    vectors badly (7x7 = 49 pixels fill 3 vectors of 16 and 1 float of a fourth; 512 channels fill 32), the
    weights are constant (they are then packed as a transposed B) and the column matrix with one panel of weights
    fits TRANSPOSED_OPERAND_BYTES: each panel of weights passes over all of the column matrix, which must stay in
    cache (light ResNet-50 on one Xeon core: 7x7 pointwise convs 146-161 -> 171-174 GFLOP/s transposed, but its
    7x7 3x3 convs, whose 4608 x 64 column matrix does not fit beside a panel, 147 -> 95)."""
    waste = _tiled_cost(geo.out_pixels) / geo.out_pixels
    wide = _is_pointwise(geo) and min(geo.in_channels_per_group, geo.out_channels_per_group) >= WIDE_POINTWISE_CHANNELS
    channel_waste = _tiled_cost(geo.out_channels_per_group) / geo.out_channels_per_group
    stride = geo.out_pixels if _is_pointwise(geo) else geo.column_stride
    operand_bytes = geo.column_rows * (stride + WEIGHT_PANEL_COLUMNS) * 4
    return (
        bool(spec.attrs.get("constant_weight"))
        and waste > (WIDE_POINTWISE_WASTE if wide else SMALL_PLANE_WASTE)
        and channel_waste < waste
        and operand_bytes <= TRANSPOSED_OPERAND_BYTES
    )


def _tiled_cost(columns: int) -> int:
    """What `columns` of a GEMM's vector side cost, in columns of full 16-float vectors, tiled as the CPU's
    micro-kernel tiles them (gemm_blocking.column_tiling): whole vectors, then an 8- and a 4-float vector where the
    rest holds them, then single floats, each of these a vector's time. 169 (13x13) costs 192: 10 vectors, an 8-float
    one and a float."""
    rest = columns % COLUMN_ALIGNMENT
    return COLUMN_ALIGNMENT * (columns // COLUMN_ALIGNMENT + (rest >= 8) + (rest % 8 >= 4) + rest % 4)


def _is_pointwise(geo: ConvGeometry) -> bool:
    """A 1x1, stride-1, unpadded conv reads its input as the GEMM's B matrix directly: no im2col."""
    window = (geo.kernel_height, geo.kernel_width, geo.stride_height, geo.stride_width, geo.pad_top, geo.pad_left)
    return window == (1, 1, 1, 1, 0, 0)


def _is_depthwise(geo: GroupedChannels) -> bool:
    return geo.in_channels_per_group == 1 and geo.out_channels_per_group == 1


def _conv_plane_scratch(spec: KernelSpec) -> int:
    geo = _conv_geometry(spec)
    if _is_depthwise(geo):
        return geo.batch * (geo.out_channels // _channel_block(spec, geo.out_channels)) * phased_plane_floats(geo)
    if _is_pointwise(geo):
        return (
            geo.out_pixels * _pixel_major_stride(geo) if _pixel_major_sized(geo) and _pixels_as_rows(spec, geo) else 0
        )
    padded = geo.in_channels_per_group * prod(padded_plane(geo))
    return max(padded, _banded_scratch(geo, _band_rows(geo)))


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
        lo, hi = tap_columns(geo, s)
        source = x_base + c * geo.in_pixels + ih * geo.width + (s * geo.dilation_width - geo.pad_left)
        row = (
            fill_scratch(names, start, 0, lo)
            + copy_to_scratch(names, start, source, geo.stride_width, lo, hi)
            + fill_scratch(names, start, hi, geo.out_width)
        )
        taps += [L.If(inside, row), L.If(outside, fill_scratch(names, start, 0, geo.out_width))]
    rows = L.Loop(y, band.rows, [L.Loop(r, geo.kernel_height, taps)], True)
    return [L.Loop(c, geo.in_channels_per_group, [rows], True)]


def _depthwise(names: L.Names, spec: KernelSpec, geo: ConvGeometry) -> list[L.Stmt]:
    """Direct depthwise conv, one work-item per (batch, block of _channel_block channels): each channel's input
    window is first copied into a zero-padded plane in scratch (rows of zeros, copy, zeros), its columns split by
    the stride's phases (pad_plane), then every output sums its taps with plain loads at unit stride along the
    row, no padding guard (vectorised). Guarding every tap instead ran the small maps of mobilenetv2 at 5-11
    GFLOP/s; reading a stride-2 conv's taps two floats apart kept MobileNetV2's stride-2 depthwise convs at 8-16
    GFLOP/s. The channels of a block share one plane (DEPTHWISE_CHANNEL_BLOCK)."""
    n, block, index = names.var("n"), names.var("cb"), names.var("c")
    size = _channel_block(spec, geo.out_channels)
    ch = block * size + index
    plane = (n * (geo.out_channels // size) + block) * phased_plane_floats(geo)
    source = (n * geo.in_channels + ch) * geo.in_pixels
    per_channel = pad_plane(names, geo, plane, source, geo.stride_width) + _depthwise_outputs(
        names, spec, geo, plane, n, ch
    )
    return [
        L.Loop(n, geo.batch, [L.Loop(block, geo.out_channels // size, [L.Loop(index, size, per_channel)], True)], True)
    ]


def _channel_block(spec: KernelSpec, channels: int) -> int:
    """Channels per block of a depthwise conv on a CPU (cpu_channel_block); one elsewhere: a GPU runs a work-item
    per block, and needs them all. The memory plan sizes scratch from the unspecialised spec, so a depthwise conv
    gets the most planes, those a GPU needs."""
    return cpu_channel_block(channels) if spec.for_cpu else 1


def _depthwise_outputs(
    names: L.Names, spec: KernelSpec, geo: ConvGeometry, plane: L.Expr, n: L.Var, ch: L.Expr
) -> list[L.Stmt]:
    """out[n, ch, oh, ow] = bias + sum over taps of the phased padded plane times the channel's weights (the tap
    columns unrolled: each reads its phase's run at ow + a constant)."""
    oh, ow, r, acc = names.var("y"), names.var("x"), names.var("r"), names.local()
    taps: list[L.Stmt] = []
    for s in range(geo.kernel_width):
        weight = L.Load("in1", (ch * geo.kernel_height + r) * geo.kernel_width + s)
        taps.append(L.Assign(acc, acc + phased_tap(geo, plane, oh, ow, r, s) * weight))
    init = L.Load("in2", ch) if len(spec.inputs) > 2 else L.const(0.0)
    out_index = ((n * geo.out_channels + ch) * geo.out_height + oh) * geo.out_width + ow
    inner = [
        L.Assign(acc, init),
        L.Loop(r, geo.kernel_height, taps),
        L.Store("out0", out_index, activate(acc, spec.activation)),
    ]
    return [L.Loop(oh, geo.out_height, [L.Loop(ow, geo.out_width, inner)])]


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
    epilogue = functools.partial(gemm_epilogue, spec, bias, g * geo.out_channels_per_group, residual=residual)
    if _implicit(spec, geo):
        per_group = _implicit_gemm(spec, geo, names, g, x_base, out_offset, epilogue)
    elif _is_pointwise(geo) or _pixels_as_rows(spec, geo):
        per_group = _whole_plane(spec, geo, names, g, x_base, out_offset, epilogue)
    else:
        band_rows = _column_bands(spec, geo)
        per_group = [
            stmt
            for band in _bands(geo, band_rows, names)
            for stmt in _band(spec, geo, names, g, x_base, out_offset, epilogue, band)
        ]
    return [L.Loop(n, geo.batch, [L.Loop(g, geo.groups, per_group)])]


def _implicit(spec: KernelSpec, geo: ConvGeometry) -> bool:
    """Whether a conv runs as an implicit GEMM on a CPU (_implicit_gemm): a kernel wider than 1x1 (a strided 1x1
    conv reads each input value once, so its whole padded input passes again for every panel of weights: light
    ResNet-50's 256 -> 512 one at 56 -> 28 ran at 90 GFLOP/s instead of 160-179 through im2col), constant weights
    (packed as a transposed B), at least IMPLICIT_MIN_DEPTH taps, and a CPU spec (OpenCL's renderer reads A as a
    matrix)."""
    return (
        spec.for_cpu
        and geo.kernel_height * geo.kernel_width > 1
        and geo.column_rows >= IMPLICIT_MIN_DEPTH
        and bool(spec.attrs.get("constant_weight"))
    )


def _implicit_gemm(
    spec: KernelSpec,
    geo: ConvGeometry,
    names: L.Names,
    g: L.Var,
    x_base: L.Expr,
    out_offset: L.Expr,
    epilogue: Callable[..., L.GemmEpilogue | None],
) -> list[L.Stmt]:
    """out^T (pixels x channels) = the zero-padded input read as its im2col matrix (loopir.ImplicitColumns) @ W^T
    (packed as a transposed B): the input is copied once into a padded plane per channel (its own size), and no
    column matrix (kh x kw times the input) is written and read back. Direct convolution's data flow, through
    the GEMM micro-kernel: ResNet-18's 3x3 convs on one Xeon core went from 85-161 to 112-207 GFLOP/s (the model
    from 1.52x to 1.21x onnxruntime's time)."""
    rows, columns = padded_plane(geo)
    plane = rows * columns
    c = names.var("c")
    pad = [L.Loop(c, geo.in_channels_per_group, pad_plane(names, geo, c * plane, x_base + c * geo.in_pixels), True)]
    window = L.ImplicitColumns(
        geo.out_width,
        geo.stride_height * columns,
        geo.stride_width,
        plane,
        geo.kernel_height,
        geo.kernel_width,
        geo.dilation_height * columns,
        geo.dilation_width,
    )
    group_out, kdim = geo.out_channels_per_group, geo.column_rows
    gemm = L.Gemm(
        a="scratch",
        a_offset=L.const(0),
        lda=0,
        b="in1",
        b_offset=g * (group_out * kdim),
        ldb=kdim,
        c="out0",
        c_offset=out_offset,
        ldc=geo.out_pixels,
        m=geo.out_pixels,
        n=group_out,
        k=kdim,
        b_panels=True,
        b_transposed=True,
        c_transposed=True,
        a_window=window,
        epilogue=epilogue(bias_on_columns=True, residual_offset=out_offset),
    )
    return [*pad, gemm]


def _whole_plane(
    spec: KernelSpec,
    geo: ConvGeometry,
    names: L.Names,
    g: L.Var,
    x_base: L.Expr,
    out_offset: L.Expr,
    epilogue: Callable[..., L.GemmEpilogue | None],
) -> list[L.Stmt]:
    """A pointwise conv's GEMM on its input, or a small plane's transposed GEMM on its whole column matrix."""
    if _is_pointwise(geo):
        columns, stmts = ("in0", x_base, geo.out_pixels), []
    else:
        columns = ("scratch", L.const(0), geo.column_stride)
        stmts = _im2col(names, geo, x_base, ColumnBand(L.const(0), geo.out_height, L.const(0), geo.column_stride))
    transposed = _pixels_as_rows(spec, geo)
    copied = transposed and _copies_pixel_major(spec, geo)
    if copied:
        columns, stmts = ("scratch", L.const(0), _pixel_major_stride(geo)), _pixel_major_copy(names, geo, x_base)
    gemm = CONV_GEMMS[transposed](spec, geo, g, columns, out_offset, geo.out_pixels)
    gemm.a_transposed = transposed and not copied  # the pixel-major copy is already pixels x taps
    gemm.epilogue = epilogue(bias_on_columns=transposed, residual_offset=out_offset)
    return [*stmts, gemm]


def _band(
    spec: KernelSpec,
    geo: ConvGeometry,
    names: L.Names,
    g: L.Var,
    x_base: L.Expr,
    out_offset: L.Expr,
    epilogue: Callable[..., L.GemmEpilogue | None],
    band: tuple[L.Var | None, ColumnBand],
) -> list[L.Stmt]:
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
    bands: list[tuple[L.Var | None, ColumnBand]] = [
        (index, ColumnBand(index * rows, rows, index * (geo.column_rows * stride), stride))
    ]
    rest = geo.out_height - full * rows
    if rest:
        bands.append(
            (
                None,
                ColumnBand(
                    L.const(full * rows), rest, L.const(full * geo.column_rows * stride), _aligned(rest * geo.out_width)
                ),
            )
        )
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
    if residual not in (True, RESIDUAL_IN_PLACE) or _is_depthwise(grouped_channels(spec)):
        raise BuildError(
            f"Conv with a residual: the attribute is true or {RESIDUAL_IN_PLACE!r} (got {residual!r}), "
            f"and the conv not depthwise"
        )
    if residual == RESIDUAL_IN_PLACE:
        return "out0"
    if len(spec.inputs) < 3 or spec.inputs[-1] != spec.outputs[0]:
        raise BuildError(
            f"Conv with a residual: its last input {spec.inputs[-1]} must be laid out like its output {spec.outputs[0]}"
        )
    return f"in{len(spec.inputs) - 1}"


def _channels_by_pixels(
    spec: KernelSpec, geo: ConvGeometry, g: L.Var, columns: tuple[str, L.Expr, int], out_offset: L.Expr, pixels: int
) -> L.Gemm:
    """out (channels x `pixels` from out_offset) = W (channels x taps, read in the micro-kernel's row panels when
    constant) @ the column matrix (taps x pixels)."""
    buffer, offset, stride = columns
    group_out, kdim = geo.out_channels_per_group, geo.column_rows
    return L.Gemm(
        a="in1",
        a_offset=g * (group_out * kdim),
        lda=kdim,
        b=buffer,
        b_offset=offset,
        ldb=stride,
        c="out0",
        c_offset=out_offset,
        ldc=geo.out_pixels,
        m=group_out,
        n=pixels,
        k=kdim,
        a_panels=bool(spec.attrs.get("constant_weight")),
    )


def _copies_pixel_major(spec: KernelSpec, geo: ConvGeometry) -> bool:
    """Whether a pointwise conv that runs pixels as rows first copies its input pixel by pixel (_pixel_major_copy),
    on a CPU: the micro-kernel then broadcasts each row's values from a run of its own, read a line at a time, where
    its input read transposed gave every k step a new line (half of it another tile's). The copy is one pass over
    the input; the GEMM passes over it once per panel of weights, so it pays with PIXEL_MAJOR_MIN_PANELS panels or
    more (_pixel_major_sized). An OpenCL spec reads the input as it is."""
    return spec.for_cpu and _pixel_major_sized(geo)


def _pixel_major_sized(geo: ConvGeometry) -> bool:
    """Whether a pointwise conv has the output channels for which its pixel-major copy pays (on one Xeon core, in
    the model: SqueezeNet's 512 -> 1000 classifier at 13x13, 21 panels, 1.17-1.21 -> 1.11-1.13 ms with the copy;
    ResNet-50's 7x7 512 -> 2048 ones, 43 panels, 7-11% faster, its 2048 -> 512 ones, 11 panels, 0-4%;
    SqueezeNet's 13x13 squeeze and expand convs, 1 to 6 panels over inputs of 43-346 KB, 4-28% slower)."""
    return _is_pointwise(geo) and geo.out_channels_per_group >= PIXEL_MAJOR_MIN_PANELS * WEIGHT_PANEL_COLUMNS


def _pixel_major_stride(geo: ConvGeometry) -> int:
    """Floats from one pixel's channels to the next in the pixel-major copy: a cache line more than the channels,
    so that the tile's rows (pixels) lie at addresses that differ modulo 4096 (512 or 2048 channels apart, they
    fell on one or two sets of L1)."""
    return geo.column_rows + COLUMN_ALIGNMENT


def _pixel_major_copy(names: L.Names, geo: ConvGeometry, x_base: L.Expr) -> list[L.Stmt]:
    """scratch[p * _pixel_major_stride + c] = in0[x_base + c * pixels + p]: a pointwise conv's input, pixel by
    pixel (_copies_pixel_major)."""
    p, c = names.var("p"), names.var("c")
    value = L.Load("in0", x_base + c * geo.out_pixels + p, L.F32)
    copy = L.Loop(c, geo.column_rows, [L.Store("scratch", p * _pixel_major_stride(geo) + c, value)])
    return [L.Loop(p, geo.out_pixels, [copy], True)]


def _pixels_by_channels(
    spec: KernelSpec, geo: ConvGeometry, g: L.Var, columns: tuple[str, L.Expr, int], out_offset: L.Expr, pixels: int
) -> L.Gemm:
    """out^T (pixels x channels) = the column matrix read transposed (pixels x taps) @ W^T (taps x channels,
    packed as a transposed constant B), stored transposed into out (_whole_plane reads a pixel-major copy as it
    is instead, _copies_pixel_major)."""
    buffer, offset, stride = columns
    group_out, kdim = geo.out_channels_per_group, geo.column_rows
    return L.Gemm(
        a=buffer,
        a_offset=offset,
        lda=stride,
        b="in1",
        b_offset=g * (group_out * kdim),
        ldb=kdim,
        c="out0",
        c_offset=out_offset,
        ldc=geo.out_pixels,
        m=pixels,
        n=group_out,
        k=kdim,
        a_transposed=True,
        b_panels=True,
        b_transposed=True,
        c_transposed=True,
    )


CONV_GEMMS = {False: _channels_by_pixels, True: _pixels_by_channels}
"""The conv's GEMM by _pixels_as_rows."""


def _lower_conv_volumes(spec: KernelSpec) -> list[L.Stmt]:
    """A 3-D Conv as a plain loop nest, a first correct version (no im2col, no GEMM): a work-item per output element
    sums its window over its group's input channels (taps in the padding read as 0), then adds the bias and the
    residual (read at the element it writes, so it may be the output itself) and applies the activation."""
    names, a, channels = L.Names(), spec.attrs, grouped_channels(spec)
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
            inside, at = window_tap(a, sizes, outs, taps)
            x = L.select(inside, L.Load("in0", plane + at), 0.0)
            return [L.Assign(acc, acc + x * L.Load("in1", weights + L.flat_index(kernel, taps)))]

        window, _ = L.loop_nest(names, kernel, tap)
        value: L.Expr = acc + L.Load("in2", m) if has_bias else acc
        value = value if residual is None else value + L.Load(residual, L.flat_index(shape, v))
        return [
            L.Assign(acc, L.const(0.0)),
            L.Loop(c, channels.in_channels_per_group, window),
            L.Store("out0", L.flat_index(shape, v), activate(value, spec.activation)),
        ]

    body, _ = L.loop_nest(names, shape, element, parallel=True)
    return body


CONV_LOWERINGS = {
    2: WindowLowering(_lower_conv_planes, _conv_plane_scratch),
    3: WindowLowering(_lower_conv_volumes, no_scratch),
}
"""Conv by spatial rank: planes (1-D ones as planes of height 1) through the GEMM paths, volumes as a loop nest."""


register_by_rank(("Conv",), CONV_LOWERINGS, normalize=_conv_attrs)
