"""Linear algebra beyond matrix products: Det.

Det runs Gaussian elimination with partial pivoting (LAPACK's getrf, which numpy's and onnxruntime's det use) on a
copy of each matrix in scratch: one work-item per matrix, its elimination steps in serial loops (each step reads
what the one before wrote). The determinant is the product of the pivots, negated once per row swap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.reduce import absolute
from farm.ops.registry import NodeContext, prod, register, shape_of


def _det_attrs(ctx: NodeContext) -> dict[str, Any]:
    """No attributes; the input must be float32 square matrices (..., M, M)."""
    x = ctx.input_info(0)
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2]:
        raise ctx.unsupported(f"Det needs square matrices (..., M, M), not shape {list(x.shape)}")
    if x.dtype != "float32":
        raise ctx.unsupported(f"Det on {x.dtype} is not supported (float32 is)")
    return {}


def _det_scratch(spec: KernelSpec) -> int:
    """A copy of every matrix, which the elimination overwrites."""
    return prod(shape_of(spec))


@dataclass(frozen=True)
class _Matrix:
    """Element (row, column) of the size x size matrix at `base` in scratch."""

    base: L.Expr
    size: int

    def at(self, row: L.ExprLike, column: L.ExprLike) -> L.Expr:
        return self.base + L.wrap(row, L.I64) * self.size + column

    def load(self, row: L.ExprLike, column: L.ExprLike) -> L.Expr:
        return L.Load("scratch", self.at(row, column))


def _pivot_search(names: L.Names, a: _Matrix, k: L.Var, pivot_row: L.Var) -> list[L.Stmt]:
    """pivot_row = the row from k on with the largest |a[row, k]| (the first of equals, as getrf picks)."""
    i, best = names.var("i"), names.local("best")
    better = L.logical_and(L.compare("gt", i, k), L.compare("gt", absolute(a.load(i, k)), best))
    return [
        L.Assign(pivot_row, k),
        L.Assign(best, absolute(a.load(k, k))),
        L.Loop(
            i,
            a.size,
            [
                L.Assign(pivot_row, L.select(better, i, pivot_row)),
                L.Assign(best, L.select(better, absolute(a.load(i, k)), best)),
            ],
        ),
    ]


def _swap_rows(names: L.Names, a: _Matrix, k: L.Var, pivot_row: L.Var) -> list[L.Stmt]:
    """Rows k and pivot_row exchanged (a no-op when they are the same row)."""
    j, held = names.var("j"), names.local("held")
    return [
        L.Loop(
            j,
            a.size,
            [
                L.Assign(held, a.load(k, j)),
                L.Store("scratch", a.at(k, j), a.load(pivot_row, j)),
                L.Store("scratch", a.at(pivot_row, j), held),
            ],
        )
    ]


def _eliminate(names: L.Names, a: _Matrix, k: L.Var, pivot: L.Var) -> list[L.Stmt]:
    """Each row below k less factor times row k, factor = a[i, k] / pivot (0 for a zero pivot, whose column below is
    zero too: the determinant is already 0). Columns left of k are updated too, harmlessly: no later step reads
    them."""
    i, j, factor = names.var("i"), names.var("j"), names.local("factor")
    ratio = L.select(L.compare("eq", pivot, 0.0), 0.0, a.load(i, k) / pivot)
    row = [
        L.Assign(factor, ratio),
        L.Loop(j, a.size, [L.Store("scratch", a.at(i, j), a.load(i, j) - factor * a.load(k, j))]),
    ]
    return [L.Loop(i, a.size, [L.If(L.compare("gt", i, k), row)])]


@register("Det", normalize=_det_attrs, scratch_floats=_det_scratch)
def _lower_det(spec: KernelSpec) -> list[L.Stmt]:
    names, shape = L.Names(), shape_of(spec)
    size = shape[-1]
    batch, row, column, k = names.var("b"), names.var("r"), names.var("c"), names.var("k")
    det, pivot, pivot_row = names.local("det"), names.local("pivot"), names.local("p", L.I64)
    a = _Matrix(batch * (size * size), size)
    copy = L.Loop(
        row, size, [L.Loop(column, size, [L.Store("scratch", a.at(row, column), L.Load("in0", a.at(row, column)))])]
    )
    step = [
        *_pivot_search(names, a, k, pivot_row),
        *_swap_rows(names, a, k, pivot_row),
        L.Assign(det, L.select(L.compare("ne", pivot_row, k), -det, det)),
        L.Assign(pivot, a.load(k, k)),
        L.Assign(det, det * pivot),
        *_eliminate(names, a, k, pivot),
    ]
    body = [copy, L.Assign(det, L.const(1.0)), L.Loop(k, size, step), L.Store("out0", batch, det)]
    return [L.Loop(batch, prod(shape[:-2]), body, parallel=True)]
