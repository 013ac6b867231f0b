"""Models with dynamic dimensions as exporters write them, for the tests of `--shape` (test_shapes, test_farm)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def dynamic_cnn(path: Path, batch: str | int = "batch") -> onnx.ModelProto:
    """Conv -> Relu -> Flatten the way torch.onnx exports it (Shape -> Gather -> Unsqueeze -> Concat -> Reshape)
    -> MatMul, with a symbolic batch dimension."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32), "fc"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "rest"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["conv"], name="conv"),
        helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
        helper.make_node("Shape", ["relu"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "zero"], ["n"], name="gather", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsqueeze"),
        helper.make_node("Concat", ["n1", "rest"], ["flat_shape"], name="concat", axis=0),
        helper.make_node("Reshape", ["relu", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc"], ["y"], name="fc"),
    ]
    weights.append(numpy_helper.from_array(np.array([0], np.int64), "axes"))
    graph = helper.make_graph(
        nodes,
        "dynamic_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return model
