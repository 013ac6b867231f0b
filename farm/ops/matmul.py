"""Gemm and MatMul through the IR's Gemm primitive (an integer MatMul as a loop nest)."""

from __future__ import annotations

from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import NodeContext, activate, gemm_epilogue, out_shape, prod, register, shape_of


def _gemm_attrs(ctx: NodeContext) -> dict[str, Any]:
    a = ctx.node.attrs
    attrs: dict[str, Any] = {
        "alpha": float(a.get("alpha", 1.0)),
        "beta": float(a.get("beta", 1.0)),
        "transA": int(a.get("transA", 0)),
        "transB": int(a.get("transB", 0)),
    }
    _check_gemm_shapes(ctx, attrs["transA"], attrs["transB"])
    attrs["constant_weight"] = ctx.node.inputs[1] in ctx.constants  # then the build may pre-pack B
    return attrs


def _check_gemm_shapes(ctx: NodeContext, trans_a: int, trans_b: int) -> None:
    """op(A) is M x K, op(B) K x N and Y M x N: the kernel indexes A, B and Y by these, so a mismatch would read or
    write past a buffer (the frontend refuses what ONNX's strict inference finds; this holds whatever it found)."""
    a, b, y = ctx.input_info(0).shape, ctx.input_info(1).shape, ctx.outputs[0].shape
    if len(a) != 2 or len(b) != 2:
        raise ctx.unsupported(f"Gemm's A {list(a)} and B {list(b)} must be matrices")
    m, k = (a[1], a[0]) if trans_a else a
    k_b, n = (b[1], b[0]) if trans_b else b
    if k != k_b or y != (m, n):
        raise ctx.unsupported(
            f"Gemm of A {list(a)} (transA={trans_a}) and B {list(b)} (transB={trans_b}) can't give Y {list(y)}"
        )


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
        body: list[L.Stmt] = [
            L.Gemm(
                "in0",
                L.const(0),
                depth,
                "in1",
                L.const(0),
                ldb,
                "out0",
                L.const(0),
                cols,
                rows,
                cols,
                depth,
                b_panels=constant_b,
                b_transposed=bool(a["transB"]),
            )
        ]
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
    """MatMul has no attributes; the operands' inner dims must agree (the kernel indexes both by them). A bias the
    bias fusion pass gave it (Node.bias) holds one float32 per column of its output."""
    a, b = ctx.input_info(0).shape, ctx.input_info(1).shape
    if not a or not b or a[-1] != (b[0] if len(b) == 1 else b[-2]):
        raise ctx.unsupported(f"MatMul of {list(a)} and {list(b)}: the inner dims differ")
    attrs: dict[str, Any] = {"constant_weight": True} if ctx.node.inputs[1] in ctx.constants else {}
    if ctx.node.bias:
        bias, columns = ctx.input_info(2), ctx.outputs[0].shape[-1]
        if bias.shape != (columns,) or bias.dtype != "float32" or ctx.input_info(0).dtype != "float32":
            raise ctx.unsupported(f"MatMul's bias {list(bias.shape)} must be float32 of its {columns} columns")
        attrs["bias"] = True
    return attrs  # constant_weight: the build may pre-pack B


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
    bias = "in2" if spec.attrs.get("bias") else None  # Node.bias: one value per column
    epilogue = gemm_epilogue(spec, bias, L.const(0), bias_on_columns=True)
    return _matmul_gemms(names, a_mat, b_mat, batch, bool(spec.attrs.get("constant_weight")), epilogue)


def _matmul_gemms(
    names: L.Names,
    a_mat: tuple[int, ...],
    b_mat: tuple[int, ...],
    batch: tuple[int, ...],
    constant_b: bool,
    epilogue: L.GemmEpilogue | None,
) -> list[L.Stmt]:
    """One Gemm when B is shared by every batch and A holds them all (the batches are just more rows of A, as in
    a transformer's linear layers); else a Gemm per batch, in one flat parallel loop when each operand either
    holds every batch or is shared (attention's [B, H, S, D] products), a parallel loop nest when it broadcasts.
    A constant B (a layer's weights) is read pre-packed (b_panels); every Gemm's B offset is a whole k x n block."""
    rows, depth, cols = a_mat[-2], a_mat[-1], b_mat[-1]
    a_batch, b_batch, batches = a_mat[:-2], b_mat[:-2], prod(batch)

    def gemm(a_offset: L.Expr, b_offset: L.Expr, c_offset: L.Expr, m: int = rows) -> L.Gemm:
        return L.Gemm(
            "in0",
            a_offset,
            depth,
            "in1",
            b_offset,
            cols,
            "out0",
            c_offset,
            cols,
            m,
            cols,
            depth,
            b_panels=constant_b,
            epilogue=epilogue,
        )

    if prod(b_batch) == 1 and prod(a_batch) == batches:
        return [gemm(L.const(0), L.const(0), L.const(0), batches * rows)]
    if prod(a_batch) in (1, batches) and prod(b_batch) in (1, batches):
        b = names.var("b")

        def offset(operand_batch: tuple[int, ...], size: int) -> L.Expr:
            return b * size if prod(operand_batch) == batches else L.const(0)

        each = gemm(offset(a_batch, rows * depth), offset(b_batch, depth * cols), b * (rows * cols))
        return [L.Loop(b, batches, [each], parallel=True)]

    def gemm_at(v: list[L.Var]) -> list[L.Stmt]:
        a_off = L.broadcast_index(a_batch, batch, v) * (rows * depth)
        b_off = L.broadcast_index(b_batch, batch, v) * (depth * cols)
        return [gemm(a_off, b_off, L.flat_index(batch, v) * (rows * cols))]

    body, _ = L.loop_nest(names, batch, gemm_at, parallel=True)
    return body


def _matmul_loops(
    names: L.Names, spec: KernelSpec, a_mat: tuple[int, ...], b_mat: tuple[int, ...], batch: tuple[int, ...]
) -> list[L.Stmt]:
    """Integer matmul: out[b, m, n] = sum over k of a[b, m, k] * b[b, k, n], batches broadcast."""
    rows, depth, cols = a_mat[-2], a_mat[-1], b_mat[-1]
    k, acc = names.var("k"), names.local("acc", L.I64)

    def element(v: list[L.Var]) -> list[L.Stmt]:
        bv, m, n = v[:-2], v[-2], v[-1]
        a_index = (L.broadcast_index(a_mat[:-2], batch, bv) * rows + m) * depth + k
        b_index = (L.broadcast_index(b_mat[:-2], batch, bv) * depth + k) * cols + n
        product = L.Load("in0", a_index, L.I64) * L.Load("in1", b_index, L.I64)
        out_index = L.flat_index((*batch, rows, cols), v)
        return [
            L.Assign(acc, L.const(0)),
            L.Loop(k, depth, [L.Assign(acc, acc + product)]),
            L.Store("out0", out_index, activate(acc, spec.activation)),
        ]

    body, _ = L.loop_nest(names, (*batch, rows, cols), element, parallel=True)
    return body
