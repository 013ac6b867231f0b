"""farm.ops.dequantized_matmul: MatMulIntegerToFloat, which the graph pass farm.frontend.passes.dequantize_fusion
makes from MatMulInteger -> Cast to float32 -> Mul by a scale -> [Add of a bias]. Each case is such a chain in a
model; the schedule must hold the one fused kernel, and its outputs must equal ONNX's reference evaluator's bit for
bit (the kernel computes the chain's own float32 arithmetic): on IntGemm and as a loop nest (a batched B), the scale
one value or one per column, with and without a bias, zero points of every kind, sums past 2^24."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import OpCase, case, check_case, check_case_on_opencl, graph_model, params, scheduled_ops
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator
from test_ops_quantize import ints

import farm.runtime
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize


def dequantized_matmul_model(
    a: tuple[int, ...],
    b: np.ndarray,
    scale: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    zero_points: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
    a_dtype: str = "uint8",
) -> onnx.ModelProto:
    """MatMulInteger(a, b [, a_zero, b_zero]) -> Cast to float32 -> Mul by the scale -> [Add of the bias]. `scale`
    None: a graph input `s` of one float32 (a runtime scale, as DynamicQuantizeLinear's times a weight's)."""
    inits: dict[str, np.ndarray] = {"b": b}
    names = ["a", "b"]
    for name, zero in zip(("a_zero", "b_zero"), zero_points):
        if zero is not None:
            inits[name] = zero
        names.append(name if zero is not None else "")
    while names[-1] == "":
        names.pop()
    inputs: list = [("a", a, a_dtype)]
    if scale is None:
        inputs.append(("s", (), "float32"))
    else:
        inits["s"] = scale
    nodes = [
        helper.make_node("MatMulInteger", names, ["sums"], name="product"),
        helper.make_node("Cast", ["sums"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["as_float", "s"], ["scaled" if bias is not None else "y"]),
    ]
    if bias is not None:
        inits["bias"] = bias
        nodes.append(helper.make_node("Add", ["scaled", "bias"], ["y"]))
    return graph_model(nodes, inputs, initializers=inits)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path) -> tuple[list[str], np.ndarray]:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    result = build_model(path, tmp_path, executor=LocalExecutor(1))
    return scheduled_ops(result), farm.runtime.load(result.artifact).run(feeds)["y"]


def _reference(model: onnx.ModelProto) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    evaluator = ReferenceEvaluator(model)
    return lambda feeds: {"y": evaluator.run(None, dict(feeds))[0]}


def _case(id: str, model: onnx.ModelProto, scalars: Mapping[str, np.ndarray]) -> OpCase:
    """The chain's case: its A of integers over the whole range of its dtype, the given scalar inputs."""
    a_info = model.graph.input[0].type.tensor_type
    shape = tuple(d.dim_value for d in a_info.shape.dim)
    dtype = helper.tensor_dtype_to_np_dtype(a_info.elem_type).name
    feeds = {"a": ints(shape, dtype, 1), **{key: np.asarray(value) for key, value in scalars.items()}}
    return case(id, model, feeds, schedule=("MatMulIntegerToFloat",), reference=_reference(model))


K, N = 96, 80
B_S8 = ints((K, N), "int8", 5)
PER_COLUMN = np.linspace(0.001, 0.02, N, dtype=np.float32)
BIAS = np.linspace(-3.0, 3.0, N, dtype=np.float32)

CASES: list[OpCase] = [
    _case("runtime-scale-and-bias", dequantized_matmul_model((2, 7, K), B_S8, bias=BIAS), {"s": np.float32(0.0123)}),
    _case("per-column-scale-no-bias", dequantized_matmul_model((5, K), B_S8, scale=PER_COLUMN), {}),
    _case(
        "zero-points-per-column",
        dequantized_matmul_model((9, K), B_S8, PER_COLUMN, BIAS, (np.array(131, np.uint8), ints((N,), "int8", 6))),
        {},
    ),
    _case("signed-a", dequantized_matmul_model((4, K), B_S8, bias=BIAS, a_dtype="int8"), {"s": np.float32(0.5)}),
    _case(
        "batched-b-loop-nest",
        dequantized_matmul_model((3, 4, K), ints((3, K, N), "int8", 7), bias=BIAS),
        {"s": np.float32(0.01)},
    ),
]


@pytest.mark.parametrize("c", params(CASES))
def test_the_fused_kernel_computes_the_chain_bit_for_bit(c: OpCase, tmp_path: Path) -> None:
    result = check_case(c, tmp_path)
    assert c.feeds is not None and c.reference is not None
    y = farm.runtime.load(result.artifact).run(c.feeds)["y"]
    np.testing.assert_array_equal(y, c.reference(c.feeds)["y"])


def test_sums_past_2_24_round_as_the_cast_rounds_them(tmp_path: Path) -> None:
    """Sums of 2^24 and more are not all floats: the kernel converts them as Cast does (to nearest, even)."""
    b = ints((1024, 32), "int8", 3) % 28 + 100
    model = dequantized_matmul_model((6, 1024), b.astype(np.int8), bias=BIAS[:32])
    feeds = {"a": np.full((6, 1024), 251, np.uint8) - ints((6, 1024), "uint8", 4) % 5, "s": np.array(1.0, np.float32)}
    sums = feeds["a"].astype(np.int64) @ b.astype(np.int64)
    assert (sums > 1 << 24).all() and (sums.astype(np.float32) != sums).any()
    _, y = _run(model, feeds, tmp_path)
    np.testing.assert_array_equal(y, ReferenceEvaluator(model).run(None, feeds)[0])


def test_a_model_may_not_use_the_fused_op(tmp_path: Path) -> None:
    """MatMulIntegerToFloat is farm's own (onnxruntime's is com.microsoft's): a default-domain node of it is refused
    as the model is read, naming the node."""
    model = dequantized_matmul_model((4, K), B_S8, bias=BIAS)
    node = helper.make_node("MatMulIntegerToFloat", ["a", "b", "", "", "s", "bias"], ["y"], name="mine")
    del model.graph.node[:]
    model.graph.node.append(node)
    onnx.save(model, tmp_path / "model.onnx")
    with pytest.raises(Exception, match="node 'mine' \\(op 'MatMulIntegerToFloat'.*a model may not"):
        optimize(import_model(tmp_path / "model.onnx"))


OPENCL_SAMPLE = ["runtime-scale-and-bias", "zero-points-per-column", "batched-b-loop-nest"]
"""The IntGemm's epilogue on OpenCL, with a scale of one value and one per column, and the loop nest."""


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_computes_the_chain(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    """On OpenCL (PoCL in the suite) the fused kernel's IntGemm and its loop nest give the chain's values: its
    product is rounded to float32 before the bias is added there too (a statement of its own, or a double product
    rounded once)."""
    check_case_on_opencl(c, fingerprint, tmp_path)
