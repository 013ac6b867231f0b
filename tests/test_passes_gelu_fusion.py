"""Tests of farm.frontend.passes.gelu_fusion: an exporter's spelled-out erf GELU run as one Gelu node, and its
outputs against onnxruntime's on a CPU and on OpenCL."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import OpCase, assert_matches_onnxruntime, check_case_on_opencl
from onnx import helper

from farm.frontend.passes import optimize
from tests.pass_helpers import _f32, _load, _model


def _gelu(
    scale: str = "Div",
    swapped: bool = False,
    root: float = math.sqrt(2.0),
    outputs=("y",),
    erf_read_again: bool = False,
) -> onnx.ModelProto:
    """y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5), as torch exports nn.GELU; `scale` "Mul" multiplies by
    1/sqrt 2 instead, `swapped` flips every commutative operand order."""
    pair = (lambda a, b: [b, a]) if swapped else (lambda a, b: [a, b])
    scaling = (
        helper.make_node("Div", ["x", "root"], ["d"])
        if scale == "Div"
        else helper.make_node("Mul", pair("x", "root"), ["d"])
    )
    nodes = [
        scaling,
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", pair("e", "one"), ["a"]),
        helper.make_node("Mul", pair("x", "a"), ["m"]),
        helper.make_node("Mul", pair("m", "half"), ["y"]),
    ]
    if erf_read_again:
        nodes.append(helper.make_node("Neg", ["e"], ["z"]))
    constants = {"root": root if scale == "Div" else 1.0 / root, "one": 1.0, "half": 0.5}
    inits = [(name, np.array(value, np.float32)) for name, value in constants.items()]
    return _model(nodes, [_f32("x", [2, 3, 16])], [_f32(name, [2, 3, 16]) for name in outputs], inits)


@pytest.mark.parametrize("scale", ["Div", "Mul"])
@pytest.mark.parametrize("swapped", [False, True])
def test_an_erf_gelu_becomes_one_gelu_node(onnx_model_path, scale, swapped):
    graph = optimize(_load(onnx_model_path, _gelu(scale, swapped)))
    [gelu] = graph.nodes
    assert (gelu.op_type, gelu.inputs, gelu.outputs, gelu.attrs) == ("Gelu", ["x"], ["y"], {})
    assert not {"d", "e", "a", "m"} & set(graph.values)


@pytest.mark.parametrize(
    "model, reason",
    [
        (_gelu(root=2.0), "Div by 2, not sqrt 2"),
        (_gelu(outputs=("y", "m")), "an intermediate is a model output"),
        (_gelu(erf_read_again=True, outputs=("y", "z")), "the Erf's output has another reader"),
    ],
)
def test_a_chain_that_is_no_gelu_stays(onnx_model_path, model, reason):
    graph = optimize(_load(onnx_model_path, model))
    assert "Erf" in [node.op_type for node in graph.nodes] and "Gelu" not in [n.op_type for n in graph.nodes], reason


@pytest.mark.parametrize("scale", ["Div", "Mul"])
def test_a_fused_gelu_matches_onnxruntime(tmp_path: Path, scale: str) -> None:
    assert_matches_onnxruntime(_gelu(scale, swapped=scale == "Mul"), tmp_path, name="gelu")


def test_a_fused_gelu_matches_onnxruntime_on_opencl(tmp_path: Path, fingerprint: str) -> None:
    check_case_on_opencl(OpCase("gelu", _gelu()), fingerprint, tmp_path)
