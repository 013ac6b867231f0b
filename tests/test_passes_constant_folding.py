"""Tests of farm.frontend.passes.constant_folding: constant folding, and the declared shapes it checks again."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.errors import UnsupportedError
from farm.frontend.passes import optimize
from farm.frontend.passes.constant_folding import fold_constants
from farm.ir.graph import Graph, TensorInfo
from tests.pass_helpers import _f32, _load, _model, _rand


@pytest.mark.parametrize("opset", [9, 11, 13])
def test_shape_chain_folds_to_constant_reshape_shape(onnx_model_path, opset):
    """x[2,3,4] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) == Reshape(x, [2, -1])."""
    axes = {"axes": [0]} if opset < 13 else {}
    unsqueeze_inputs = ["g"] if opset < 13 else ["g", "axes"]
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["g"], axis=0),
        helper.make_node("Unsqueeze", unsqueeze_inputs, ["u"], **axes),
        helper.make_node("Concat", ["u", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape"),
    ]
    initializers = [
        ("zero", np.array(0, np.int64)),
        ("minus_one", np.array([-1], np.int64)),
        ("axes", np.array([0], np.int64)),
    ]
    graph = _load(onnx_model_path, _model(nodes, [_f32("x", [2, 3, 4])], [_f32("y", None)], initializers, opset))
    graph = optimize(graph)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    reshape = graph.nodes[0]
    np.testing.assert_array_equal(graph.constants[reshape.inputs[1]], [2, -1])
    assert graph.values["y"].shape == (2, 12)
    assert set(graph.constants) == {reshape.inputs[1]}  # the folded chain's constants are gone


def test_constant_of_shape_weight_folds_and_unused_constants_go(onnx_model_path):
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])
    nodes = [
        helper.make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
    ]
    model = _model(nodes, [_f32("x", [2, 3])], [_f32("y", [2, 5])], [("w_shape", np.array([3, 5], np.int64))], 9)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["MatMul"]
    np.testing.assert_array_equal(graph.constants["w"], np.full((3, 5), 0.25, np.float32))
    assert graph.values["w"] == TensorInfo.of_array(graph.constants["w"]) == TensorInfo((3, 5), "float32")
    assert "w_shape" not in graph.constants


def test_reshape_with_folded_shape_gets_static_output(onnx_model_path):
    """A shape only known after folding (ConstantOfShape + Add) still gives the Reshape a static output info."""
    one = helper.make_tensor("v", TensorProto.INT64, [1], [3])
    nodes = [
        helper.make_node("ConstantOfShape", ["two"], ["threes"], value=one),
        helper.make_node("Add", ["threes", "delta"], ["shape"]),
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Shape", ["r"], ["rs"]),
        helper.make_node("Reshape", ["x2", "rs"], ["y"], name="reshape2"),
    ]
    initializers = [("two", np.array([2], np.int64)), ("delta", np.array([-1, 1], np.int64))]
    model = _model(nodes, [_f32("x", [8]), _f32("x2", [2, 4])], [_f32("y", None), _f32("r", None)], initializers)
    graph = optimize(_load(onnx_model_path, model))
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Reshape"]
    assert graph.values["r"].shape == (2, 4) and graph.values["y"].shape == (2, 4)
    np.testing.assert_array_equal(graph.constants["rs"], [2, 4])


def test_folding_does_not_mutate_or_copy_shared_inputs(onnx_model_path):
    weight = _rand(4, 3)
    nodes = [
        helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "wt"], ["y1"], name="mm1"),
        helper.make_node("MatMul", ["x2", "w"], ["y2"], name="mm2"),
    ]
    model = _model(
        nodes, [_f32("x", [2, 3]), _f32("x2", [5, 4])], [_f32("y1", [2, 4]), _f32("y2", [5, 3])], [("w", weight)]
    )
    graph = fold_constants(_load(onnx_model_path, model))
    np.testing.assert_array_equal(graph.constants["w"], weight)
    np.testing.assert_array_equal(graph.constants["wt"], weight.T)
    assert graph.constants["wt"].flags.c_contiguous


def test_folding_leaves_a_too_big_constant_as_a_node(onnx_model_path):
    """Range(0, 2**28) as int64 is 2 GiB: over MAX_FOLDED_CONSTANT_BYTES, so it is not evaluated at build time."""
    nodes = [
        helper.make_node("Range", ["a", "b", "c"], ["r"], name="range"),
        helper.make_node("Range", ["a", "small", "c"], ["s"], name="small_range"),
        helper.make_node("Concat", ["r", "s"], ["y"], name="concat", axis=0),
    ]
    inits = [
        ("a", np.array(0, np.int64)),
        ("b", np.array(2**28, np.int64)),
        ("c", np.array(1, np.int64)),
        ("small", np.array(4, np.int64)),
    ]
    model = _model(nodes, [], [helper.make_tensor_value_info("y", TensorProto.INT64, None)], inits, opset=17)
    graph = fold_constants(_load(onnx_model_path, model))
    assert [n.name for n in graph.nodes] == ["range", "concat"]
    np.testing.assert_array_equal(graph.constants["s"], np.arange(4))
    assert graph.values["r"] == TensorInfo((2**28,), "int64")


def test_folding_checks_a_declared_shape_inference_could_not(onnx_model_path):
    """A value whose declared shape import had to take on trust must fold to that shape."""
    nodes = [
        helper.make_node("Unique", ["k"], ["u"], name="unique"),
        helper.make_node("Add", ["x", "u"], ["y"], name="add"),
    ]
    model = _model(nodes, [_f32("x", [3])], [_f32("y", None)], [("k", np.float32([1, 1, 2]))], opset=17)
    model.graph.value_info.append(_f32("u", [3]))
    with pytest.raises(UnsupportedError, match=r"'unique'.*'u' is declared with shape \[3\] but computes to \[2\]"):
        fold_constants(_load(onnx_model_path, model))


def test_a_declared_shape_folding_makes_checkable_is_checked(onnx_model_path):
    """Reshape's shape is only known after folding; a value info declaring a bigger output must then be refused
    (the Reshape kernel would copy past its input)."""
    nodes = [
        helper.make_node("Max", ["k", "k"], ["shape"], name="same"),
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    model = _model(nodes, [_f32("x", [2, 3])], [_f32("y", None)], [("k", np.array([3, 2], np.int64))], opset=17)
    model.graph.value_info.append(_f32("r", [8, 8]))
    graph = _load(onnx_model_path, model)
    assert "r" in graph.declared_shapes
    with pytest.raises(
        UnsupportedError,
        match=r"'reshape'.*'r' is declared with shape \[8, 8\] but computes to "
        r"\[3, 2\]",
    ):
        fold_constants(graph)


RUNTIME_SHAPED = {
    "reshape past its input": ("Reshape", [1, 4], [1000, 4], "doesn't fit input 'x' \\[1, 4\\]"),
    "tile to a non-multiple": ("Tile", [2, 4], [3, 4], "doesn't fit input 'x' \\[2, 4\\]"),
    "an op that has no check": ("Slice", [2, 4], [2, 4], "known only at run time"),
}


@pytest.mark.parametrize(("op", "source", "declared", "message"), RUNTIME_SHAPED.values(), ids=RUNTIME_SHAPED.keys())
def test_a_shape_only_a_declaration_gives_must_fit_the_ops_input(
    onnx_model_path, op: str, source: list[int], declared: list[int], message: str
):
    """An output shape that depends on a graph input's values (a Reshape to a shape given at run time) is taken
    from the declaration only when the op's kernel then reads inside its input; otherwise it is refused, naming
    the node (the kernel would read past its input: an out-of-bounds read made by the model)."""
    nodes = [helper.make_node(op, ["x", "shape"] + (["shape"] if op == "Slice" else []), ["y"], name="rt")]
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [len(source)])
    model = _model(nodes, [_f32("x", source), shape], [_f32("y", declared)], [], opset=17)
    with pytest.raises(UnsupportedError, match=f"'rt'.*{message}"):
        fold_constants(_load(onnx_model_path, model))


def test_a_runtime_shaped_reshape_that_fits_is_built_for_its_declared_shape(onnx_model_path):
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="rt")]
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    model = _model(nodes, [_f32("x", [1, 4]), shape], [_f32("y", [2, 2])], [], opset=17)
    assert fold_constants(_load(onnx_model_path, model)).values["y"].shape == (2, 2)


def test_an_empty_graph_input_is_a_constant_that_stays_an_input(onnx_model_path):
    """An empty `axes` input can only be fed []: it folds into the ReduceSum as "no axes" (all of them)."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="sum")]
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [0])
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [2, 3]), axes], [_f32("y", None)])))
    assert graph.inputs == ["x", "axes"]
    assert graph.constants["axes"].shape == (0,) and graph.constants["axes"].dtype == np.int64
    assert graph.values["y"] == TensorInfo((1, 1), "float32")


def test_a_node_whose_outputs_are_all_empty_folds_without_running(onnx_model_path):
    """A Slice of a graph input that selects nothing has one possible value, whatever the input holds; the Mul
    of that empty value folds in turn, and the Concat reads the empty constant."""
    nodes = [
        helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
        helper.make_node("Mul", ["s", "s"], ["m"], name="mul"),
        helper.make_node("Concat", ["m", "x"], ["y"], name="concat", axis=1),
    ]
    inits = [("starts", np.array([1], np.int64)), ("ends", np.array([1], np.int64))]
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [2, 3])], [_f32("y", None)], inits)))
    assert [n.name for n in graph.nodes] == ["concat"]
    assert graph.constants["m"].shape == (0, 3) and graph.constants["m"].dtype == np.float32


def test_an_empty_model_output_is_still_computed_by_its_node(onnx_model_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    graph = fold_constants(_load(onnx_model_path, _model(nodes, [_f32("x", [0, 3])], [_f32("y", None)])))
    assert [n.name for n in graph.nodes] == ["relu"] and "y" not in graph.constants


def test_an_empty_shape_only_a_declaration_gives_is_checked_not_folded(onnx_model_path):
    """A Reshape to a shape given at run time, declared [0, 4] on a 4-element input, does not fold to an empty
    constant: the declaration is checked against the input first, and refused."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="rt"),
        helper.make_node("Concat", ["r", "x"], ["y"], name="concat", axis=0),
    ]
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    model = _model(nodes, [_f32("x", [1, 4]), shape], [_f32("y", None)], [], opset=17)
    model.graph.value_info.append(_f32("r", [0, 4]))
    with pytest.raises(UnsupportedError, match=r"'rt'.*doesn't fit input 'x' \[1, 4\]"):
        fold_constants(_load(onnx_model_path, model))


def test_an_empty_output_of_an_op_without_a_run_time_check_takes_its_declared_shape(onnx_model_path):
    """A Slice whose starts and ends come at run time, declared to select nothing: its output has no value, whatever
    the run gives, and the node gets no kernel (an op with a RUNTIME_SHAPE_CHECKS entry keeps its check: above)."""
    nodes = [helper.make_node("Slice", ["x", "starts", "ends"], ["y"], name="rt")]
    bounds = [helper.make_tensor_value_info(name, TensorProto.INT64, [1]) for name in ("starts", "ends")]
    model = _model(nodes, [_f32("x", [3, 4]), *bounds], [_f32("y", [3, 0])], [], opset=17)
    assert fold_constants(_load(onnx_model_path, model)).values["y"].shape == (3, 0)


@pytest.mark.parametrize(
    ("shape", "declared", "keepdims", "builds"),
    [
        ([2, 0, 4], [2, 1, 4], 1, True),
        ([2, 0, 4], [2, 4], 0, True),
        ([2, 0, 4], [2, 0, 1], 1, True),
        ([2, 0, 4], [2, 4], 1, False),  # keepdims: the declared output must have the input's rank
        ([2, 3, 4], [2, 1, 4], 1, False),  # the values depend on the axes: refused
    ],
)
def test_a_reduction_of_an_empty_input_takes_its_declared_shape_with_run_time_axes(
    onnx_model_path, shape, declared, keepdims, builds
):
    """Each element of a non-empty output of a reduction of an empty tensor reduces nothing, whatever the axes: the
    declared shape stands as for RUNTIME_SHAPE_CHECKS. A non-empty input's reduction depends on the axes' values."""
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="rt", keepdims=keepdims)]
    axes = helper.make_tensor_value_info("axes", TensorProto.INT64, [1])
    model = _model(nodes, [_f32("x", shape), axes], [_f32("y", declared)], [], opset=17)
    if builds:
        assert fold_constants(_load(onnx_model_path, model)).values["y"].shape == tuple(declared)
    else:
        with pytest.raises(UnsupportedError, match="'rt'.*known only at run time"):
            fold_constants(_load(onnx_model_path, model))


DIRECT_FOLDS = {
    "constant-of-shape, default value": (
        helper.make_node("ConstantOfShape", ["s"], ["y"]),
        {"s": np.array([2, 3], np.int64)},
        17,
    ),
    "constant-of-shape, int32 value": (
        helper.make_node("ConstantOfShape", ["s"], ["y"], value=numpy_helper.from_array(np.array([7], np.int32))),
        {"s": np.array([4], np.int64)},
        17,
    ),
    "constant-of-shape, a scalar": (
        helper.make_node("ConstantOfShape", ["s"], ["y"], value=numpy_helper.from_array(np.array([1.5], np.float64))),
        {"s": np.zeros(0, np.int64)},
        17,
    ),
    "unsqueeze, axes input": (
        helper.make_node("Unsqueeze", ["x", "a"], ["y"]),
        {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "a": np.array([-1, 0], np.int64)},
        17,
    ),
    "unsqueeze, axes attribute": (
        helper.make_node("Unsqueeze", ["x"], ["y"], axes=[1, 3]),
        {"x": np.arange(6, dtype=np.int64).reshape(2, 3)},
        11,
    ),
}


@pytest.mark.parametrize("case", list(DIRECT_FOLDS))
def test_ops_folded_in_numpy_give_the_reference_evaluators_constants(case: str) -> None:
    """ConstantOfShape and Unsqueeze fold without a reference evaluator per node (constant_folding._DIRECT_FOLDERS):
    the same values, dtypes and shapes as onnx's reference gives, which everything else still folds with."""
    from farm.frontend.passes import constant_folding
    from farm.ir.graph import Node

    proto, constants, opset = DIRECT_FOLDS[case]
    attrs = {
        a.name: numpy_helper.to_array(a.t)
        if a.type == onnx.AttributeProto.TENSOR
        else onnx.helper.get_attribute_value(a)
        for a in proto.attribute
    }
    node = Node("n", proto.op_type, list(proto.input), list(proto.output), attrs)
    graph = Graph("g", opset, [], ["z"], {}, dict(constants), [node])
    ours = constant_folding._DIRECT_FOLDERS[proto.op_type](graph, node)
    reference = constant_folding._evaluate(graph, node)
    assert ours is not None and reference is not None
    assert ours[0].dtype == reference[0].dtype and ours[0].shape == reference[0].shape
    np.testing.assert_array_equal(ours[0], reference[0])


def fills_added_model(count: int, elements: int) -> onnx.ModelProto:
    """`count` ConstantOfShape([1, elements]) of float32, each added to the running sum of input x (issue 30's
    model: a file of under 1 KB that folds `count` x `elements` x 4 bytes at plan time)."""
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    nodes, total = [], "x"
    for index in range(count):
        nodes += [
            helper.make_node("ConstantOfShape", ["shape"], [f"c{index}"], name=f"fill{index}", value=fill),
            helper.make_node("Add", [total, f"c{index}"], [f"s{index}"], name=f"add{index}"),
        ]
        total = f"s{index}"
    return _model(
        nodes,
        [_f32("x", [1, elements])],
        [_f32(total, [1, elements])],
        [("shape", np.array([1, elements], np.int64))],
        opset=17,
    )


def test_folding_past_the_budget_fails_naming_the_node(onnx_model_path, monkeypatch):
    """FARM_MAX_FOLDED_BYTES bounds the sum of the constants one plan folds (each is under the per-constant bound):
    the fill that takes it over is named, with the budget, and nothing past it is folded."""
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str(3 << 20))
    graph = _load(onnx_model_path, fills_added_model(8, 1 << 18))  # 1 MiB a fill
    with pytest.raises(UnsupportedError) as refused:
        fold_constants(graph)
    assert refused.value.exit_status == 2 and refused.value.node == "fill3" and refused.value.op == "ConstantOfShape"
    assert "FARM_MAX_FOLDED_BYTES=3145728" in str(refused.value) and f"({4 << 20} bytes)" in str(refused.value)
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str(8 << 20))  # exactly what the model folds: it fits
    assert [n.op_type for n in fold_constants(_load(onnx_model_path, fills_added_model(8, 1 << 18))).nodes] == [
        "Add"
    ] * 8


def test_a_folded_view_of_a_constant_costs_nothing_of_the_budget(onnx_model_path, monkeypatch):
    """Unsqueeze and Reshape fold to views of their input (numpy's, and the reference evaluator's): only memory that
    folding allocates counts, so a chain of them over one 1 MiB fill fits a 1 MiB budget."""
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str(1 << 20))
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill", value=fill),
        helper.make_node("Unsqueeze", ["c", "axes"], ["u"], name="unsqueeze"),
        helper.make_node("Reshape", ["u", "flat"], ["r"], name="reshape"),
        helper.make_node("Add", ["x", "r"], ["y"], name="add"),
    ]
    inits = [
        ("shape", np.array([512, 512], np.int64)),
        ("axes", np.array([0], np.int64)),
        ("flat", np.array([1 << 18], np.int64)),
    ]
    graph = fold_constants(
        _load(onnx_model_path, _model(nodes, [_f32("x", [1 << 18])], [_f32("y", [1 << 18])], inits, opset=17))
    )
    assert [n.name for n in graph.nodes] == ["add"]
    np.testing.assert_array_equal(graph.constants["r"], np.full(1 << 18, 0.5, np.float32))
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", str((1 << 20) - 1))  # the fill alone passes a byte less
    with pytest.raises(UnsupportedError, match="node 'fill'"):
        fold_constants(
            _load(onnx_model_path, _model(nodes, [_f32("x", [1 << 18])], [_f32("y", [1 << 18])], inits, opset=17))
        )
