"""The graph pass that fuses a skip connection's Add (or Sum) into the Conv whose output it adds to."""

from __future__ import annotations

from farm.ir.graph import Graph, Node

RESIDUAL_ADDS = frozenset({"Add", "Sum"})


def fuse_residual_adds(graph: Graph) -> Graph:
    """Fold y = Add(conv(x), r) (or Sum of the two) into the Conv, which then adds r as its GEMM stores each tile
    (loopir.GemmEpilogue): the skip connections of ResNets no longer make a pass of their own over three
    activation-sized tensors (light ResNet-50: 16 Sum kernels, 2.4 of its 65 ms on one core). Only where r has the
    conv's output shape and dtype (no broadcast), the conv's output has this single reader and is not a model
    output, and the conv is one whose lowering is a GEMM (not depthwise) with no activation yet; an activation
    after the Add is fused into the conv afterwards (fuse_activations). The conv moves to the Add's place in the
    node order, where r is sure to be computed."""
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    absorbed: set[int] = set()
    for index, node in enumerate(graph.nodes):
        if node.domain or node.op_type not in RESIDUAL_ADDS or len(node.inputs) != 2:
            continue
        for value, residual in (node.inputs, node.inputs[::-1]):
            conv = producers.get(value)
            if conv is not None and _absorbs_residual(graph, conv, value, residual, users, outputs):
                graph.nodes[index] = producers[node.outputs[0]] = _absorb(graph, conv, node, residual)
                absorbed.add(id(conv))
                break
    graph.nodes = [node for node in graph.nodes if id(node) not in absorbed]
    return graph


def _absorbs_residual(
    graph: Graph, conv: Node, value: str, residual: str, users: dict[str, list[Node]], outputs: set[str]
) -> bool:
    info, other = graph.values.get(value), graph.values.get(residual)
    if conv.op_type != "Conv" or conv.domain or conv.activation is not None or conv.residual:
        return False
    if conv.outputs[0] != value or len(conv.outputs) != 1 or value in outputs or len(users.get(value, [])) != 1:
        return False
    if info is None or other is None or residual == value or (info.shape, info.dtype) != (other.shape, other.dtype):
        return False
    weight = graph.values.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    group = int(conv.attrs.get("group", 1))
    depthwise = weight is not None and len(weight.shape) >= 3 and weight.shape[1] == 1 and weight.shape[0] == group
    return info.dtype == "float32" and weight is not None and not depthwise


def _absorb(graph: Graph, conv: Node, add: Node, residual: str) -> Node:
    """The conv that takes the Add's place: it writes the Add's output and reads the residual last."""
    inputs = conv.inputs + [""] * (3 - len(conv.inputs))
    graph.values.pop(conv.outputs[0], None)
    return Node(
        conv.name, conv.op_type, [*inputs, residual], list(add.outputs), dict(conv.attrs), conv.domain, residual=True
    )
