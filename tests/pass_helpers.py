"""What the tests of farm.frontend.passes share: small ONNX models, their import, and a check that an optimised
Graph computes what its model does (onnxruntime runs both)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from farm.frontend.onnx_import import import_model
from farm.frontend.passes import optimize
from farm.ir.graph import Graph

RNG = np.random.default_rng(42)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, initializers=(), opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _f32(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _load(onnx_model_path, model: onnx.ModelProto) -> Graph:
    return import_model(onnx_model_path(model))


def _node(graph: Graph, name: str):
    return next(n for n in graph.nodes if n.name == name)


def _run_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


# An optimised Graph back to ONNX, activations as separate nodes, to check numerics against the original model.
_ACTIVATION_NODES = {
    "relu": lambda x, y, p, init: [helper.make_node("Relu", [x], [y])],
    "leakyrelu": lambda x, y, p, init: [helper.make_node("LeakyRelu", [x], [y], alpha=p[0])],
    "clip": lambda x, y, p, init: [
        init.extend([(y + "__lo", np.float32(p[0])), (y + "__hi", np.float32(p[1]))]),
        helper.make_node("Clip", [x, y + "__lo", y + "__hi"], [y]),
    ][1:],
}


def _graph_to_onnx(graph: Graph) -> onnx.ModelProto:
    initializers = list(graph.constants.items())
    nodes = []
    for node in graph.nodes:
        attrs = {k: numpy_helper.from_array(v) if isinstance(v, np.ndarray) else v for k, v in node.attrs.items()}
        outputs = list(node.outputs)
        if node.activation is not None:
            outputs[0] += "__pre"
        nodes.append(helper.make_node(node.op_type, node.inputs, outputs, name=node.name, **attrs))
        if node.activation is not None:
            make = _ACTIVATION_NODES[node.activation.kind]
            nodes += make(outputs[0], node.outputs[0], node.activation.params, initializers)
    inputs = [_f32(name, graph.values[name].shape) for name in graph.inputs]
    outputs = [_f32(name, graph.values[name].shape) for name in graph.outputs]
    return _model(nodes, inputs, outputs, initializers, opset=max(graph.opset, 11))


def _assert_same_outputs(original: onnx.ModelProto, graph: Graph, feeds: dict[str, np.ndarray]) -> None:
    expected = _run_onnx(original, feeds)
    actual = _run_onnx(_graph_to_onnx(graph), feeds)
    for want, got in zip(expected, actual):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def optimized(model: onnx.ModelProto, tmp_path: Path) -> Graph:
    """`model` saved under tmp_path, imported and run through every pass."""
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return optimize(import_model(path))


def op_types(graph: Graph) -> list[str]:
    return [node.op_type for node in graph.nodes]
