"""Data-movement ops: reshapes (a flat copy), Transpose, Concat, Pad, Expand, Tile, Slice, Split, Trilu,
DepthToSpace, SpaceToDepth, ReverseSequence, and Einsum (Gemm where the contraction is matmul-shaped).

Every copy works on each buffer dtype (registry.ALL_DTYPES): loads take the buffer's value dtype, stores give it back
unchanged.
"""

from __future__ import annotations

from typing import Any

from farm.ir import loopir as L
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec
from farm.ops.registry import (
    ALL_DTYPES,
    BUFFER_DTYPES,
    NodeContext,
    activate,
    axis_in_range,
    elementwise_loops,
    out_shape,
    prod,
    register,
    shape_of,
)

# ------------------------------------------------------------------------------------------------ dtype helpers


def value_dtype(info: TensorInfo) -> str:
    """The IR dtype of values loaded from (or stored into) a buffer holding `info`."""
    return L.VALUE_DTYPES[BUFFER_DTYPES[info.dtype]]


def load(buf: str, info: TensorInfo, index: L.Expr) -> L.Load:
    """buf[index], typed by the buffer's dtype."""
    return L.Load(buf, index, value_dtype(info))


def typed_const(value: float | int | bool, dtype: str) -> L.Const:
    """A constant of IR value dtype `dtype`."""
    return L.Const(float(value) if dtype in L.FLOATS else int(value), dtype)


def scalar(array: Any) -> float | int | bool:
    """The one element of a constant (a numpy scalar or one-element array) as a Python number."""
    return array.reshape(-1)[0].item()


def no_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {}


def axis_attr(ctx: NodeContext, rank: int | None = None, default: int = 0) -> dict[str, Any]:
    """{"axis": the node's axis attribute in [0, rank)}; rank defaults to input 0's."""
    rank = len(ctx.input_info(0).shape) if rank is None else rank
    return {"axis": axis_in_range(ctx, ctx.node.attrs.get("axis", default), rank)}


def _copy_loops(
    spec: KernelSpec, shape: tuple[int, ...], source_index, out: str = "out0", names: L.Names | None = None
) -> list[L.Stmt]:
    """out[i...] = in0[source_index(i...)] over `shape`, in in0's dtype."""
    x = spec.inputs[0]
    return elementwise_loops(names or L.Names(), shape, lambda v: load("in0", x, source_index(v)), out)


# ---------------------------------------------------------------------------------------------------- reshapes


@register(
    "Reshape", "Squeeze", "Unsqueeze", "Identity", "Dropout", normalize=no_attrs, data_inputs=(0,), dtypes=ALL_DTYPES
)
def _lower_copy(spec: KernelSpec) -> list[L.Stmt]:
    """Reshapes keep the row-major bytes: the kernel copies them, or on a CPU nothing where the planner put the
    output on the input's bytes (farm.plan.in_place)."""
    if spec.for_cpu and spec.attrs.get("in_place"):
        return []
    size = prod(out_shape(spec))
    return elementwise_loops(L.Names(), (size,), lambda v: activate(load("in0", spec.inputs[0], v[0]), spec.activation))


def _flatten_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Flatten copies like a reshape; its axis, in [-rank, rank], is checked only (the output shape holds it)."""
    rank, axis = len(ctx.input_info(0).shape), int(ctx.node.attrs.get("axis", 1))
    if not -rank <= axis <= rank:
        raise ctx.unsupported(f"axis {axis} is out of range for Flatten of rank {rank}")
    return {}


register("Flatten", normalize=_flatten_attrs, data_inputs=(0,), dtypes=ALL_DTYPES)(_lower_copy)


def _transpose_attrs(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.input_info(0).shape)
    perm = [axis_in_range(ctx, p, rank, "perm entry") for p in ctx.node.attrs.get("perm", range(rank - 1, -1, -1))]
    if sorted(perm) != list(range(rank)):
        raise ctx.unsupported(f"perm {ctx.node.attrs['perm']} is not a permutation of the {rank} axes")
    return {"perm": perm}


@register("Transpose", normalize=_transpose_attrs, dtypes=ALL_DTYPES)
def _lower_transpose(spec: KernelSpec) -> list[L.Stmt]:
    perm, in_shape = spec.attrs["perm"], shape_of(spec)

    def source(v: list[L.Var]) -> L.Expr:
        indices: list[L.Expr] = [L.const(0)] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            indices[in_axis] = v[out_axis]
        return L.flat_index(in_shape, indices)

    return _copy_loops(spec, out_shape(spec), source)


def _concat_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"axis": axis_in_range(ctx, ctx.node.attrs["axis"], len(ctx.outputs[0].shape))}


@register("Concat", normalize=_concat_attrs, dtypes=ALL_DTYPES, empty_operands=True)
def _lower_concat(spec: KernelSpec) -> list[L.Stmt]:
    """Each input copied into its slice of the output along `axis` (an empty input copies nothing: the loops over it
    run no iteration, so Concat takes empty operands). On a CPU, a Concat the planner ran in place
    (farm.plan.in_place: its inputs already lie in their slices of the arena) copies nothing."""
    if spec.for_cpu and spec.attrs.get("in_place"):
        return []
    names, axis, shape = L.Names(), spec.attrs["axis"], out_shape(spec)
    body: list[L.Stmt] = []
    start = 0
    for i, info in enumerate(spec.inputs):

        def copy(v: list[L.Var], i: int = i, info=info, start: int = start) -> list[L.Stmt]:
            out_index = [x + start if axis_ == axis else x for axis_, x in enumerate(v)]
            value = activate(load(f"in{i}", info, L.flat_index(info.shape, v)), spec.activation)
            return [L.Store("out0", L.flat_index(shape, out_index), value)]

        loops, _ = L.loop_nest(names, info.shape, copy, parallel=True)
        body += loops
        start += info.shape[axis]
    return body


# -------------------------------------------------------------------------------------------------------- Pad


def _pad_attrs(ctx: NodeContext) -> dict[str, Any]:
    """pads and the constant from attributes (opset < 11) or constant inputs (opset >= 11)."""
    attrs = ctx.node.attrs
    pads_input, value_input = ctx.constant(1), ctx.constant(2)
    if ctx.constant(3) is not None:
        raise ctx.unsupported("Pad's axes input is not supported")
    pads = [int(p) for p in (pads_input if pads_input is not None else attrs.get("pads", []))]
    value = scalar(value_input) if value_input is not None and value_input.size else float(attrs.get("value", 0.0))
    if len(pads) != 2 * len(ctx.input_info(0).shape):
        raise ctx.unsupported(
            f"pads {pads} must hold two values per axis of the rank-{len(ctx.input_info(0).shape)} input"
        )
    mode = attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise ctx.unsupported(f"Pad mode {mode!r} is not supported (constant, reflect, edge are)")
    if mode == "reflect":
        _check_reflect_pads(ctx, pads)
    return {"pads": pads, "value": value, "mode": mode}


def _check_reflect_pads(ctx: NodeContext, pads: list[int]) -> None:
    """A reflection mirrors once: a pad of the dim or more would read outside the input (onnxruntime refuses it
    too), so each pad must be at most the dim less one."""
    shape = ctx.input_info(0).shape
    for axis, dim in enumerate(shape):
        begin, end = pads[axis], pads[axis + len(shape)]
        if max(begin, end) > dim - 1:
            raise ctx.unsupported(f"reflect pads {begin}, {end} of axis {axis} exceed its size {dim} less one")


def _reflect(i: L.Expr, size: int) -> L.Expr:
    folded = L.select(L.compare("lt", i, 0), -i, i)
    return L.select(L.compare("ge", folded, size), 2 * (size - 1) - folded, folded)


PAD_MODES = {
    "constant": lambda i, size: L.minimum(L.maximum(i, 0), size - 1),
    "edge": lambda i, size: L.minimum(L.maximum(i, 0), size - 1),
    "reflect": _reflect,
}


@register("Pad", normalize=_pad_attrs, data_inputs=(0,), dtypes=ALL_DTYPES)
def _lower_pad(spec: KernelSpec) -> list[L.Stmt]:
    a, x = spec.attrs, spec.inputs[0]
    in_shape, source_index = x.shape, PAD_MODES[a["mode"]]

    def value(v: list[L.Var]) -> L.Expr:
        coords = [i - a["pads"][axis] for axis, i in enumerate(v)]
        loaded = load("in0", x, L.flat_index(in_shape, [source_index(c, n) for c, n in zip(coords, in_shape)]))
        if a["mode"] != "constant" or not in_shape:
            return activate(loaded, spec.activation)
        inside = L.logical_and(
            *[L.logical_and(L.compare("ge", c, 0), L.compare("lt", c, n)) for c, n in zip(coords, in_shape)]
        )
        return activate(L.select(inside, loaded, typed_const(a["value"], loaded.dtype)), spec.activation)

    return elementwise_loops(L.Names(), out_shape(spec), value)


# ------------------------------------------------------------------------------------------ Expand and Tile


@register("Expand", normalize=no_attrs, data_inputs=(0,), dtypes=ALL_DTYPES)
def _lower_expand(spec: KernelSpec) -> list[L.Stmt]:
    """numpy broadcasting to the (statically inferred) output shape."""
    shape = out_shape(spec)
    return _copy_loops(spec, shape, lambda v: L.broadcast_index(shape_of(spec), shape, v))


@register("Tile", normalize=no_attrs, data_inputs=(0,), dtypes=ALL_DTYPES)
def _lower_tile(spec: KernelSpec) -> list[L.Stmt]:
    """out[r*n + i] = in[i] per axis: loops over (repeat, index) pairs in output order, so no division."""
    in_shape, shape = shape_of(spec), out_shape(spec)
    extents = [e for n, size in zip(in_shape, shape) for e in (size // n, n)]

    def copy(v: list[L.Var]) -> list[L.Stmt]:
        repeats, indices = v[0::2], v[1::2]
        out_index = [r * n + i for r, i, n in zip(repeats, indices, in_shape)]
        return [
            L.Store(
                "out0", L.flat_index(shape, out_index), load("in0", spec.inputs[0], L.flat_index(in_shape, indices))
            )
        ]

    body, _ = L.loop_nest(L.Names(), tuple(extents), copy, parallel=True)
    return body


# ------------------------------------------------------------------------------------------------------ Slice


def _slice_inputs(ctx: NodeContext) -> tuple[list[int], list[int], list[int], list[int]]:
    """starts, ends, axes and steps from attributes (opset < 10) or constant inputs (opset >= 10)."""
    if ctx.opset < 10:
        a = ctx.node.attrs
        starts, ends = list(a["starts"]), list(a["ends"])
        return starts, ends, list(a.get("axes", range(len(starts)))), [1] * len(starts)
    start_values, end_values, axis_values, step_values = (ctx.constant(i) for i in range(1, 5))
    if start_values is None or end_values is None:
        raise ctx.unsupported("required input starts or ends is missing")
    starts, ends = [int(s) for s in start_values], [int(e) for e in end_values]
    axes = list(range(len(starts))) if axis_values is None else [int(axis) for axis in axis_values]
    steps = [1] * len(starts) if step_values is None else [int(step) for step in step_values]
    return starts, ends, axes, steps


def _slice_start(start: int, step: int, dim: int) -> int:
    """ONNX's clamping of a start: negative counts from the end, then into [0, dim] ([0, dim-1] for step < 0)."""
    start = start + dim if start < 0 else start
    return max(0, min(start, dim if step > 0 else dim - 1))


def _slice_attrs(ctx: NodeContext) -> dict[str, Any]:
    """The first index and the step of every axis (0 and 1 where the axis is not sliced)."""
    shape = ctx.input_info(0).shape
    rank = len(shape)
    starts, ends, axes, steps = _slice_inputs(ctx)
    first, stride = [0] * rank, [1] * rank
    for start, axis, step in zip(starts, axes, steps):
        if not -rank <= axis < rank:
            raise ctx.unsupported(f"Slice axis {axis} is out of range for rank {rank}")
        if step == 0:
            raise ctx.unsupported("Slice step 0 is invalid")
        axis %= rank
        first[axis], stride[axis] = _slice_start(start, step, shape[axis]), step
    return {"starts": first, "steps": stride}


@register("Slice", normalize=_slice_attrs, data_inputs=(0,), dtypes=ALL_DTYPES)
def _lower_slice(spec: KernelSpec) -> list[L.Stmt]:
    """out[i] = in[start + step * i] per axis (the output shape already holds the clamped extents)."""
    starts, steps = spec.attrs["starts"], spec.attrs["steps"]
    return _copy_loops(
        spec,
        out_shape(spec),
        lambda v: L.flat_index(shape_of(spec), [i * step + start for i, start, step in zip(v, starts, steps)]),
    )


# ------------------------------------------------------------------------------------------------------ Split


@register("Split", normalize=axis_attr, data_inputs=(0,), dtypes=ALL_DTYPES, empty_operands=True)
def _lower_split(spec: KernelSpec) -> list[L.Stmt]:
    """Each output copies its slab of the input along `axis`; the output shapes hold the split sizes, however the
    node gave them (the split attribute or input, num_outputs, or equal parts). An output of a zero-size split gets
    loops of no iteration, so Split takes empty operands."""
    names, axis, in_shape = L.Names(), spec.attrs["axis"], shape_of(spec)
    body: list[L.Stmt] = []
    start = 0
    for i, info in enumerate(spec.outputs):

        def source(v: list[L.Var], start: int = start) -> L.Expr:
            return L.flat_index(in_shape, [x + start if a == axis else x for a, x in enumerate(v)])

        body += _copy_loops(spec, info.shape, source, out=f"out{i}", names=names)
        start += info.shape[axis]
    return body


# ------------------------------------------------------------------------------------------------------ Trilu


def _trilu_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"upper": int(ctx.node.attrs.get("upper", 1))}


@register("Trilu", normalize=_trilu_attrs, dtypes=ALL_DTYPES)
def _lower_trilu(spec: KernelSpec) -> list[L.Stmt]:
    """Keep the elements on and above (upper) or on and below (lower) the k-th diagonal of the last two axes; k is
    read from its (one-element) input, so a constant and a computed k share the kernel."""
    shape, x = out_shape(spec), spec.inputs[0]
    keep_op = "ge" if spec.attrs["upper"] else "le"
    k = load("in1", spec.inputs[1], L.const(0)) if len(spec.inputs) > 1 else L.const(0)

    def value(v: list[L.Var]) -> L.Expr:
        loaded = load("in0", x, L.flat_index(shape, v))
        return L.select(L.compare(keep_op, v[-1] - v[-2], k), loaded, typed_const(0, loaded.dtype))

    return elementwise_loops(L.Names(), shape, value)


# ------------------------------------------------------------------------------------ DepthToSpace, SpaceToDepth


def _block_attrs(ctx: NodeContext) -> dict[str, Any]:
    if len(ctx.input_info(0).shape) != 4:
        raise ctx.unsupported("only 4-D (NCHW) inputs are supported")
    mode = ctx.node.attrs.get("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise ctx.unsupported(f"mode {mode!r} is not supported (DCR, CRD are)")
    return {"blocksize": int(ctx.node.attrs["blocksize"]), "mode": mode}


def _block_channel(spec: KernelSpec, c: L.Expr, i: L.Expr, j: L.Expr, channels: int) -> L.Expr:
    """The depth channel that holds block offset (i, j) of space channel c (of `channels`)."""
    b = spec.attrs["blocksize"]
    return (i * b + j) * channels + c if spec.attrs["mode"] == "DCR" else (c * b + i) * b + j


def _space_loops(spec: KernelSpec, space_shape: tuple[int, ...], store) -> list[L.Stmt]:
    """Loops over (n, c, h, i, w, j), the space tensor's [N, C, H*b, W*b] in row-major order; `store` gets the
    variables and the space tensor's flat index."""
    n, c, hb, wb = space_shape
    b = spec.attrs["blocksize"]
    extents = (n, c, hb // b, b, wb // b, b)

    def body(v: list[L.Var]) -> list[L.Stmt]:
        return store(v, L.flat_index(space_shape, [v[0], v[1], v[2] * b + v[3], v[4] * b + v[5]]))

    loops, _ = L.loop_nest(L.Names(), extents, body, parallel=True)
    return loops


@register("DepthToSpace", normalize=_block_attrs, dtypes=ALL_DTYPES)
def _lower_depth_to_space(spec: KernelSpec) -> list[L.Stmt]:
    x, shape = spec.inputs[0], out_shape(spec)

    def store(v: list[L.Var], out_index: L.Expr) -> list[L.Stmt]:
        bn, c, h, i, w, j = v
        source = L.flat_index(x.shape, [bn, _block_channel(spec, c, i, j, shape[1]), h, w])
        return [L.Store("out0", out_index, load("in0", x, source))]

    return _space_loops(spec, shape, store)


@register("SpaceToDepth", normalize=_block_attrs, dtypes=ALL_DTYPES)
def _lower_space_to_depth(spec: KernelSpec) -> list[L.Stmt]:
    """The inverse permutation: loops over the input (the space tensor), storing each element into its depth slot."""
    x, shape = spec.inputs[0], out_shape(spec)

    def store(v: list[L.Var], in_index: L.Expr) -> list[L.Stmt]:
        bn, c, h, i, w, j = v
        target = L.flat_index(shape, [bn, _block_channel(spec, c, i, j, x.shape[1]), h, w])
        return [L.Store("out0", target, load("in0", x, in_index))]

    return _space_loops(spec, x.shape, store)


# -------------------------------------------------------------------------------------------- ReverseSequence


def _reverse_sequence_attrs(ctx: NodeContext) -> dict[str, Any]:
    a = ctx.node.attrs
    axes = {"batch_axis": int(a.get("batch_axis", 1)), "time_axis": int(a.get("time_axis", 0))}
    if sorted(axes.values()) != [0, 1]:
        raise ctx.unsupported(
            f"batch_axis {axes['batch_axis']} and time_axis {axes['time_axis']} must be 0 and 1, one each"
        )
    return axes


@register("ReverseSequence", normalize=_reverse_sequence_attrs, dtypes=ALL_DTYPES)
def _lower_reverse_sequence(spec: KernelSpec) -> list[L.Stmt]:
    """out[.., t, .., b, ..] = x[.., lens[b] - 1 - t, .., b, ..] for t < lens[b], else x itself."""
    x, lens = spec.inputs
    time, batch = spec.attrs["time_axis"], spec.attrs["batch_axis"]
    steps = x.shape[time]

    def value(v: list[L.Var]) -> L.Expr:
        length = L.minimum(L.maximum(load("in1", lens, v[batch]), 0), steps)
        t = L.select(L.compare("lt", v[time], length), length - 1 - v[time], v[time])
        return load("in0", x, L.flat_index(x.shape, [t if axis == time else i for axis, i in enumerate(v)]))

    return elementwise_loops(L.Names(), out_shape(spec), value)


# ----------------------------------------------------------------------------------------------------- Einsum

# Symbols that stand for the dims an ellipsis covers (equation letters are [a-zA-Z]), right-aligned.
ELLIPSIS_SYMBOLS = "0123456789"


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each input's subscripts and the output's, with every ellipsis spelled out as ELLIPSIS_SYMBOLS."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"{len(terms)} terms for {len(ranks)} inputs")
    covered = [rank - (len(term) - 3) for term, rank in zip(terms, ranks) if "..." in term]
    symbols = ELLIPSIS_SYMBOLS[: max(covered, default=0)]
    inputs = [
        term.replace("...", symbols[len(symbols) - (rank - len(term) + 3) :]) if "..." in term else term
        for term, rank in zip(terms, ranks)
    ]
    if any(len(term) != rank for term, rank in zip(inputs, ranks)):
        raise ValueError("a term's subscripts don't match its input's rank")
    if arrow:
        return inputs, rhs.replace("...", symbols)
    once = [s for s in sorted(set("".join(inputs))) if s.isalpha() and "".join(inputs).count(s) == 1]
    return inputs, symbols + "".join(once)


def _einsum_attrs(ctx: NodeContext) -> dict[str, Any]:
    try:
        inputs, output = _einsum_terms(
            ctx.node.attrs["equation"], [len(ctx.input_info(i).shape) for i in range(len(ctx.inputs))]
        )
    except ValueError as exc:
        raise ctx.unsupported(f"Einsum equation {ctx.node.attrs['equation']!r}: {exc}") from exc
    return {"inputs": inputs, "output": output}


class _Einsum:
    """An equation over static shapes: the size of every subscript and, per input, its subscripts with the
    broadcast ones (size 1 where the subscript is bigger elsewhere) as None, so that they index element 0."""

    def __init__(self, spec: KernelSpec):
        self.spec, self.output = spec, spec.attrs["output"]
        self.sizes: dict[str, int] = {}
        for term, info in zip(spec.attrs["inputs"], spec.inputs):
            for s, dim in zip(term, info.shape):
                self.sizes[s] = max(self.sizes.get(s, 1), dim)
        self.terms = [
            [s if dim == self.sizes[s] else None for s, dim in zip(term, info.shape)]
            for term, info in zip(spec.attrs["inputs"], spec.inputs)
        ]

    def shape(self, subscripts) -> tuple[int, ...]:
        return tuple(self.sizes[s] for s in subscripts)

    def load(self, i: int, var_of: dict[str, L.Expr]) -> L.Expr:
        info = self.spec.inputs[i]
        return load(
            f"in{i}", info, L.flat_index(info.shape, [L.const(0) if s is None else var_of[s] for s in self.terms[i]])
        )

    def gemm_roles(self) -> dict[str, list[str]] | None:
        """batch, m, n and k subscripts when the equation is a (batched) matrix product of two float32 inputs: a
        contraction (k not empty), no diagonal, no subscript summed within one input. Else None."""
        if len(self.terms) != 2 or any(info.dtype != "float32" for info in self.spec.inputs):
            return None
        a, b = ([s for s in term if s is not None] for term in self.terms)
        if len(set(a)) != len(a) or len(set(b)) != len(b):
            return None
        summed = [s for s in a + b if s not in self.output]
        if not summed or any(s not in a or s not in b for s in summed):
            return None
        return {
            "batch": [s for s in self.output if s in a and s in b],
            "m": [s for s in self.output if s in a and s not in b],
            "n": [s for s in self.output if s in b and s not in a],
            "k": [s for s in a if s not in self.output],
        }


def _einsum_layouts(e: _Einsum, roles: dict[str, list[str]]) -> list[tuple[list[str], int]]:
    """(canonical subscripts, scratch offset) of A, B and C: [batch, m, k], [batch, k, n], [batch, m, n]. The
    offset is -1 where the tensor already has that layout (the Gemm reads or writes it in place)."""
    wanted = [
        roles["batch"] + roles["m"] + roles["k"],
        roles["batch"] + roles["k"] + roles["n"],
        roles["batch"] + roles["m"] + roles["n"],
    ]
    actual = [[s for s in term if s is not None] for term in e.terms] + [list(e.output)]
    layouts, offset = [], 0
    for want, have in zip(wanted, actual):
        if want == have:
            layouts.append((want, -1))
        else:
            layouts.append((want, offset))
            offset += prod(e.shape(want))
    return layouts


def _einsum_scratch(spec: KernelSpec) -> int:
    e = _Einsum(spec)
    roles = e.gemm_roles()
    if roles is None:
        return 0
    return sum(prod(e.shape(subs)) for subs, offset in _einsum_layouts(e, roles) if offset >= 0)


def _permute_loops(names: L.Names, e: _Einsum, subscripts: list[str], store) -> list[L.Stmt]:
    """Loops over `subscripts` (parallel); store(var_of) gives the body."""
    body, _ = L.loop_nest(names, e.shape(subscripts), lambda v: store(dict(zip(subscripts, v))), parallel=True)
    return body


def _einsum_gemm(e: _Einsum, roles: dict[str, list[str]]) -> list[L.Stmt]:
    """Transpose A and B into [batch, m, k] and [batch, k, n] where they aren't, one Gemm per batch, then C from
    [batch, m, n] into the output's order if that differs."""
    names = L.Names()
    (a_subs, a_at), (b_subs, b_at), (c_subs, c_at) = _einsum_layouts(e, roles)
    body: list[L.Stmt] = []
    for i, (subs, at) in enumerate(((a_subs, a_at), (b_subs, b_at))):
        if at >= 0:
            body += _permute_loops(
                names,
                e,
                subs,
                lambda var_of, i=i, subs=subs, at=at: [
                    L.Store("scratch", at + L.flat_index(e.shape(subs), [var_of[s] for s in subs]), e.load(i, var_of))
                ],
            )
    m, n, k, batches = (prod(e.shape(roles[r])) for r in ("m", "n", "k", "batch"))
    where = [
        ("in0", 0) if a_at < 0 else ("scratch", a_at),
        ("in1", 0) if b_at < 0 else ("scratch", b_at),
        ("out0", 0) if c_at < 0 else ("scratch", c_at),
    ]

    def gemm(batch: L.Expr) -> L.Gemm:
        (a, a0), (b, b0), (c, c0) = where
        return L.Gemm(a, batch * (m * k) + a0, k, b, batch * (k * n) + b0, n, c, batch * (m * n) + c0, n, m, n, k)

    if batches == 1:
        body.append(gemm(L.const(0)))
    else:
        batch = names.var("b")
        body.append(L.Loop(batch, batches, [gemm(batch)], parallel=True))
    if c_at >= 0:
        out = list(e.output)
        body += _permute_loops(
            names,
            e,
            out,
            lambda var_of: [
                L.Store(
                    "out0",
                    L.flat_index(e.shape(out), [var_of[s] for s in out]),
                    L.Load("scratch", c_at + L.flat_index(e.shape(c_subs), [var_of[s] for s in c_subs])),
                )
            ],
        )
    return body


def _einsum_loops(e: _Einsum) -> list[L.Stmt]:
    """Any equation: a parallel loop nest over the output's subscripts and a sequential one over the summed ones,
    accumulating the product of the inputs' elements (diagonals index one input twice with one variable)."""
    names, out = L.Names(), list(e.output)
    summed = [s for s in dict.fromkeys("".join(e.spec.attrs["inputs"])) if s not in out]
    dtype = value_dtype(e.spec.outputs[0])

    def element(var_of: dict[str, L.Expr]) -> list[L.Stmt]:
        acc = names.local("acc", dtype)

        def accumulate(inner: dict[str, L.Expr]) -> list[L.Stmt]:
            product: L.Expr = e.load(0, inner)
            for i in range(1, len(e.terms)):
                product = product * e.load(i, inner)
            return [L.Assign(acc, acc + product)]

        sums, _ = L.loop_nest(names, e.shape(summed), lambda v: accumulate({**var_of, **dict(zip(summed, v))}))
        store = L.Store("out0", L.flat_index(e.shape(out), [var_of[s] for s in out]), acc)
        return [L.Assign(acc, typed_const(0, dtype)), *sums, store]

    return _permute_loops(names, e, out, element)


@register("Einsum", normalize=_einsum_attrs, scratch_floats=_einsum_scratch)
def _lower_einsum(spec: KernelSpec) -> list[L.Stmt]:
    e = _Einsum(spec)
    roles = e.gemm_roles()
    return _einsum_loops(e) if roles is None else _einsum_gemm(e, roles)
