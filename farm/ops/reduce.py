"""Reductions over any set of axes, ArgMax/ArgMin and TopK.

Every kernel here is one parallel loop with a work-item per output element (or per row along an axis), the
reduction running sequentially inside it. The Reduce* kernels take empty operands: a reduction over nothing stores
ONNX's value for it (`Reducer`). `ReduceLayout` and `over_rows` are shared with the normalisations and
the softmax family in farm.ops.nn.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import NodeContext, axis_in_range, prod, register, shape_of

FLOAT = frozenset({"float32"})
NUMERIC = frozenset({"float32", "int64", "int32"})
ORDERED = NUMERIC | {"bool"}

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
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])


def value_dtype(buffer_dtype: str) -> str:
    """The IR value dtype that loads from a buffer of numpy dtype `buffer_dtype` give."""
    return {"float32": L.F32, "int64": L.I64, "int32": L.I64, "bool": L.BOOL}[buffer_dtype]


def _check_dtype(ctx: NodeContext, allowed: frozenset[str]) -> None:
    dtype = ctx.inputs[0].dtype
    if dtype not in allowed:
        raise ctx.unsupported(f"{ctx.node.op_type} of {dtype} is not supported ({', '.join(sorted(allowed))} are)")


# ------------------------------------------------------------------------------------------------- reductions


def absolute(x: L.Expr) -> L.Expr:
    return L.select(L.compare("lt", x, 0.0), -x, x)


@dataclass(frozen=True)
class Reducer:
    """One reduction: acc = combine(acc, element(x)) over the reduced elements, then finish(acc, count).

    `neutral` starts the accumulator (so a reduction over nothing gives finish(neutral, 0): 0, 1, -inf as ONNX
    says, and NaN for a mean, which ONNX leaves undefined: numpy's and the ONNX reference's value, where
    onnxruntime gives 0); None means start from the first element instead (max and min, which have no finite neutral
    element), with `empty` (by numpy dtype) the result of a reduction over nothing.
    """

    combine: Callable[[L.Expr, L.Expr], L.Expr]
    dtypes: frozenset[str]
    neutral: float | None = 0.0
    element: Callable[[L.Expr], L.Expr] = lambda x: x
    finish: Callable[[L.Expr, int], L.Expr] = lambda acc, count: acc
    empty: Callable[[str], float | int] | None = None


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
    "ReduceMax": Reducer(L.maximum, ORDERED, neutral=None, empty=_lowest),
    "ReduceMin": Reducer(L.minimum, ORDERED, neutral=None, empty=_highest),
    "ReduceL1": Reducer(lambda a, x: a + x, FLOAT, element=absolute),
    "ReduceL2": Reducer(lambda a, x: a + x, FLOAT, element=lambda x: x * x,
                        finish=lambda acc, count: L.call("sqrt", acc)),
    "ReduceSumSquare": Reducer(lambda a, x: a + x, FLOAT, element=lambda x: x * x),
    "ReduceLogSum": Reducer(lambda a, x: a + x, FLOAT, finish=lambda acc, count: L.call("log", acc)),
}

# The dtypes each reduction takes (ReduceLogSumExp has a lowering of its own).
REDUCE_DTYPES = {**{op: reducer.dtypes for op, reducer in REDUCERS.items()}, "ReduceLogSumExp": FLOAT}

# The opset from which each reduction takes its axes as an input rather than an attribute.
AXES_INPUT_OPSET = {"ReduceSum": 13}


def reduce_axes(ctx: NodeContext) -> list[int]:
    """The sorted non-negative axes to reduce, from the attribute or the constant input (by opset): absent or
    empty axes reduce every axis, or none under noop_with_empty_axes."""
    attrs, rank = ctx.node.attrs, len(ctx.inputs[0].shape)
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
    """Only the reduced axes: keepdims changes the output's shape, not its row-major layout."""
    _check_dtype(ctx, REDUCE_DTYPES[ctx.node.op_type])
    return {"axes": reduce_axes(ctx)}


def _reduced_value(spec: KernelSpec) -> tuple[Callable[[L.Expr], L.Expr], Callable[[L.Expr], L.Expr], str]:
    """(load -> value to reduce, reduced value -> value to store, accumulator dtype) for the input's dtype:
    bools reduce as 0/1 integers."""
    if spec.inputs[0].dtype == "bool":
        return (lambda x: L.Cast(x, L.I64)), (lambda acc: L.compare("ne", acc, 0)), L.I64
    dtype = value_dtype(spec.inputs[0].dtype)
    return (lambda x: x), (lambda acc: acc), dtype


def _lower_reduce(spec: KernelSpec) -> list[L.Stmt]:
    """A work-item per output, accumulating in a local."""
    names, reducer = L.Names(), REDUCERS[spec.op]
    layout = ReduceLayout.of(shape_of(spec), spec.attrs["axes"])
    if layout.count == 0 and reducer.neutral is None:
        return _empty_reduction(spec, layout)
    to_acc, to_out, dtype = _reduced_value(spec)
    load = lambda index: reducer.element(to_acc(L.Load("in0", index, value_dtype(spec.inputs[0].dtype))))  # noqa: E731
    acc = names.local("acc", dtype)

    def per_output(out: L.Expr, base: L.Expr) -> list[L.Stmt]:
        start = load(base) if reducer.neutral is None else L.wrap(reducer.neutral, dtype)
        update = layout.over_reduced(names, base, lambda index: [L.Assign(acc, reducer.combine(acc, load(index)))])
        return [L.Assign(acc, start), *update, L.Store("out0", out, to_out(reducer.finish(acc, layout.count)))]

    return layout.over_outputs(names, per_output)


def _empty_reduction(spec: KernelSpec, layout: ReduceLayout) -> list[L.Stmt]:
    """Every output of a max or min over nothing is the lowest or highest value of the dtype, as ONNX says."""
    empty = REDUCERS[spec.op].empty(spec.inputs[0].dtype)
    return layout.over_outputs(L.Names(), lambda out, _: [
        L.Store("out0", out, L.const(empty, value_dtype(spec.outputs[0].dtype)))])


for _op in REDUCERS:
    register(_op, normalize=_reduce_attrs, data_inputs=(0,), empty_operands=True)(_lower_reduce)


@register("ReduceLogSumExp", normalize=_reduce_attrs, data_inputs=(0,), empty_operands=True)
def _lower_reduce_log_sum_exp(spec: KernelSpec) -> list[L.Stmt]:
    """log(sum(exp(x))) as m + log(sum(exp(x - m))) with m the maximum, so that large inputs don't overflow."""
    names = L.Names()
    layout = ReduceLayout.of(shape_of(spec), spec.attrs["axes"])
    top, total = names.local("mx"), names.local("sum")

    def per_output(out: L.Expr, base: L.Expr) -> list[L.Stmt]:
        x = lambda index: L.Load("in0", index)  # noqa: E731
        return [L.Assign(top, L.const(-math.inf)),
                *layout.over_reduced(names, base, lambda i: [L.Assign(top, L.maximum(top, x(i)))]),
                L.Assign(total, L.const(0.0)),
                *layout.over_reduced(names, base, lambda i: [L.Assign(total, total + L.call("exp", x(i) - top))]),
                L.Store("out0", out, top + L.call("log", total))]

    return layout.over_outputs(names, per_output)


# ------------------------------------------------------------------------------------------ ArgMax and ArgMin

# The comparison by which x replaces the best so far, by (op, select_last_index): strict keeps the first extreme.
ARG_COMPARISONS = {("ArgMax", 0): "gt", ("ArgMax", 1): "ge", ("ArgMin", 0): "lt", ("ArgMin", 1): "le"}


def _arg_attrs(ctx: NodeContext) -> dict[str, Any]:
    _check_dtype(ctx, NUMERIC)
    rank = len(ctx.inputs[0].shape)
    return {"axis": axis_in_range(ctx, ctx.node.attrs.get("axis", 0), rank),
            "last": int(ctx.node.attrs.get("select_last_index", 0))}


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
        return [L.Assign(best, L.Load("in0", base, dtype)), L.Assign(where, L.const(0)),
                L.Loop(i, length, [L.Assign(where, L.select(better, i, where)),
                                   L.Assign(best, L.select(better, x, best))]),
                L.Store("out0", o * inner + t, where)]

    return over_rows(names, outer, inner, row)


# -------------------------------------------------------------------------------------------------------- TopK


def _topk_attrs(ctx: NodeContext) -> dict[str, Any]:
    _check_dtype(ctx, NUMERIC)
    shape = ctx.inputs[0].shape
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
        ranked_after = L.binary("or", first_pass, L.binary("or", L.compare(loses, x, prev), L.logical_and(
            L.compare("eq", x, prev), L.compare("gt", i, prev_at))))
        no_best = L.compare("lt", best_at, 0)
        better = L.binary("or", no_best, L.compare(beats, x, best))  # ties keep the earlier (lower) index
        out = o * (a["k"] * inner) + t + j * inner
        pick = [L.Assign(take, L.logical_and(ranked_after, better)),
                L.Assign(best, L.select(take, x, best)), L.Assign(best_at, L.select(take, i, best_at))]
        return [L.Assign(prev, L.wrap(0, dtype)), L.Assign(prev_at, L.const(-1)),
                L.Loop(j, a["k"], [
                    L.Assign(best, prev), L.Assign(best_at, L.const(-1)),
                    L.Loop(i, length, pick),
                    L.Store("out0", out, best), L.Store("out1", out, best_at),
                    L.Assign(prev, best), L.Assign(prev_at, best_at)])]

    return over_rows(names, outer, inner, row)
