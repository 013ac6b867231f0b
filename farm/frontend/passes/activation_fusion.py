"""The graph pass that fuses Relu, LeakyRelu and Clip into the node that produces their input."""

from __future__ import annotations

import math
from collections.abc import Callable

from farm.ir.graph import Activation, Graph, Node

# Ops whose output the fused activation may be applied to, in the op's own kernel.
FUSABLE_PRODUCERS = frozenset(
    {"Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Sum", "BatchNormalization", "ConvTranspose"}
)


def _relu(graph: Graph, node: Node) -> Activation | None:
    return Activation("relu")


def _leaky_relu(graph: Graph, node: Node) -> Activation | None:
    return Activation("leakyrelu", (float(node.attrs.get("alpha", 0.01)),))


def _clip(graph: Graph, node: Node) -> Activation | None:
    """Clip's bounds: attributes before opset 11, constant inputs from 11 (absent: unbounded); None if not constant."""
    if graph.opset < 11:
        return Activation("clip", (float(node.attrs.get("min", -math.inf)), float(node.attrs.get("max", math.inf))))
    bounds = []
    for index, default in ((1, -math.inf), (2, math.inf)):
        name = node.inputs[index] if index < len(node.inputs) else ""
        if not name:
            bounds.append(default)
        elif name in graph.constants and graph.constants[name].size == 1:
            bounds.append(float(graph.constants[name].reshape(-1)[0]))
        else:
            return None
    return Activation("clip", tuple(bounds))


# Activation ops that can be fused, each giving the Activation to set on the producer (None: not fusable).
_ACTIVATIONS: dict[str, Callable[[Graph, Node], Activation | None]] = {
    "Relu": _relu,
    "LeakyRelu": _leaky_relu,
    "Clip": _clip,
}


def fuse_activations(graph: Graph) -> Graph:
    """Fuse Relu, LeakyRelu and Clip into the node producing their input, so no separate pass over memory runs.

    Only when that input has this single consumer, is not a model output, and its producer is one of
    FUSABLE_PRODUCERS without an activation yet; the producer then writes the activation's output.
    """
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    fused: set[int] = set()
    for node in graph.nodes:
        read = _ACTIVATIONS.get(node.op_type) if not node.domain else None
        producer = _fusable_producer(node, users, producers, outputs) if read else None
        activation = read(graph, node) if read and producer else None
        if producer is None or activation is None:
            continue
        x, y = node.inputs[0], node.outputs[0]
        producer.activation = activation
        producer.outputs = [y, *producer.outputs[1:]]
        producers[y] = producers.pop(x)
        users.pop(x, None)
        graph.values.pop(x, None)
        fused.add(id(node))
    graph.nodes = [node for node in graph.nodes if id(node) not in fused]
    return graph


def _fusable_producer(
    node: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> Node | None:
    x = node.inputs[0] if node.inputs else ""
    producer = producers.get(x)
    if producer is None or producer.domain or producer.op_type not in FUSABLE_PRODUCERS:
        return None
    if producer.activation is not None or producer.outputs[0] != x:
        return None
    if x in outputs or users.get(x) != [node]:
        return None
    return producer
