"""DFT (opsets 17 and 20) as a direct O(n^2) transform: every output bin sums its input bins times twiddles.

The signal is the input's last axis of size 1 (real) or 2 (real, imaginary); the transform runs along `axis`
(an attribute at opset 17, an input from 20). Forward bins are X[k] = sum_j x[j] e^(-2 pi i jk / n), inverse ones
the conjugate sum over n; `onesided` keeps bins 0 .. n/2 of a forward transform, and of an inverse one (as ONNX's
reference defines it since onnx 1.18) reads those bins of a Hermitian spectrum and gives the real signal
(numpy's irfft: the output's last axis has size 1). dft_length n pads the input with zeros or truncates it.

Twiddles come from a table of cos and sin of 2 pi m / n for m in [0, n), which the kernel's prologue fills in
scratch; bin products index it by the exact integer (j k) mod n, so no angle grows past 2 pi. Sums accumulate in
float32 in input order.

From opset 20 the axis may be a graph input. The output's shape is static, so the kernel then holds a branch for
every axis whose transform has that shape, and picks one by the value it reads; a value that matches none fills
the output with NaN (the model's shapes say that value cannot occur).
"""

from __future__ import annotations

import math
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.mathfns import Scope, cos, sin
from farm.ops.registry import NodeContext, register
from farm.ops.tensor import load, scalar

AXIS_INPUT_OPSET = 20


def _constant_axis(ctx: NodeContext) -> int | None:
    """The axis as an integer, or None when it is a graph input (opset 20 and later)."""
    if ctx.opset < AXIS_INPUT_OPSET:
        return int(ctx.node.attrs.get("axis", 1))
    name = ctx.node.inputs[2] if len(ctx.node.inputs) > 2 else ""
    if not name:
        return -2
    return int(scalar(ctx.constants[name])) if name in ctx.constants else None


def _dft_length(ctx: NodeContext, size: int, inverse: bool, onesided: bool) -> int:
    """n: dft_length if given (it must be constant), else the axis's size (2 (size - 1) for an inverse onesided
    transform, whose input holds bins 0 .. n/2)."""
    given = ctx.constant(1)
    return int(scalar(given)) if given is not None else 2 * (size - 1) if inverse and onesided else size


def _output_shape(shape: tuple[int, ...], axis: int, length: int, inverse: bool, onesided: bool) -> tuple[int, ...]:
    bins = length // 2 + 1 if onesided and not inverse else length
    last = 1 if onesided and inverse else 2
    return (*shape[:axis], bins, *shape[axis + 1 : -1], last)


def _candidate(ctx: NodeContext, axis: int, inverse: bool, onesided: bool) -> dict[str, int] | None:
    """{"axis", "length"} for an axis whose transform has the node's output shape (and a length of at least 1),
    else None."""
    shape = ctx.input_info(0).shape
    length = _dft_length(ctx, shape[axis], inverse, onesided)
    fits = length >= 1 and _output_shape(shape, axis, length, inverse, onesided) == tuple(ctx.outputs[0].shape)
    return {"axis": axis, "length": length} if fits else None


def _check_input(ctx: NodeContext) -> None:
    x = ctx.input_info(0)
    if x.dtype != "float32":
        raise ctx.unsupported(f"DFT of {x.dtype} is not supported (float32 is)")
    if len(x.shape) < 2 or x.shape[-1] not in (1, 2):
        raise ctx.unsupported(f"the input {list(x.shape)} must end in an axis of 1 (real) or 2 (complex)")


def _dft_attrs(ctx: NodeContext) -> dict[str, Any]:
    """inverse, onesided, and the candidate axes (one for a constant axis) with their DFT lengths."""
    _check_input(ctx)
    rank = len(ctx.input_info(0).shape)
    inverse, onesided = bool(int(ctx.node.attrs.get("inverse", 0))), bool(int(ctx.node.attrs.get("onesided", 0)))
    axis = _constant_axis(ctx)
    if axis is not None and not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise ctx.unsupported(f"axis {axis} is out of range for rank {rank}")
    axes = range(rank - 1) if axis is None else [axis % rank]
    candidates = [c for c in (_candidate(ctx, a, inverse, onesided) for a in axes) if c is not None]
    if not candidates:
        raise ctx.unsupported(f"no DFT axis of length >= 1 gives the output shape {list(ctx.outputs[0].shape)}")
    return {"inverse": inverse, "onesided": onesided, "axes": candidates, "runtime_axis": axis is None}


def _table_offsets(spec: KernelSpec) -> list[int]:
    """Where each candidate's twiddle table (n cosines then n sines) starts in scratch."""
    offsets, at = [], 0
    for candidate in spec.attrs["axes"]:
        offsets.append(at)
        at += 2 * candidate["length"]
    return offsets


def _dft_scratch(spec: KernelSpec) -> int:
    return sum(2 * candidate["length"] for candidate in spec.attrs["axes"])


def _twiddle_table(names: L.Names, length: int, at: int) -> list[L.Stmt]:
    """scratch[at + m] = cos(2 pi m / n), scratch[at + n + m] = sin(2 pi m / n), one work-item per m."""
    m, s = names.var("m"), Scope(names)
    angle = s.bind(L.to_float(m) * (2.0 * math.pi / length))
    stores = [L.Store("scratch", at + m, cos(s, angle)), L.Store("scratch", at + length + m, sin(s, angle))]
    return [L.Loop(m, length, [*s.stmts, *stores], parallel=True)]


def _input_bins(spec: KernelSpec, axis: int, length: int) -> int:
    """How many input bins the sum reads: the first n (zeros past the input), or of an inverse onesided
    transform's Hermitian half only bins 0 .. n/2."""
    size = spec.inputs[0].shape[axis]
    return min(size, length // 2 + 1) if spec.attrs["inverse"] and spec.attrs["onesided"] else min(size, length)


def _bin_weight(spec: KernelSpec, j: L.Var, length: int) -> L.Expr | None:
    """An inverse onesided transform counts each bin between 0 and n/2 twice (for its mirror image), else None."""
    if not (spec.attrs["inverse"] and spec.attrs["onesided"]):
        return None
    single = L.compare("eq", j, 0)
    if length % 2 == 0:
        single = L.binary("or", single, L.compare("eq", j, length // 2))
    return L.select(single, 1.0, 2.0)


def _transform(spec: KernelSpec, names: L.Names, v: list[L.Var], candidate: dict[str, int], at: int) -> list[L.Stmt]:
    """Output bin v (less its last axis) along the candidate's axis: the sum over input bins, then its stores."""
    x, out = spec.inputs[0], spec.outputs[0].shape
    axis, length = candidate["axis"], candidate["length"]
    j, re, im = names.var("j"), names.local("re"), names.local("im")
    sign = 1.0 if spec.attrs["inverse"] else -1.0

    def part(p: int) -> L.Expr:
        return load("in0", x, L.flat_index(x.shape, [*v[:axis], j, *v[axis + 1 :], L.const(p)]))

    real, imag = part(0), part(1) if x.shape[-1] == 2 else L.const(0.0)
    m = (j * v[axis]) % length
    c, s = L.Load("scratch", at + m), L.Load("scratch", at + length + m) * sign
    weight = _bin_weight(spec, j, length)
    re_term, im_term = real * c - imag * s, imag * c + real * s
    body: list[L.Stmt] = [L.Assign(re, re + (re_term if weight is None else weight * re_term))]
    if out[-1] == 2:
        body.append(L.Assign(im, im + im_term))
    scale = 1.0 / length if spec.attrs["inverse"] else 1.0
    stores = [
        L.Store("out0", L.flat_index(out, [*v, L.const(p)]), acc * scale) for p, acc in enumerate((re, im)[: out[-1]])
    ]
    return [
        L.Assign(re, L.const(0.0)),
        L.Assign(im, L.const(0.0)),
        L.Loop(j, _input_bins(spec, axis, length), body),
        *stores,
    ]


def _runtime_axis(spec: KernelSpec) -> L.Expr:
    """The axis read from its input (in1), negative values counted from the back."""
    rank = len(spec.inputs[0].shape)
    raw = load("in1", spec.inputs[1], L.const(0))
    return L.select(L.compare("lt", raw, 0), raw + rank, raw)


def _branches(spec: KernelSpec, names: L.Names, v: list[L.Var]) -> list[L.Stmt]:
    """A branch per candidate axis, chosen by the axis input, and NaN when the value matches none."""
    axis, out = names.local("axis", L.I64), spec.outputs[0].shape
    stmts: list[L.Stmt] = [L.Assign(axis, _runtime_axis(spec))]
    matched: L.Expr | None = None
    for candidate, at in zip(spec.attrs["axes"], _table_offsets(spec)):
        here = L.compare("eq", axis, candidate["axis"])
        stmts.append(L.If(here, _transform(spec, names, v, candidate, at)))
        matched = here if matched is None else L.binary("or", matched, here)
    nan: list[L.Stmt] = [
        L.Store("out0", L.flat_index(out, [*v, L.const(p)]), L.const(math.nan)) for p in range(out[-1])
    ]
    assert matched is not None, "_dft_attrs refuses a node without a candidate axis"
    return [*stmts, L.If(L.compare("eq", matched, L.Const(0, L.BOOL)), nan)]


@register("DFT", normalize=_dft_attrs, data_inputs=(0, 2), scratch_floats=_dft_scratch)
def _lower_dft(spec: KernelSpec) -> list[L.Stmt]:
    """The twiddle tables, then a work-item per output bin."""
    names = L.Names()
    tables = [
        stmt
        for candidate, at in zip(spec.attrs["axes"], _table_offsets(spec))
        for stmt in _twiddle_table(names, candidate["length"], at)
    ]

    def bin_(v: list[L.Var]) -> list[L.Stmt]:
        if spec.attrs["runtime_axis"]:
            return _branches(spec, names, v)
        return _transform(spec, names, v, spec.attrs["axes"][0], 0)

    body, _ = L.loop_nest(names, spec.outputs[0].shape[:-1], bin_, parallel=True)
    return tables + body
