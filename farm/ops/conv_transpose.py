"""ConvTranspose over any number of spatial axes, through the IR's Gemm primitive: per (batch, group), a Gemm of the
transposed weights by the input into a column buffer of every tap's contribution, then col2im, where each output
pixel gathers the contributions that land on it. Conv's lowering (conv.py) shares its grouped channels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.conv import GroupedChannels, grouped_channels
from farm.ops.registry import NodeContext, activate, out_shape, prod, register, shape_of


def _conv_transpose_attrs(ctx: NodeContext) -> dict[str, Any]:
    """kernel_shape, strides, dilations, group and the begin pad of each spatial axis (all the kernel needs besides
    the output shape; output_padding and end pads only shape the output)."""
    x, a = ctx.input_info(0), ctx.node.attrs
    spatial = len(x.shape) - 2
    if spatial < 1:
        raise ctx.unsupported("ConvTranspose needs at least one spatial axis (N, C, D...)")
    ones = [1] * spatial
    kernel = [int(k) for k in a.get("kernel_shape", ctx.input_info(1).shape[2:])]
    strides, dilations = list(a.get("strides", ones)), list(a.get("dilations", ones))
    return {
        "kernel_shape": kernel,
        "strides": strides,
        "dilations": dilations,
        "group": int(a.get("group", 1)),
        "pads": _transpose_pad_begins(ctx, kernel, strides, dilations),
    }


def _transpose_pad_begins(ctx: NodeContext, kernel: list[int], strides: list[int], dilations: list[int]) -> list[int]:
    """Begin pads: from `pads`, or, for output_shape or SAME auto_pad, from the total padding that yields the target
    size, split as ONNX says (the odd one at the end for SAME_UPPER, at the begin otherwise)."""
    a, sizes = ctx.node.attrs, ctx.input_info(0).shape[2:]
    auto_pad = a.get("auto_pad", "NOTSET")
    if "output_shape" not in a and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return [0] * len(sizes) if auto_pad == "VALID" else list(a.get("pads", [0] * 2 * len(sizes)))[: len(sizes)]
    targets = list(a["output_shape"])[-len(sizes) :] if "output_shape" in a else [n * s for n, s in zip(sizes, strides)]
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
    return ConvTransposeGeometry(
        **asdict(grouped_channels(spec)), in_sizes=sizes, out_sizes=out_sizes, taps=prod(spec.attrs["kernel_shape"])
    )


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


def _taps_landing_on(
    o: L.Expr, j: L.Var, size: int, kernel: int, stride: int, dilation: int, pad: int
) -> tuple[int, L.Expr, list[L.Expr], L.Expr]:
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
    for o, j, size, kernel, stride, dilation, pad in zip(
        outs, loop_vars, geo.in_sizes, a["kernel_shape"], a["strides"], a["dilations"], a["pads"]
    ):
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
    gemm = L.Gemm(
        a="scratch",
        a_offset=group * (geo.column_rows * group_in),
        lda=group_in,
        b="in0",
        b_offset=(batch * geo.in_channels + group * group_in) * pixels,
        ldb=pixels,
        c="scratch",
        c_offset=L.const(geo.column_start),
        ldc=pixels,
        m=geo.column_rows,
        n=pixels,
        k=group_in,
    )
    per_group = [gemm, *_col2im(names, spec, geo, batch, group)]
    return _transpose_weights(names, geo) + [L.Loop(batch, geo.batch, [L.Loop(group, geo.groups, per_group)])]
