"""The softmax family: Softmax, LogSoftmax and Hardmax, a work-item per row along the axis."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.reduce import NEG_INF, over_rows
from farm.ops.registry import NodeContext, activate, axis_in_range, prod, register


def _softmax_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Softmax as (outer, length, inner): before opset 13 it covers every axis from `axis` on, later just `axis`."""
    shape = ctx.input_info(0).shape
    legacy = ctx.opset < 13
    axis = axis_in_range(ctx, ctx.node.attrs.get("axis", 1 if legacy else -1), len(shape))
    length = prod(shape[axis:]) if legacy else shape[axis]
    inner = 1 if legacy else prod(shape[axis + 1 :])
    return {"outer": prod(shape[:axis]), "length": length, "inner": inner}


def along(a: dict[str, Any], o: L.Expr, t: L.Expr) -> Callable[[L.ExprLike], L.Expr]:
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
        at = along(a, o, t)
        x = lambda k: L.Load("in0", at(k))  # noqa: E731
        return [
            *_row_max(names, x, a["length"], top),
            L.Assign(total, L.const(0.0)),
            *tail(x, at, i, top, total, a["length"]),
        ]

    return over_rows(names, a["outer"], a["inner"], row)


@register("Softmax", normalize=_softmax_attrs)
def _lower_softmax(spec: KernelSpec) -> list[L.Stmt]:
    """exp(x - max) / sum, the exponentials stored once and scaled."""

    def tail(x, at, i, top, total, length):
        return [
            L.Loop(
                i,
                length,
                [L.Store("out0", at(i), L.call("exp", x(i) - top)), L.Assign(total, total + L.Load("out0", at(i)))],
            ),
            L.Assign(total, 1.0 / total),
            L.Loop(i, length, [L.Store("out0", at(i), activate(L.Load("out0", at(i)) * total, spec.activation))]),
        ]

    return _rows_after_max(spec, tail)


@register("LogSoftmax", normalize=_softmax_attrs)
def _lower_log_softmax(spec: KernelSpec) -> list[L.Stmt]:
    """x - max - log(sum(exp(x - max))): log-sum-exp around the max."""

    def tail(x, at, i, top, total, length):
        return [
            L.Loop(i, length, [L.Assign(total, total + L.call("exp", x(i) - top))]),
            L.Assign(total, top + L.call("log", total)),
            L.Loop(i, length, [L.Store("out0", at(i), x(i) - total)]),
        ]

    return _rows_after_max(spec, tail)


@register("Hardmax", normalize=_softmax_attrs)
def _lower_hardmax(spec: KernelSpec) -> list[L.Stmt]:
    """1 at the first maximum of each row, 0 elsewhere."""
    names, a = L.Names(), spec.attrs
    i, best, where = names.var("i"), names.local("best"), names.local("at", L.I64)

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        at = along(a, o, t)
        better = L.compare("gt", L.Load("in0", at(i)), best)
        return [
            L.Assign(best, L.Load("in0", at(0))),
            L.Assign(where, L.const(0)),
            L.Loop(
                i,
                a["length"],
                [L.Assign(where, L.select(better, i, where)), L.Assign(best, L.maximum(best, L.Load("in0", at(i))))],
            ),
            L.Loop(i, a["length"], [L.Store("out0", at(i), L.select(L.compare("eq", i, where), 1.0, 0.0))]),
        ]

    return over_rows(names, a["outer"], a["inner"], row)
