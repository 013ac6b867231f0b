"""The op registry: every supported op has numerical cases in the test_ops_* files, each op module's ops are
covered by its own file, and lower_kernel orders a kernel's parameters as the planner passes its arguments."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import test_ops_attention
import test_ops_conv
import test_ops_conv_transpose
import test_ops_dequantized_matmul
import test_ops_elementwise
import test_ops_indexing
import test_ops_linalg
import test_ops_losses
import test_ops_matmul
import test_ops_normalization
import test_ops_pool
import test_ops_quantize
import test_ops_quantized_add
import test_ops_reduce
import test_ops_sampling
import test_ops_scatter
import test_ops_softmax
import test_ops_spectral
import test_ops_tensor
from numerics import graph_model, ops_of, rand
from onnx import helper, save

from farm.build.assembly import plan_model
from farm.ir import loopir as L
from farm.ir.graph import FUSED_OPS, TensorInfo
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import LOWERINGS, SUPPORTED_OPS, lower_kernel
from farm.ops.registry import coalesced

# Each op module and the test file whose cases cover it.
CASE_FILES = {
    "farm.ops.attention": test_ops_attention.CASES,
    "farm.ops.conv_transpose": test_ops_conv_transpose.CASES,
    "farm.ops.elementwise": test_ops_elementwise.CASES,
    "farm.ops.linalg": test_ops_linalg.CASES,
    "farm.ops.matmul": test_ops_matmul.CASES,
    "farm.ops.normalization": test_ops_normalization.CASES,
    "farm.ops.pool": test_ops_pool.CASES,
    "farm.ops.softmax": test_ops_softmax.CASES,
    # Conv (farm.ops.conv's), MaxPool and AveragePool register through window.register_by_rank, whose lowering picks
    # their kernel by spatial rank.
    "farm.ops.window": test_ops_conv.ALL_CASES + test_ops_pool.CASES,
    "farm.ops.quantize": test_ops_quantize.CASES,
    # QLinearAdd, which no model names: a graph pass makes it (its cases' schedules show it).
    "farm.ops.quantized_add": test_ops_quantized_add.CASES,
    # MatMulIntegerToFloat, which no model names either: the dequantize fusion pass makes it.
    "farm.ops.dequantized_matmul": test_ops_dequantized_matmul.CASES,
    "farm.ops.tensor": test_ops_tensor.CASES,
    "farm.ops.reduce": test_ops_reduce.CASES,
    "farm.ops.indexing": test_ops_indexing.CASES,
    "farm.ops.scatter": test_ops_scatter.CASES,
    "farm.ops.losses": test_ops_losses.CASES,
    "farm.ops.sampling": test_ops_sampling.CASES,
    "farm.ops.spectral": test_ops_spectral.CASES,
}


# Ops the cases use that never reach a kernel: the frontend turns Constant nodes into constants.
FRONTEND_OPS = {"Constant"}


def test_every_supported_op_has_a_case() -> None:
    covered = set().union(*(ops_of(cases) for cases in CASE_FILES.values())) - FRONTEND_OPS
    assert covered == set(SUPPORTED_OPS), (
        f"supported ops without a case: {sorted(set(SUPPORTED_OPS) - covered)}; "
        f"cases of unsupported ops: {sorted(covered - set(SUPPORTED_OPS))}"
    )


def test_the_op_set_reaches_the_transformer_issues_bar() -> None:
    """At least 80 ONNX op types (issue 5), listed in order; docs/conformance.md has a row for each
    (tests/test_conformance.py checks that)."""
    assert len(SUPPORTED_OPS) >= 80 and list(SUPPORTED_OPS) == sorted(SUPPORTED_OPS)
    assert {"LayerNormalization", "Gather", "Erf", "Where", "Einsum", "TopK", "ConvTranspose"} <= set(SUPPORTED_OPS)


@pytest.mark.parametrize("module", sorted(CASE_FILES))
def test_each_op_module_is_covered_by_its_own_file(module: str) -> None:
    registered = {op for op, lowering in LOWERINGS.items() if lowering.lower.__module__ == module}
    assert registered, f"{module} registers no op"
    assert registered <= ops_of(CASE_FILES[module]) | _scheduled(CASE_FILES[module])


def _scheduled(cases: list) -> set[str]:
    """The ops the cases' schedules name (a fused op shows there, never in a model)."""
    return {op for c in cases for op in c.schedule or ()}


def test_fused_ops_are_no_onnx_ops_and_each_has_several_cases() -> None:
    """farm's own ops (made by graph passes) stay out of SUPPORTED_OPS, and each is in several cases' schedules."""
    assert FUSED_OPS <= LOWERINGS.keys() and not FUSED_OPS & set(SUPPORTED_OPS)
    assert len(SUPPORTED_OPS) == len(LOWERINGS) - len(FUSED_OPS)
    cases = [c for cases in CASE_FILES.values() for c in cases]
    for op in FUSED_OPS:
        assert sum(1 for c in cases if op in (c.schedule or ())) >= 3, op


def test_each_case_file_has_several_cases_per_op() -> None:
    """Every op gets attribute variants, not a single smoke case (Identity and Dropout have fewer forms)."""
    cases = [c for cases in CASE_FILES.values() for c in cases]
    for op in SUPPORTED_OPS:
        count = sum(1 for c in cases if any(node.op_type == op for node in c.model.graph.node))
        assert count >= 3, f"{op} has only {count} cases"


# ------------------------------------------------------------------------------------------ parameter order


def _spec(op: str, attrs: dict, inputs: list[tuple[int, ...]], outputs: list[tuple[int, ...]]) -> KernelSpec:
    return KernelSpec(
        op, canonical_json(attrs), tuple(TensorInfo(s) for s in inputs), tuple(TensorInfo(s) for s in outputs), None, ""
    )


CONV_ATTRS = {"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1}


@pytest.mark.parametrize(
    "spec, names, scratch",
    [
        pytest.param(
            _spec("Conv", CONV_ATTRS, [(1, 4, 8, 8), (6, 4, 3, 3), (6,)], [(1, 6, 8, 8)]),
            ["out0", "in0", "in1", "in2"],
            True,
            id="conv-im2col-bias",
        ),
        pytest.param(
            _spec("Conv", CONV_ATTRS, [(1, 4, 8, 8), (6, 4, 3, 3)], [(1, 6, 8, 8)]),
            ["out0", "in0", "in1"],
            True,
            id="conv-im2col",
        ),
        pytest.param(
            _spec(
                "Conv",
                {**CONV_ATTRS, "kernel_shape": [1, 1], "pads": [0, 0, 0, 0]},
                [(1, 4, 8, 8), (6, 4, 1, 1)],
                [(1, 6, 8, 8)],
            ),
            ["out0", "in0", "in1"],
            False,
            id="conv-pointwise",
        ),
        pytest.param(
            _spec("Conv", {**CONV_ATTRS, "group": 4}, [(1, 4, 8, 8), (4, 1, 3, 3), (4,)], [(1, 4, 8, 8)]),
            ["out0", "in0", "in1", "in2"],
            True,
            id="conv-depthwise",
        ),
        pytest.param(
            _spec("Concat", {"axis": 1}, [(2, 3), (2, 4), (2, 1)], [(2, 8)]),
            ["out0", "in0", "in1", "in2"],
            False,
            id="concat",
        ),
        pytest.param(_spec("Relu", {}, [(5,)], [(5,)]), ["out0", "in0"], False, id="relu"),
    ],
)
def test_lower_kernel_params_are_outputs_then_inputs_then_scratch(
    spec: KernelSpec, names: list[str], scratch: bool
) -> None:
    kernel = lower_kernel(spec)
    expected = names + (["scratch"] if scratch else [])
    assert [p.name for p in kernel.params] == expected
    assert [p.output for p in kernel.params] == [n.startswith("out") or n == "scratch" for n in expected]
    assert all(p.dtype == L.F32 for p in kernel.params)
    assert (LOWERINGS[spec.op].scratch_floats(spec) > 0) == scratch


def test_planned_arguments_match_kernel_params(tmp_path: Path) -> None:
    """For every step of a planned model, the planner's arguments line up with lower_kernel's parameters: the
    node's outputs, its data inputs (constant-only inputs such as Clip's bounds or Pad's pads are not passed),
    then its scratch buffer."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["k"], name="clip"),
        helper.make_node("Pad", ["k", "pads"], ["p"], name="pad", mode="reflect"),
        helper.make_node("Conv", ["p", "dw"], ["d"], name="depthwise", group=6, pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["d", "p"], ["y"], name="concat", axis=1),
    ]
    initializers = {
        "w": rand(6, 4, 3, 3),
        "b": rand(6),
        "lo": np.float32(0),
        "hi": np.float32(6),
        "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64),
        "dw": rand(6, 1, 3, 3),
    }
    path = tmp_path / "m.onnx"
    save(graph_model(nodes, [("x", (1, 4, 8, 8))], ["y"], initializers), str(path))
    plan = plan_model(path)
    assert [step.spec.op for step in plan.steps] == ["Conv", "Pad", "Conv", "Concat"]  # Clip fused into Conv
    expected_args = {
        "conv": [("arena", "k"), ("arena", "x"), ("blob",), ("blob",), ("arena", "conv::scratch")],
        "pad": [("arena", "p"), ("arena", "k")],
        "depthwise": [("arena", "d"), ("arena", "p"), ("blob",), ("arena", "depthwise::scratch")],
        "concat": [("arena", "y"), ("arena", "d"), ("arena", "p")],
    }
    for step in plan.steps:
        kernel = lower_kernel(step.spec)
        assert len(kernel.params) == len(step.args), step.node
        got = [(a.kind, a.name) if a.kind == "arena" else (a.kind,) for a in step.args]
        assert got == expected_args[step.node], step.node
        outputs = len(step.spec.outputs)
        for i, (param, arg) in enumerate(zip(kernel.params, step.args)):
            is_scratch = param.name == "scratch"
            assert param.output == (i < outputs or is_scratch), (step.node, param)
            assert is_scratch == arg.name.endswith("::scratch"), (step.node, param, arg)


@pytest.mark.parametrize(
    ("shape", "operands", "merged", "merged_operands"),
    [
        ((1, 64, 16, 16), [(1, 64, 16, 16), (1, 64, 16, 16)], (16384,), [(16384,), (16384,)]),
        ((1, 64, 16, 16), [(64, 1, 1), (1, 64, 16, 16)], (64, 256), [(64, 1), (64, 256)]),
        ((2, 3, 4), [(4,), (3, 1), ()], (2, 3, 4), [(1, 1, 4), (1, 3, 1), (1, 1, 1)]),
        ((2, 3, 4, 5), [(2, 3, 1, 1), (2, 3, 4, 5)], (6, 20), [(6, 1), (6, 20)]),
        ((1, 1), [(1,), (1, 1)], (1,), [(1,), (1,)]),
        ((2, 0, 3), [(2, 0, 3), (1,)], (0,), [(0,), (1,)]),
    ],
)
def test_coalesced_merges_the_axes_every_operand_reads_alike(
    shape: tuple[int, ...],
    operands: list[tuple[int, ...]],
    merged: tuple[int, ...],
    merged_operands: list[tuple[int, ...]],
) -> None:
    assert coalesced(shape, operands) == (merged, merged_operands)


@pytest.mark.parametrize(("shape", "other"), [((2, 3, 4, 5), (3, 1, 5)), ((4, 1, 6), (1, 5, 1)), ((3, 7), (7,))])
def test_coalesced_shapes_broadcast_like_the_originals(shape: tuple[int, ...], other: tuple[int, ...]) -> None:
    """Reading each operand through its merged shape gives numpy's broadcast of the original."""
    a, b = np.arange(np.prod(shape)).reshape(shape), np.arange(np.prod(other)).reshape(other) * 1000
    out = np.broadcast_shapes(shape, other)
    merged, (a_shape, b_shape) = coalesced(out, [shape, other])
    got = np.broadcast_to(a.reshape(a_shape) + b.reshape(b_shape), merged)
    np.testing.assert_array_equal(got.reshape(out), a + b)
