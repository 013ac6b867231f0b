"""The graph pass that adds two quantized tensors in one kernel: DequantizeLinear(a) + DequantizeLinear(b) ->
[Relu] -> QuantizeLinear, as onnxruntime's quantize_static writes the skip connections of a ResNet, becomes one
QLinearAdd node (farm.ops.quantized_add), which computes what the chain computed bit for bit.

Read as written, the chain is four kernels and two float32 tensors between them (a static QDQ ResNet-18's: 90 us of
its 1.4 ms on one core). The pass fuses where the kernel is exact: both operands 8-bit, dequantized per tensor with
constant float32 scales and zero points (DequantizeLinears that other nodes read as well stay for them), the Add's
and the Relu's output read by the next step alone and not a graph output, and a per-tensor QuantizeLinear with a
constant float32 scale and zero point dividing in float32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from farm.frontend.passes.dead_nodes import remove_dead_nodes
from farm.frontend.passes.qdq_fusion import BYTE_INTS, Dequantized, dequantized
from farm.frontend.passes.quantize_folding import kernel_attrs
from farm.ir.graph import Activation, Graph, Node

ChainFusion = Callable[[Graph, Node, dict[str, list[Node]], dict[str, Node], set[str]], tuple[Node, list[Node]] | None]
"""(graph, node, users, producers, graph outputs) -> (the node that takes `node`'s place, the nodes of the chain
before it, which go), or None where no chain ends in `node`."""


def fuse_chains(graph: Graph, fuse: ChainFusion) -> Graph:
    """One sweep in graph order replacing each chain `fuse` finds by its node, at the chain's last node's place
    (where every input of the chain is computed); then the nodes nothing reads any more go (the DequantizeLinear
    nodes that only the chains read)."""
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    replaced: set[int] = set()
    fused: dict[int, Node] = {}
    for node in graph.nodes:
        found = fuse(graph, node, users, producers, outputs)
        if found is not None:
            fused[id(node)] = found[0]
            replaced.update(id(step) for step in found[1])
    if not fused:
        return graph
    graph.nodes = [fused.get(id(node), node) for node in graph.nodes if id(node) not in replaced]
    return remove_dead_nodes(graph)


def fuse_quantized_adds(graph: Graph) -> Graph:
    """Replace each fusable DequantizeLinear pair -> Add -> [Relu] -> QuantizeLinear by one QLinearAdd."""
    return fuse_chains(graph, _quantized_add_chain)


def _quantized_add_chain(
    graph: Graph, quantize: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[Node, list[Node]] | None:
    chain = _chain_into(graph, quantize, users, producers, outputs)
    if chain is None:
        return None
    add, relu = chain
    absorbed = [add] if relu is None else [add, relu]
    return _quantized_add(graph, add, quantize, relu is not None, producers), absorbed


def _chain_into(
    graph: Graph, quantize: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[Node, Node | None] | None:
    """(Add, Relu or None) of a fusable chain ending in the node `quantize`, or None."""
    if quantize.op_type != "QuantizeLinear" or quantize.domain or not quantizes_per_tensor(graph, quantize):
        return None
    relu, value = None, quantize.inputs[0]
    step = sole_producer(graph, value, users, producers, outputs)
    if step is not None and step.op_type == "Relu":
        relu, step = step, sole_producer(graph, step.inputs[0], users, producers, outputs)
    if step is None or step.op_type != "Add" or len(step.inputs) != 2 or len(step.outputs) != 1:
        return None
    operands = [dequantized(graph, name, producers) for name in step.inputs]
    return (step, relu) if all(_per_tensor(operand) for operand in operands) else None


def sole_producer(
    graph: Graph, value: str, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> Node | None:
    """The default-domain node writing float32 `value`, when one node alone reads it and it is no graph output."""
    node, info = producers.get(value), graph.values.get(value)
    if node is None or node.domain or value in outputs or len(users.get(value, [])) != 1:
        return None
    return node if info is not None and info.dtype == "float32" else None


def _per_tensor(operand: Dequantized | None) -> bool:
    return operand is not None and operand.axis is None and operand.scale.size == 1


def quantizes_per_tensor(graph: Graph, quantize: Node) -> bool:
    """A QuantizeLinear of float32 by one constant float32 scale, dividing in float32, to 8 bits by one constant
    zero point of the output's dtype."""
    if len(quantize.inputs) < 3 or not all(name in graph.constants for name in quantize.inputs[1:3]):
        return False
    scale, zero = (graph.constants[name] for name in quantize.inputs[1:3])
    x, y = graph.values.get(quantize.inputs[0]), graph.values.get(quantize.outputs[0])
    attrs = kernel_attrs(graph, quantize)
    if x is None or y is None or attrs is None or attrs["block_size"] or quantize.attrs.get("precision"):
        return False
    return (
        x.dtype == "float32"
        and scale.dtype == np.float32
        and scale.size == 1
        and zero.size == 1
        and zero.dtype.name == y.dtype
        and y.dtype in BYTE_INTS
    )


def _quantized_add(graph: Graph, add: Node, quantize: Node, relu: bool, producers: dict[str, Node]) -> Node:
    """The QLinearAdd, named as the Add was, writing the QuantizeLinear's output."""
    a, b = (dequantized(graph, name, producers) for name in add.inputs)
    assert a is not None and b is not None, "_chain_into checked both operands"
    inputs = [a.values, a.scale_name, a.zero, b.values, b.scale_name, b.zero, *quantize.inputs[1:3]]
    return Node(add.name, "QLinearAdd", inputs, [quantize.outputs[0]], activation=Activation("relu") if relu else None)
