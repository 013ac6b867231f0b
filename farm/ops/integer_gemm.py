"""MatMulInteger and ConvInteger through the loop IR's IntGemm (int8/uint8 products exact in int32, on each ISA's
dot-product instructions: farm/backends/llvm/int_gemm.py), where their shapes suit it; and the node-input helpers
the quantization ops share (a node's optional inputs are kernel buffers only when present).

A MatMulInteger is one IntGemm per unit of columns of C (a parallel loop; each unit packs its columns of B on the
launch's stack, at most INT_GEMM_PANEL_BYTES). A ConvInteger copies its input's im2col matrix (its zero point in
the padding, so that padding adds nothing, as ONNX pads x after subtracting it) into byte scratch of its input's
dtype, then runs IntGemms with the output channels as rows (the weights, read in place: each row's k values are
contiguous) and the output pixels as columns, in units of row blocks x column blocks; with fewer pixels than
CONV_PIXELS_AS_COLUMNS_MIN, the pixels as rows and the channels as columns instead.

Units have a whole number of INT_GEMM_UNITS columns where one divides the columns; otherwise the columns past the
last whole unit are one narrower unit of each row block, in a second parallel loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.ir import loopir as L
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec
from farm.ops.registry import BUFFER_DTYPES, NodeContext, out_shape, prod
from farm.ops.tensor import load
from farm.ops.window import Window, copy_to_scratch, fill_scratch, tap_columns, tap_input, window

INT_GEMM_UNITS = (64, 32, 16)
"""The widths (columns of C) of the units an IntGemm launch is split into, widest first."""
INT_GEMM_PANEL_BYTES = 256 << 10
"""The most bytes of B a unit packs on the launch's stack (k x its width)."""
CONV_ROW_BLOCK = 64
"""Output channels per unit of an integer conv whose channels are a multiple of it (else all in one)."""
CONV_PIXELS_AS_COLUMNS_MIN = 64
"""The fewest output pixels an integer conv takes as its GEMM's columns (a vector's lanes); with fewer (the 4x4 and
2x2 planes of a ResNet's last stages) its pixels are the rows and its output channels the columns, so that every
lane holds a column and each broadcast of a pixel's bytes feeds several vectors of channels (a 16-pixel plane as
columns is one vector: one dot product per broadcast): the weights are then B read transposed
(L.IntGemm.b_transposed), the output C written transposed. light ResNet-18's 256-channel 4x4 convs went from 0.106
to 0.088 ms each on one Xeon core."""
UNROLLED_IM2COL_MAX = 1024
"""The most elements (pixels x taps) of one channel that a pixel-major im2col unrolls (_pixel_major_im2col)."""
UNROLLED_ROWS_MAX, UNROLLED_ROWS_ITEMS = 64, 16
"""A k-major im2col of stride 1 unrolls its output rows x kernel rows where they are at most this many, and there
are at least UNROLLED_ROWS_ITEMS (image, channel) work-items for the threads (_unrolled_row_copies_im2col; a
strided one was slower so: its copies gather)."""

CONV_SCRATCH_MAX_BYTES = 64 << 20
"""The largest im2col matrix (all images) an integer conv copies; a bigger one runs as a loop nest."""


# ------------------------------------------------------------------------------------ node-input helpers


def present_inputs(names: list[str]) -> list[int]:
    """The node inputs that are present, in order: input i is kernel buffer in{present_inputs.index(i)}."""
    return [i for i, name in enumerate(names) if name]


def input_buffer(spec: KernelSpec, index: int) -> tuple[str, TensorInfo] | None:
    """(buffer name, info) of node input `index`, or None when the node lacks it (see present_inputs)."""
    present = spec.attrs["present"]
    if index not in present:
        return None
    at = present.index(index)
    return f"in{at}", spec.inputs[at]


def given_input_buffer(spec: KernelSpec, index: int) -> tuple[str, TensorInfo]:
    """input_buffer of a node input the op requires (its normalisation refused a node without it)."""
    buffer = input_buffer(spec, index)
    assert buffer is not None, f"node input {index} is required, so present"
    return buffer


def constant_weight(ctx: NodeContext, index: int) -> dict[str, bool]:
    """{"constant_weight": True} when node input `index` (the weight) is a constant, which a CPU build may then
    pre-pack (L.IntGemm.b_panels); else nothing (equal layers keep equal keys)."""
    return {"constant_weight": True} if ctx.node.inputs[index] in ctx.constants else {}


def zero_constants(ctx: NodeContext, indices: tuple[int, ...]) -> dict[str, list[int]]:
    """{"zero_points_zero": [...]}: those of node inputs `indices` (zero points) that are constants of zeros alone,
    which the IntGemm then leaves out (None), so that it skips the row or column sums they would multiply; else
    nothing (equal layers keep equal keys)."""
    zeros = [i for i in indices if i < len(ctx.node.inputs) and _all_zeros(ctx.constants.get(ctx.node.inputs[i]))]
    return {"zero_points_zero": zeros} if zeros else {}


def _all_zeros(value: Any) -> bool:
    return value is not None and not np.any(value)


def _panels(spec: KernelSpec, depth: int, columns: int, width: int) -> int:
    """L.IntGemm.b_panels for a weight B of `columns` columns read in units of `width`: its columns when the spec is
    a CPU's, the weight is a constant and its shape suits the panels (k whole groups of four, columns and units whole
    panels), else 0. OpenCL reads B as stored: with panels, its units read B at the panels' offsets (a unit's first
    column times k), and a MatMulInteger of a constant B of whole panels computed wrong sums there."""
    lanes = L.INT_GEMM_PANEL_LANES
    suits = depth % L.INT_GEMM_K_GROUP == 0 and columns % lanes == 0 and width % lanes == 0
    return columns if spec.for_cpu and spec.attrs.get("constant_weight") and suits else 0


def _line_values(spec: KernelSpec, index: int, line: L.Expr) -> L.LineValues | None:
    """Node input `index` (a zero point, scale or bias) as IntGemm line values: one value, or one per row/column
    from `line` (None if absent)."""
    buffer = input_buffer(spec, index)
    if buffer is None or index in spec.attrs.get("zero_points_zero", ()):
        return None
    per_line = buffer[1].size != 1
    return L.LineValues(buffer[0], line if per_line else L.const(0), per_line)


def _unit_width(depth: int, cols: int) -> int | None:
    """The columns of each unit for a k of `depth` and `cols` columns: all of them when fewer than the widest of
    INT_GEMM_UNITS, else the widest of those that divides them, else the widest (the columns past its last whole
    unit are then one narrower unit); only widths whose panel (k rounded up to whole groups of four, by the width)
    fits INT_GEMM_PANEL_BYTES; None when none does."""
    padded = -(-depth // L.INT_GEMM_K_GROUP) * L.INT_GEMM_K_GROUP
    widths = ([cols] if cols < INT_GEMM_UNITS[0] else []) + list(INT_GEMM_UNITS)
    fitting = [w for w in widths if w <= cols and padded * w <= INT_GEMM_PANEL_BYTES]
    return next((w for w in fitting if cols % w == 0), fitting[0] if fitting else None)


def _column_units(
    names: L.Names, cols: int, width: int, lines: int, gemm: Callable[[L.Expr, L.Expr, int], L.IntGemm]
) -> list[L.Stmt]:
    """gemm(line, first column, columns) for every unit: each of `lines` (images x row blocks) times each whole unit
    of `width` columns, in one parallel loop; then, when `width` doesn't divide `cols`, the rest of each line's
    columns as one narrower unit, in a second."""
    whole, rest = divmod(cols, width)
    unit = names.var("u")
    stmts: list[L.Stmt] = [L.Loop(unit, lines * whole, [gemm(unit / whole, unit % whole * width, width)], True)]
    if rest:
        line = names.var("line")
        stmts.append(L.Loop(line, lines, [gemm(line, L.const(whole * width), rest)], True))
    return stmts


@dataclass(frozen=True)
class Operands:
    """Where an integer product's operands are among its node's inputs: the weight (B of a matmul, W of a conv), the
    data's and the weight's zero points, and for QLinearMatMul/QLinearConv what requantizes the sums (x_scale,
    w_scale, y_scale, y_zero, bias: None when the node lacks one)."""

    weight: int
    x_zero: int
    w_zero: int
    requantize: tuple[int, int, int, int, int] | None = None
    dequantize: tuple[int, int] | None = None
    """For MatMulIntegerToFloat: the scale and the bias that dequantize the sums into float32."""


INTEGER = Operands(weight=1, x_zero=2, w_zero=3)
"""MatMulInteger's and ConvInteger's inputs: int32 sums."""
QLINEAR = Operands(weight=3, x_zero=2, w_zero=5, requantize=(1, 4, 6, 7, 8))
"""QLinearMatMul's and QLinearConv's inputs: sums requantized into the output's bytes."""
BYTE_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}


def fast_path_suits(spec: KernelSpec, operands: Operands) -> bool:
    """Whether IntGemm can requantize as `spec` asks: its scales float32 (float16 scales round after each step, which
    only the loop nest does) and its activation none or Relu (a clamp at y_zero)."""
    if operands.requantize is None:
        return True
    relu = spec.activation is None or spec.activation.kind == "relu"
    return relu and not spec.attrs.get("half", False)


def _requantize(spec: KernelSpec, operands: Operands, line: L.Expr, on_rows: bool) -> L.Requantize | None:
    """The IntGemm's L.Requantize for QLinear* operands (None for integer sums): per-channel values from `line`
    (the unit's first output channel), along its rows or its columns."""
    if operands.requantize is None:
        return None
    x_scale, w_scale, y_scale, y_zero, bias = operands.requantize
    low, high = BYTE_RANGES[spec.outputs[0].dtype]

    def given(index: int) -> L.LineValues:
        found = _line_values(spec, index, line)
        assert found is not None, f"node input {index} is required, so present"
        return found

    return L.Requantize(
        x_scale=given(x_scale),
        w_scale=given(w_scale),
        y_scale=given(y_scale),
        y_zero=_line_values(spec, y_zero, line),
        bias=_line_values(spec, bias, line),
        on_rows=on_rows,
        low=low,
        high=high,
        relu=spec.activation is not None,
    )


def _dequantize(spec: KernelSpec, operands: Operands, line: L.Expr) -> L.Dequantize | None:
    """The IntGemm's L.Dequantize for MatMulIntegerToFloat operands (None otherwise): the scale and the bias, each
    one value or one per column from `line` (the unit's first column)."""
    if operands.dequantize is None:
        return None
    scale, bias = (_line_values(spec, index, line) for index in operands.dequantize)
    assert scale is not None, "MatMulIntegerToFloat's scale is required, so present"
    return L.Dequantize(scale, bias)


# ------------------------------------------------------------------------------------------- MatMulInteger


def matmul_integer_gemm(
    spec: KernelSpec, a_mat: tuple[int, ...], b_mat: tuple[int, ...], operands: Operands = INTEGER
) -> list[L.Stmt] | None:
    """MatMulInteger, QLinearMatMul or MatMulIntegerToFloat (A and B as matrix stacks) as IntGemm units over B's
    columns, when B is one matrix (A's batches are then more rows), its shape suits one (_unit_width) and so does its
    requantization (fast_path_suits); else None."""
    rows, depth, cols = prod(a_mat[:-1]), a_mat[-1], b_mat[-1]
    width = _unit_width(depth, cols)
    if len(b_mat) != 2 or width is None or not fast_path_suits(spec, operands):
        return None
    b_name = given_input_buffer(spec, operands.weight)[0]
    panels = _panels(spec, depth, cols, width)

    def gemm(line: L.Expr, column: L.Expr, columns: int) -> L.IntGemm:
        return L.IntGemm(
            "in0",
            L.const(0),
            depth,
            b_name,
            column * depth if panels else column,
            cols,
            "out0",
            column,
            cols,
            rows,
            columns,
            depth,
            a_zero=_line_values(spec, operands.x_zero, L.const(0)),
            b_zero=_line_values(spec, operands.w_zero, column),
            requantize=_requantize(spec, operands, column, on_rows=False),
            dequantize=_dequantize(spec, operands, column),
            b_panels=panels,
        )

    return _column_units(L.Names(), cols, width, 1, gemm)


# --------------------------------------------------------------------------------------------- ConvInteger


@dataclass(frozen=True)
class ConvGemm:
    """How an integer conv runs as IntGemms: its GEMM's sizes (k = channels x taps, one column per output pixel)
    and its units (row blocks of output channels x column blocks of pixels, per image)."""

    images: int
    depth: int
    pixels: int
    channels: int
    row_block: int
    width: int
    pixels_as_rows: bool = False
    """The pixels are the rows and the channels the columns (CONV_PIXELS_AS_COLUMNS_MIN): the im2col matrix is
    then pixel-major, and a unit is a block of `width` channels of every pixel."""

    @property
    def scratch_bytes(self) -> int:
        return self.images * self.depth * self.pixels


def conv_gemm(spec: KernelSpec, operands: Operands = INTEGER) -> ConvGemm | None:
    """The IntGemm plan of a ConvInteger (`spec`: x as input 0, the weight as input 1), or None when it runs as a
    loop nest: grouped convs, a unit's panel too big for the stack, or an im2col matrix over
    CONV_SCRATCH_MAX_BYTES."""
    if spec.attrs["group"] != 1 or not fast_path_suits(spec, operands):
        return None
    geo, x = window(spec), spec.inputs[0]
    channels = out_shape(spec)[1]
    depth = x.shape[1] * geo.kernel_height * geo.kernel_width
    pixels = geo.out_height * geo.out_width
    if x.shape[0] * depth * pixels > CONV_SCRATCH_MAX_BYTES:
        return None
    if pixels < CONV_PIXELS_AS_COLUMNS_MIN:
        width = _unit_width(depth, channels)
        return None if width is None else ConvGemm(x.shape[0], depth, pixels, channels, pixels, width, True)
    width = _unit_width(depth, pixels)
    if width is None:
        return None
    row_block = CONV_ROW_BLOCK if channels % CONV_ROW_BLOCK == 0 else channels
    return ConvGemm(x.shape[0], depth, pixels, channels, row_block, width)


def conv_integer_scratch(operands: Operands) -> dict[str, Callable[[KernelSpec], Any]]:
    """The scratch options (OpLowering.scratch_floats, scratch_dtype) of an integer conv with `operands`: the 4-byte
    words its im2col matrix takes (0: it runs as a loop nest), of x's dtype (the IntGemm reads B's signedness from
    it)."""

    def words(spec: KernelSpec) -> int:
        plan = conv_gemm(spec, operands)
        return 0 if plan is None else -(-plan.scratch_bytes // 4)

    def dtype(spec: KernelSpec) -> str:
        return BUFFER_DTYPES[spec.inputs[0].dtype]

    return {"scratch_floats": words, "scratch_dtype": dtype}


def conv_integer_gemm(spec: KernelSpec, operands: Operands = INTEGER) -> list[L.Stmt] | None:
    """ConvInteger or QLinearConv as an im2col copy into scratch and IntGemm units (conv_gemm), or None."""
    plan = conv_gemm(spec, operands)
    if plan is None:
        return None
    names = L.Names()
    return _im2col(spec, names, plan, operands) + _conv_units(spec, names, plan, operands)


def _im2col(spec: KernelSpec, names: L.Names, plan: ConvGemm, operands: Operands) -> list[L.Stmt]:
    """scratch[image, k, pixel] (scratch[image, pixel, k] when the pixels are the rows) = x[image, c, ih, iw] for
    k = (c, r, s), or x's zero point in the padding."""
    zero_buffer = input_buffer(spec, operands.x_zero)
    zero: L.Expr = L.const(0) if zero_buffer is None else load(*zero_buffer, L.const(0))
    if plan.pixels_as_rows:
        return _pixel_major_im2col(spec, names, plan, zero)
    return _row_copies_im2col(spec, names, plan, zero)


def _row_copies_im2col(spec: KernelSpec, names: L.Names, plan: ConvGemm, zero: L.Expr) -> list[L.Stmt]:
    """The k-major im2col matrix, one work-item per (image, channel, output row) (a 3-channel stem has enough of
    them for every thread) and, within it, per tap: the tap columns unrolled, so that the output columns whose
    input lies inside are a constant range, copied (vectorised, no guard), the zero point on either side and for a
    whole row whose input row is padding (as the float conv's _im2col: a guard on every element made LLVM gather
    byte by byte, 40% of a 64-channel 16x16 conv's time). A small plane of many channels unrolls its rows too
    (_unrolled_row_copies_im2col)."""
    geo, x = window(spec), spec.inputs[0]
    small = geo.out_height * geo.kernel_height <= UNROLLED_ROWS_MAX and geo.stride_width == 1
    if small and plan.images * x.shape[1] >= UNROLLED_ROWS_ITEMS:
        return _unrolled_row_copies_im2col(spec, names, plan, zero)
    line, r = names.var("line"), names.var("r")
    channels = x.shape[1]
    image, c, y = line / (channels * geo.out_height), line / geo.out_height % channels, line % geo.out_height
    ih = y * geo.stride_height - geo.pad_top + r * geo.dilation_height
    inside = L.logical_and(L.compare("ge", ih, 0), L.compare("lt", ih, geo.height))
    outside = L.binary("or", L.compare("lt", ih, 0), L.compare("ge", ih, geo.height))
    taps: list[L.Stmt] = []
    for s in range(geo.kernel_width):
        k = (c * geo.kernel_height + r) * geo.kernel_width + s
        start = (image * plan.depth + k) * plan.pixels + y * geo.out_width
        source = (image * channels + c) * (geo.height * geo.width) + ih * geo.width
        row = _tap_row(names, geo, s, start, source, zero)
        taps += [L.If(inside, row), L.If(outside, fill_scratch(names, start, 0, geo.out_width, zero))]
    return [L.Loop(line, plan.images * channels * geo.out_height, [L.Loop(r, geo.kernel_height, taps)], True)]


def _unrolled_row_copies_im2col(spec: KernelSpec, names: L.Names, plan: ConvGemm, zero: L.Expr) -> list[L.Stmt]:
    """_row_copies_im2col with one work-item per (image, channel), its output rows and taps unrolled here: which
    input rows are padding is decided at lowering, and every copy and fill is a constant range at a constant offset
    from the channel's plane (for a 16x16 plane: 144 copies of a row of 14-16 bytes, whose loop set-up and guards
    had been a fifth of the conv's time)."""
    geo, x = window(spec), spec.inputs[0]
    channels = x.shape[1]
    item = names.var("channel")
    image, c = item / channels, item % channels
    source_plane = item * (geo.height * geo.width)
    stmts: list[L.Stmt] = []
    for y in range(geo.out_height):
        for r in range(geo.kernel_height):
            ih = y * geo.stride_height - geo.pad_top + r * geo.dilation_height
            for s in range(geo.kernel_width):
                k = (c * geo.kernel_height + r) * geo.kernel_width + s
                start = (image * plan.depth + k) * plan.pixels + y * geo.out_width
                if not 0 <= ih < geo.height:
                    stmts += fill_scratch(names, start, 0, geo.out_width, zero)
                    continue
                stmts += _tap_row(names, geo, s, start, source_plane + ih * geo.width, zero)
    return [L.Loop(item, plan.images * channels, stmts, True)]


def _tap_row(names: L.Names, geo: Window, s: int, start: L.Expr, row: L.Expr, zero: L.Expr) -> list[L.Stmt]:
    """One output row's columns of tap column `s`, from the input row starting at in0[row]: the columns whose input
    lies inside copied (a constant range), the zero point on either side."""
    lo, hi = tap_columns(geo, s)
    source = row + (s * geo.dilation_width - geo.pad_left)
    return (
        fill_scratch(names, start, 0, lo, zero)
        + copy_to_scratch(names, start, source, geo.stride_width, lo, hi, L.I64)
        + fill_scratch(names, start, hi, geo.out_width, zero)
    )


def _pixel_major_im2col(spec: KernelSpec, names: L.Names, plan: ConvGemm, zero: L.Expr) -> list[L.Stmt]:
    """The pixel-major im2col matrix (a plane of fewer than CONV_PIXELS_AS_COLUMNS_MIN pixels: a small copy): one
    work-item per (image, channel) whose pixels and taps are unrolled here, each element a load at a constant
    offset from the channel's plane, or the zero point, decided here (UNROLLED_IM2COL_MAX of them at most; past
    that, one work-item per (image, k), each element guarded). The guarded form spent a third of a 256-channel 4x4
    conv's time on its 37 KB."""
    geo, x = window(spec), spec.inputs[0]
    taps = [(r, s) for r in range(geo.kernel_height) for s in range(geo.kernel_width)]
    if plan.pixels * len(taps) > UNROLLED_IM2COL_MAX:
        return _guarded_pixel_major_im2col(spec, names, plan, zero)
    plane = geo.height * geo.width

    def channel(v: list[L.Var]) -> list[L.Stmt]:
        image, c = v
        source = (image * x.shape[1] + c) * plane
        stores: list[L.Stmt] = []
        for pixel in range(plan.pixels):
            oh, ow = divmod(pixel, geo.out_width)
            for tap, (r, s) in enumerate(taps):
                ih = oh * geo.stride_height - geo.pad_top + r * geo.dilation_height
                iw = ow * geo.stride_width - geo.pad_left + s * geo.dilation_width
                inside = 0 <= ih < geo.height and 0 <= iw < geo.width
                value = load("in0", x, source + (ih * geo.width + iw)) if inside else zero
                stores.append(
                    L.Store("scratch", (image * plan.pixels + pixel) * plan.depth + c * len(taps) + tap, value)
                )
        return stores

    body, _ = L.loop_nest(names, (plan.images, x.shape[1]), channel, parallel=True)
    return body


def _guarded_pixel_major_im2col(spec: KernelSpec, names: L.Names, plan: ConvGemm, zero: L.Expr) -> list[L.Stmt]:
    """_pixel_major_im2col past UNROLLED_IM2COL_MAX elements per channel: one work-item per (image, k), each element
    guarded."""
    geo, x = window(spec), spec.inputs[0]
    oh, ow = names.var("oh"), names.var("ow")

    def row(v: list[L.Var]) -> list[L.Stmt]:
        image, k = v
        taps = geo.kernel_height * geo.kernel_width
        c, r, s = k / taps, k / geo.kernel_width % geo.kernel_height, k % geo.kernel_width
        inside, in_plane = tap_input(geo, oh, ow, r, s)
        x_at = (image * x.shape[1] + c) * (geo.height * geo.width) + in_plane
        at = (image * plan.pixels + oh * geo.out_width + ow) * plan.depth + k
        store = L.Store("scratch", at, L.select(inside, load("in0", x, x_at), zero))
        return [L.Loop(oh, geo.out_height, [L.Loop(ow, geo.out_width, [store])])]

    body, _ = L.loop_nest(names, (plan.images, plan.depth), row, parallel=True)
    return body


def _conv_units(spec: KernelSpec, names: L.Names, plan: ConvGemm, operands: Operands) -> list[L.Stmt]:
    """The conv's IntGemm units, with its pixels as columns or (ConvGemm.pixels_as_rows) as rows."""
    return (_pixel_row_units if plan.pixels_as_rows else _pixel_column_units)(spec, names, plan, operands)


def _pixel_row_units(spec: KernelSpec, names: L.Names, plan: ConvGemm, operands: Operands) -> list[L.Stmt]:
    """One IntGemm per (image, block of channels): every pixel's row of the image's im2col matrix (A), the block's
    weights (B, read transposed: each channel's k values are contiguous), into the NCHW output (C, transposed)."""
    w_name = given_input_buffer(spec, operands.weight)[0]
    panels = _panels(spec, plan.depth, plan.channels, plan.width)

    def gemm(image: L.Expr, column: L.Expr, columns: int) -> L.IntGemm:
        return L.IntGemm(
            "scratch",
            image * (plan.pixels * plan.depth),
            plan.depth,
            w_name,
            column * plan.depth,
            plan.depth,
            "out0",
            image * (plan.channels * plan.pixels) + column * plan.pixels,
            plan.pixels,
            plan.pixels,
            columns,
            plan.depth,
            a_zero=_line_values(spec, operands.x_zero, L.const(0)),
            b_zero=_line_values(spec, operands.w_zero, column),
            b_transposed=True,
            c_transposed=True,
            requantize=_requantize(spec, operands, column, on_rows=False),
            dequantize=_dequantize(spec, operands, column),
            b_panels=panels,
        )

    return _column_units(names, plan.channels, plan.width, plan.images, gemm)


def _pixel_column_units(spec: KernelSpec, names: L.Names, plan: ConvGemm, operands: Operands) -> list[L.Stmt]:
    """One IntGemm per (image, row block, column block): the weights' rows of the block (A, read in place), the
    block's pixels of the image's im2col matrix (B), into the output's NCHW plane."""
    row_blocks = plan.channels // plan.row_block
    w_name = given_input_buffer(spec, operands.weight)[0]

    def gemm(line: L.Expr, column: L.Expr, columns: int) -> L.IntGemm:
        image, first_row = line / row_blocks, line % row_blocks * plan.row_block
        return L.IntGemm(
            w_name,
            first_row * plan.depth,
            plan.depth,
            "scratch",
            image * (plan.depth * plan.pixels) + column,
            plan.pixels,
            "out0",
            (image * plan.channels + first_row) * plan.pixels + column,
            plan.pixels,
            plan.row_block,
            columns,
            plan.depth,
            a_zero=_line_values(spec, operands.w_zero, first_row),
            b_zero=_line_values(spec, operands.x_zero, L.const(0)),
            requantize=_requantize(spec, operands, first_row, on_rows=True),
        )

    return _column_units(names, plan.pixels, plan.width, plan.images * row_blocks, gemm)
