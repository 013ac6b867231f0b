"""farm.ops.matmul against onnxruntime: Gemm and MatMul over their attribute variants and batch layouts; operands
that disagree are refused, whatever shape inference found."""

from __future__ import annotations

import numpy as np
import pytest
from numerics import (
    OpCase,
    case,
    check_case,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)
from onnx import TensorProto

from farm.ops import matmul

# ---------------------------------------------------------------------------------------------------------- Gemm


def _gemm(
    id: str, m: int, k: int, n: int, attrs: dict | None = None, c: tuple[int, ...] | None = (-1,), b_input: bool = False
) -> OpCase:
    """Gemm of A (graph input) and B (initializer, or graph input if b_input) with C of shape `c` ((-1,) = (N,))."""
    attrs = attrs or {}
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    b_shape = (n, k) if attrs.get("transB") else (k, n)
    inputs = [("a", a_shape)] + ([("b", b_shape)] if b_input else [])
    initializers = {} if b_input else {"b": rand(*b_shape, seed=1)}
    if c is not None:
        initializers["c"] = rand(*((n,) if c == (-1,) else c), seed=2)
    return case(f"gemm-{id}", single_op_model("Gemm", inputs, attrs, initializers))


GEMM_CASES: list[OpCase] = [
    _gemm("plain", 3, 20, 7),
    _gemm("transA", 3, 20, 7, {"transA": 1}),
    _gemm("transB", 3, 20, 7, {"transB": 1}),
    _gemm("transA-transB", 3, 20, 7, {"transA": 1, "transB": 1}),
    _gemm("transB-no-c", 4, 9, 5, {"transB": 1}, c=None),
    _gemm("transA-no-c", 4, 9, 5, {"transA": 1}, c=None),
    _gemm("alpha-beta", 3, 20, 7, {"alpha": 0.5, "beta": 2.0}),
    _gemm("alpha-beta-transB", 3, 20, 7, {"alpha": -1.25, "beta": 0.25, "transB": 1}),
    _gemm("beta0", 3, 8, 7, {"beta": 0.0}),
    _gemm("alpha-no-c", 3, 8, 7, {"alpha": 3.0}, c=None),
    _gemm("c-n", 5, 6, 7, c=(7,)),
    _gemm("c-1xn", 5, 6, 7, c=(1, 7)),
    _gemm("c-mxn", 5, 6, 7, c=(5, 7)),
    _gemm("c-mx1", 5, 6, 7, c=(5, 1)),
    _gemm("c-scalar", 5, 6, 7, c=()),
    _gemm("c-1", 5, 6, 7, c=(1,)),
    _gemm("c-mxn-transA-transB", 5, 6, 7, {"transA": 1, "transB": 1, "beta": 0.5}, c=(5, 7)),
    _gemm("no-c", 3, 20, 7, c=None),
    _gemm("b-graph-input", 4, 6, 3, b_input=True),
    _gemm("b-graph-input-transB", 4, 6, 3, {"transB": 1}, b_input=True),
    _gemm("large", 33, 70, 65, {"transB": 1}),
    _gemm("large-constant-b", 33, 70, 113),
    _gemm("large-transA", 67, 129, 70, {"transA": 1}),
    case(
        "gemm-a-initializer",
        single_op_model(
            "Gemm", [("b", (5, 4))], {"transA": 1}, {"a": rand(5, 3), "c": rand(4)}, node_inputs=["a", "b", "c"]
        ),
    ),
    _gemm("vector-row", 1, 100, 10),
]

# -------------------------------------------------------------------------------------------------------- MatMul


def _matmul(a: tuple[int, ...], b: tuple[int, ...], b_initializer: bool = False) -> OpCase:
    name = "-".join("x".join(map(str, s)) for s in (a, b)) + ("-init" if b_initializer else "")
    if b_initializer:
        model = single_op_model("MatMul", [("a", a)], {}, {"b": rand(*b, seed=1)})
    else:
        model = single_op_model("MatMul", [("a", a), ("b", b)])
    return case(f"matmul-{name}", model)


MATMUL_CASES: list[OpCase] = [
    _matmul((3, 5), (5, 4)),
    _matmul((3, 20), (20, 33), b_initializer=True),
    _matmul((2, 3, 5), (2, 5, 4)),
    _matmul((2, 3, 4, 5), (2, 3, 5, 6)),
    _matmul((2, 3, 5, 20), (20, 33), b_initializer=True),
    _matmul((2, 3, 5), (5, 4)),
    _matmul((3, 5), (2, 5, 4)),
    _matmul((2, 1, 3, 4), (5, 4, 6)),
    _matmul((1, 3, 4), (5, 4, 2)),
    _matmul((4, 1, 3, 4), (1, 2, 4, 5)),
    _matmul((5,), (5, 4)),
    _matmul((3, 5), (5,)),
    _matmul((5,), (2, 5, 4)),
    _matmul((2, 3, 5), (5,)),
    _matmul((7,), (7,)),
    _matmul((67, 259), (259, 131)),
    _matmul((3, 33, 130), (130, 65)),
    # a constant B is read pre-packed in column panels, per k x n block: shared, batched, broadcast, a vector
    _matmul((67, 259), (259, 131), b_initializer=True),
    _matmul((3, 5), (2, 5, 60), b_initializer=True),
    _matmul((2, 1, 3, 4), (5, 4, 70), b_initializer=True),
    _matmul((2, 3, 5), (5,), b_initializer=True),
    case(
        "matmul-a-initializer",
        single_op_model("MatMul", [("b", (2, 5, 4))], {}, {"a": rand(3, 5)}, node_inputs=["a", "b"]),
    ),
]


CASES: list[OpCase] = GEMM_CASES + MATMUL_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


def test_a_gemm_whose_operands_disagree_is_refused_before_its_kernel_reads_past_b(tmp_path):
    """A fuzzed small_cnn whose Flatten was rewired to a bigger value: inference gave the Gemm no shape, the declared
    output stood in, and the kernel read 4096 columns of a 32-column B (SIGSEGV at run, issue 13)."""
    from numerics import assert_refused

    model = hostile_op_model("Gemm", {"transB": 1}, {"b": np.ones((10, 32), np.float32)}, x=(1, 4096))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 1
    model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = 10
    assert_refused(model, "input shapes are inconsistent", tmp_path)


def test_gemm_and_matmul_check_their_operands_whatever_inference_found():
    from farm.errors import UnsupportedError
    from farm.ir.graph import Node, TensorInfo
    from farm.ops.registry import NodeContext

    def context(op, a, b, y):
        return NodeContext(
            Node("victim", op, ["a", "b"], ["y"]), [TensorInfo(a), TensorInfo(b)], [TensorInfo(y)], {}, 17
        )

    with pytest.raises(UnsupportedError, match="can't give Y"):
        matmul._gemm_attrs(context("Gemm", (1, 4096), (32, 10), (1, 10)))
    with pytest.raises(UnsupportedError, match="the inner dims differ"):
        matmul._matmul_attrs(context("MatMul", (2, 1, 4096), (32, 10), (2, 1, 10)))
    assert matmul._matmul_attrs(context("MatMul", (2, 3, 32), (32,), (2, 3))) == {}
