"""Reductions over any set of axes, ArgMax/ArgMin and TopK.

Every kernel here is one parallel loop with a work-item per output element (or per row along an axis), the
reduction running sequentially inside it. The Reduce* kernels take empty operands: a reduction of an empty input
stores ONNX's value over nothing (OVER_NOTHING). `ReduceLayout` and `over_rows` are shared with the
normalisations (farm.ops.normalization) and the softmax family (farm.ops.softmax), NEG_INF with the latter and the
pools (farm.ops.pool).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import NodeContext, axis_in_range, elementwise_loops, prod, register, shape_of

FLOAT = frozenset({"float32"})
NUMERIC = frozenset({"float32", "int64", "int32"})
ORDERED = NUMERIC | {"bool"}
NEG_INF = -3.4028234663852886e38
"""The lowest float32: where the max of a softmax row or of a GlobalMaxPool's plane starts."""

# ---------------------------------------------------------------------------------------------------- layouts


@dataclass(frozen=True)
class ReduceLayout:
    """A row-major input split into runs of kept and of reduced axes, as (extent, stride) pairs, outer first.

    Adjacent axes of one kind merge into a run and axes of extent 1 drop out, so that reducing the last two axes
    of NCHW is one kept run (N*C) and one reduced run (H*W). The output's flat index is the row-major index over
    the kept runs, whether or not the reduced axes are kept as ones.
    """

    kept: tuple[tuple[int, int], ...]
    reduced: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, shape: tuple[int, ...], axes: list[int]) -> ReduceLayout:
        runs: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        previous: bool | None = None
        for axis, (extent, stride) in enumerate(zip(shape, L.strides_of(shape))):
            if extent == 1:
                continue
            reduced = axis in axes
            if reduced == previous:
                outer, _ = runs[reduced][-1]
                runs[reduced][-1] = (outer * extent, stride)
            else:
                runs[reduced].append((extent, stride))
            previous = reduced
        return cls(tuple(runs[False]), tuple(runs[True]))

    @property
    def outputs(self) -> int:
        return prod([extent for extent, _ in self.kept])

    @property
    def count(self) -> int:
        """How many input elements each output reduces."""
        return prod([extent for extent, _ in self.reduced])

    def over_outputs(self, names: L.Names, body: Callable[[L.Expr, L.Expr], list[L.Stmt]]) -> list[L.Stmt]:
        """One parallel loop over the output elements: body(output index, input offset of its first element)."""
        out = names.var("o")
        base: L.Expr = L.const(0)
        rest: L.Expr = out
        for position, (extent, stride) in enumerate(reversed(self.kept)):
            outermost = position == len(self.kept) - 1
            base = base + (rest if outermost else rest % extent) * stride
            rest = rest // extent
        return [L.Loop(out, self.outputs, body(out, base), parallel=True)]

    def over_reduced(self, names: L.Names, base: L.Expr, body: Callable[[L.Expr], list[L.Stmt]]) -> list[L.Stmt]:
        """Sequential loops over the elements one output reduces: body(input index)."""
        loop_vars = [names.var("r") for _ in self.reduced]
        index = base
        for var, (_, stride) in zip(loop_vars, self.reduced):
            index = index + var * stride
        stmts = body(index)
        for var, (extent, _) in reversed(list(zip(loop_vars, self.reduced))):
            stmts = [L.Loop(var, extent, stmts)]
        return stmts


def over_rows(names: L.Names, outer: int, inner: int, body: Callable[[L.Expr, L.Expr], list[L.Stmt]]) -> list[L.Stmt]:
    """One parallel loop over the rows of a tensor seen as (outer, length, inner), a row being the `length`
    elements along the middle axis: body(outer index, inner index). One loop rather than two nested ones, so
    that OpenCL gets a work-item per row."""
    row = names.var("row")
    if inner == 1:
        indices: tuple[L.Expr, L.Expr] = (row, L.const(0))
    elif outer == 1:
        indices = (L.const(0), row)
    else:
        indices = (row // inner, row % inner)
    return [L.Loop(row, outer * inner, body(*indices), parallel=True)]


def axis_view(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(outer, length, inner) of `shape` around `axis`."""
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1 :])


def value_dtype(buffer_dtype: str) -> str:
    """The IR value dtype that loads from a buffer of numpy dtype `buffer_dtype` give."""
    return {"float32": L.F32, "int64": L.I64, "int32": L.I64, "bool": L.BOOL}[buffer_dtype]


def _check_dtype(ctx: NodeContext, allowed: frozenset[str]) -> None:
    dtype = ctx.input_info(0).dtype
    if dtype not in allowed:
        raise ctx.unsupported(f"{ctx.node.op_type} of {dtype} is not supported ({', '.join(sorted(allowed))} are)")


# ------------------------------------------------------------------------------------------------- reductions


def absolute(x: L.Expr) -> L.Expr:
    return L.select(L.compare("lt", x, 0.0), -x, x)


@dataclass(frozen=True)
class Reducer:
    """One reduction: acc = combine(acc, element(x)) over the reduced elements, then finish(acc, count).

    `neutral` starts the accumulator; None means start from the first element instead (max and min, which have no
    finite neutral element). A reduction over nothing has a kernel of its own (OVER_NOTHING).
    """

    combine: Callable[[L.Expr, L.Expr], L.Expr]
    dtypes: frozenset[str]
    neutral: float | None = 0.0
    element: Callable[[L.Expr], L.Expr] = lambda x: x
    finish: Callable[[L.Expr, int], L.Expr] = lambda acc, count: acc


def _lowest(dtype: str) -> float | int:
    """The smallest value of a numpy dtype (-inf for floats, False for bool): the maximum of nothing."""
    if dtype == "float32":
        return -math.inf
    return 0 if dtype == "bool" else int(np.iinfo(dtype).min)


def _highest(dtype: str) -> float | int:
    if dtype == "float32":
        return math.inf
    return 1 if dtype == "bool" else int(np.iinfo(dtype).max)


REDUCERS: dict[str, Reducer] = {
    "ReduceSum": Reducer(lambda a, x: a + x, NUMERIC),
    "ReduceMean": Reducer(lambda a, x: a + x, FLOAT, finish=lambda acc, count: acc / float(count)),
    "ReduceProd": Reducer(lambda a, x: a * x, NUMERIC, neutral=1.0),
    "ReduceMax": Reducer(L.maximum, ORDERED, neutral=None),
    "ReduceMin": Reducer(L.minimum, ORDERED, neutral=None),
    "ReduceL1": Reducer(lambda a, x: a + x, FLOAT, element=absolute),
    "ReduceL2": Reducer(
        lambda a, x: a + x, FLOAT, element=lambda x: x * x, finish=lambda acc, count: L.call("sqrt", acc)
    ),
    "ReduceSumSquare": Reducer(lambda a, x: a + x, FLOAT, element=lambda x: x * x),
    "ReduceLogSum": Reducer(lambda a, x: a + x, FLOAT, finish=lambda acc, count: L.call("log", acc)),
}

# The dtypes each reduction takes (ReduceLogSumExp has a lowering of its own).
REDUCE_DTYPES = {**{op: reducer.dtypes for op, reducer in REDUCERS.items()}, "ReduceLogSumExp": FLOAT}

OVER_NOTHING: dict[str, Callable[[str], float | int]] = {
    "ReduceSum": lambda dtype: 0,
    "ReduceMean": lambda dtype: math.nan,
    "ReduceProd": lambda dtype: 1,
    "ReduceMax": _lowest,
    "ReduceMin": _highest,
    "ReduceL1": lambda dtype: 0,
    "ReduceL2": lambda dtype: 0,
    "ReduceSumSquare": lambda dtype: 0,
    "ReduceLogSum": lambda dtype: -math.inf,
    "ReduceLogSumExp": lambda dtype: -math.inf,
}
"""Each reduction's value over nothing, by the input's numpy dtype, as ONNX gives it: 0 for the sums, 1 for the
product, the dtype's lowest and highest value for max and min (-inf and inf for floats, False and True for bools),
-inf for the log-sums; and NaN for the mean, which ONNX leaves undefined (numpy's and the ONNX reference's value,
where onnxruntime gives 0)."""

# The opset from which each reduction takes its axes as an input rather than an attribute.
AXES_INPUT_OPSET = {"ReduceSum": 13}


def reduce_axes(ctx: NodeContext) -> list[int]:
    """The sorted non-negative axes to reduce, from the attribute or the constant input (by opset): absent or
    empty axes reduce every axis, or none under noop_with_empty_axes."""
    attrs, rank = ctx.node.attrs, len(ctx.input_info(0).shape)
    if ctx.opset >= AXES_INPUT_OPSET.get(ctx.node.op_type, 18):
        constant = ctx.constant(1)
        axes = [] if constant is None else [int(a) for a in constant.reshape(-1)]
    else:
        axes = [int(a) for a in attrs.get("axes", [])]
    if not axes:
        return [] if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    if any(not -rank <= a < rank for a in axes):
        raise ctx.unsupported(f"axes {axes} are out of range for rank {rank}")
    return sorted({a % rank for a in axes})


def _reduce_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Only the reduced axes: keepdims changes the output's shape, not its row-major layout. An empty input needs
    none: each element of a non-empty output reduces every axis of extent 0, whatever the axes, so each is the
    reduction of nothing (`_lower_over_nothing`), and the axes may be an input known only at run time."""
    _check_dtype(ctx, REDUCE_DTYPES[ctx.node.op_type])
    return {} if ctx.input_info(0).size == 0 else {"axes": reduce_axes(ctx)}


def _reduced_value(spec: KernelSpec) -> tuple[Callable[[L.Expr], L.Expr], Callable[[L.Expr], L.Expr], str]:
    """(load -> value to reduce, reduced value -> value to store, accumulator dtype) for the input's dtype:
    bools reduce as 0/1 integers."""
    if spec.inputs[0].dtype == "bool":
        return (lambda x: L.Cast(x, L.I64)), (lambda acc: L.compare("ne", acc, 0)), L.I64
    dtype = value_dtype(spec.inputs[0].dtype)
    return (lambda x: x), (lambda acc: acc), dtype


def _lower_reduce(spec: KernelSpec) -> list[L.Stmt]:
    """A work-item per output, accumulating in a local."""
    if spec.inputs[0].size == 0:
        return _lower_over_nothing(spec)
    names, reducer = L.Names(), REDUCERS[spec.op]
    layout = ReduceLayout.of(shape_of(spec), spec.attrs["axes"])
    to_acc, to_out, dtype = _reduced_value(spec)
    load = lambda index: reducer.element(to_acc(L.Load("in0", index, value_dtype(spec.inputs[0].dtype))))  # noqa: E731
    acc = names.local("acc", dtype)

    def per_output(out: L.Expr, base: L.Expr) -> list[L.Stmt]:
        start = load(base) if reducer.neutral is None else L.wrap(reducer.neutral, dtype)
        update = layout.over_reduced(names, base, lambda index: [L.Assign(acc, reducer.combine(acc, load(index)))])
        return [L.Assign(acc, start), *update, L.Store("out0", out, to_out(reducer.finish(acc, layout.count)))]

    return layout.over_outputs(names, per_output)


def _lower_over_nothing(spec: KernelSpec) -> list[L.Stmt]:
    """An empty input: every output is the op's value over nothing (OVER_NOTHING), and no input is read."""
    dtype = value_dtype(spec.outputs[0].dtype)
    value = OVER_NOTHING[spec.op](spec.inputs[0].dtype)
    constant = L.Const(float(value) if dtype == L.F32 else int(value), dtype)
    return elementwise_loops(L.Names(), (spec.outputs[0].size,), lambda v: constant)


for _op in REDUCERS:
    register(_op, normalize=_reduce_attrs, data_inputs=(0,), empty_operands=True)(_lower_reduce)


@register("ReduceLogSumExp", normalize=_reduce_attrs, data_inputs=(0,), empty_operands=True)
def _lower_reduce_log_sum_exp(spec: KernelSpec) -> list[L.Stmt]:
    """log(sum(exp(x))) as m + log(sum(exp(x - m))) with m the maximum, so that large inputs don't overflow."""
    if spec.inputs[0].size == 0:
        return _lower_over_nothing(spec)
    names = L.Names()
    layout = ReduceLayout.of(shape_of(spec), spec.attrs["axes"])
    top, total = names.local("mx"), names.local("sum")

    def per_output(out: L.Expr, base: L.Expr) -> list[L.Stmt]:
        x = lambda index: L.Load("in0", index)  # noqa: E731
        return [
            L.Assign(top, L.const(-math.inf)),
            *layout.over_reduced(names, base, lambda i: [L.Assign(top, L.maximum(top, x(i)))]),
            L.Assign(total, L.const(0.0)),
            *layout.over_reduced(names, base, lambda i: [L.Assign(total, total + L.call("exp", x(i) - top))]),
            L.Store("out0", out, top + L.call("log", total)),
        ]

    return layout.over_outputs(names, per_output)


# ------------------------------------------------------------------------------------------ ArgMax and ArgMin

# The comparison by which x replaces the best so far, by (op, select_last_index): strict keeps the first extreme.
ARG_COMPARISONS = {("ArgMax", 0): "gt", ("ArgMax", 1): "ge", ("ArgMin", 0): "lt", ("ArgMin", 1): "le"}


def _arg_attrs(ctx: NodeContext) -> dict[str, Any]:
    _check_dtype(ctx, NUMERIC)
    rank = len(ctx.input_info(0).shape)
    return {
        "axis": axis_in_range(ctx, ctx.node.attrs.get("axis", 0), rank),
        "last": int(ctx.node.attrs.get("select_last_index", 0)),
    }


@register("ArgMax", "ArgMin", normalize=_arg_attrs)
def _lower_arg(spec: KernelSpec) -> list[L.Stmt]:
    """Per row, the index of the first (or, with select_last_index, the last) extreme element."""
    names, a = L.Names(), spec.attrs
    outer, length, inner = axis_view(shape_of(spec), a["axis"])
    dtype = value_dtype(spec.inputs[0].dtype)
    best, where, i = names.local("best", dtype), names.local("at", L.I64), names.var("i")
    op = ARG_COMPARISONS[spec.op, a["last"]]

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        base = o * (length * inner) + t
        x = L.Load("in0", base + i * inner, dtype)
        better = L.compare(op, x, best)
        return [
            L.Assign(best, L.Load("in0", base, dtype)),
            L.Assign(where, L.const(0)),
            L.Loop(i, length, [L.Assign(where, L.select(better, i, where)), L.Assign(best, L.select(better, x, best))]),
            L.Store("out0", o * inner + t, where),
        ]

    return over_rows(names, outer, inner, row)


# -------------------------------------------------------------------------------------------------------- TopK


def _topk_attrs(ctx: NodeContext) -> dict[str, Any]:
    _check_dtype(ctx, NUMERIC)
    shape = ctx.input_info(0).shape
    axis = axis_in_range(ctx, ctx.node.attrs.get("axis", -1), len(shape))
    if ctx.opset >= 10:
        k_input = ctx.constant(1)
        if k_input is None:
            raise ctx.unsupported("TopK needs its input k")
        k = int(k_input.reshape(-1)[0])
    else:
        k = int(ctx.node.attrs["k"])
    if not 0 <= k <= shape[axis]:
        raise ctx.unsupported(f"k={k} is out of range for axis {axis} of extent {shape[axis]}")
    # Always sorted: with sorted=0 any order is valid.
    return {"axis": axis, "k": k, "largest": int(ctx.node.attrs.get("largest", 1))}


@register("TopK", normalize=_topk_attrs, data_inputs=(0,))
def _lower_topk(spec: KernelSpec) -> list[L.Stmt]:
    """Per row, k selection passes: pass j picks the best element ranked after pick j-1, in the order
    "better value first, lower index first on ties" (onnxruntime's order), so no row scratch is needed."""
    names, a = L.Names(), spec.attrs
    outer, length, inner = axis_view(shape_of(spec), a["axis"])
    dtype = value_dtype(spec.inputs[0].dtype)
    beats, loses = ("gt", "lt") if a["largest"] else ("lt", "gt")
    j, i = names.var("j"), names.var("i")
    prev, prev_at = names.local("prev", dtype), names.local("prev_at", L.I64)
    best, best_at = names.local("best", dtype), names.local("best_at", L.I64)
    take = names.local("take", L.BOOL)

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        x = L.Load("in0", o * (length * inner) + t + i * inner, dtype)
        first_pass = L.compare("lt", prev_at, 0)
        ranked_after = L.binary(
            "or",
            first_pass,
            L.binary(
                "or", L.compare(loses, x, prev), L.logical_and(L.compare("eq", x, prev), L.compare("gt", i, prev_at))
            ),
        )
        no_best = L.compare("lt", best_at, 0)
        better = L.binary("or", no_best, L.compare(beats, x, best))  # ties keep the earlier (lower) index
        out = o * (a["k"] * inner) + t + j * inner
        pick: list[L.Stmt] = [
            L.Assign(take, L.logical_and(ranked_after, better)),
            L.Assign(best, L.select(take, x, best)),
            L.Assign(best_at, L.select(take, i, best_at)),
        ]
        return [
            L.Assign(prev, L.wrap(0, dtype)),
            L.Assign(prev_at, L.const(-1)),
            L.Loop(
                j,
                a["k"],
                [
                    L.Assign(best, prev),
                    L.Assign(best_at, L.const(-1)),
                    L.Loop(i, length, pick),
                    L.Store("out0", out, best),
                    L.Store("out1", out, best_at),
                    L.Assign(prev, best),
                    L.Assign(prev_at, best_at),
                ],
            ),
        ]

    return over_rows(names, outer, inner, row)
