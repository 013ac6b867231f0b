"""The graph pass that runs a quantized MaxPool on its bytes: DequantizeLinear(v) -> MaxPool -> QuantizeLinear with
the same scale and zero point (a ResNet's stem as onnxruntime's quantize_static writes it) becomes one MaxPool of
v, which farm runs on int8 and uint8 (farm.ops.pool) and whose result is what the chain computed, bit for bit.

Why exactly: dequantizing is non-decreasing in v (the scale positive, and rounding monotonic), so the max of the
dequantized window is the dequantized max; and quantizing (m - z) * s rounded to float32 back by the same s gives
m again, since the two roundings move the quotient by at most 255 * 2**-23 of a step (the scale a normal float32,
so (m - z) * s is one too). Read as written, the chain was three kernels and two float32 tensors (the quantized
light ResNet-18's stem: 29 us of its 1 ms on one core)."""

from __future__ import annotations

import numpy as np

from farm.frontend.passes.qdq_fusion import dequantized
from farm.frontend.passes.quantized_add import fuse_chains, quantizes_per_tensor, sole_producer
from farm.ir.graph import Graph, Node

SCALE_RANGE = (2.0**-100, 2.0**100)
"""The scales for which the round trip is exact: (m - z) * s a normal float32 for every 8-bit m - z, and finite."""


def pool_quantized_maxpools(graph: Graph) -> Graph:
    """Replace each DequantizeLinear -> MaxPool -> QuantizeLinear of one scale and zero point by a MaxPool of the
    quantized values writing the QuantizeLinear's output."""
    return fuse_chains(graph, _byte_pool)


def _byte_pool(
    graph: Graph, quantize: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[Node, list[Node]] | None:
    pool = _pool_into(graph, quantize, users, producers, outputs)
    if pool is None:
        return None
    source = producers[pool.inputs[0]].inputs[0]
    return Node(pool.name, "MaxPool", [source], [quantize.outputs[0]], dict(pool.attrs)), [pool]


def _pool_into(
    graph: Graph, quantize: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> Node | None:
    """The MaxPool of a fusable chain ending in the node `quantize`, or None."""
    if quantize.op_type != "QuantizeLinear" or quantize.domain or not quantizes_per_tensor(graph, quantize):
        return None
    pool = sole_producer(graph, quantize.inputs[0], users, producers, outputs)
    if pool is None or pool.op_type != "MaxPool" or len([name for name in pool.outputs if name]) != 1:
        return None
    operand = dequantized(graph, pool.inputs[0], producers)
    if operand is None or operand.axis is not None or operand.scale.size != 1:
        return None
    scale, zero = (graph.constants[name] for name in quantize.inputs[1:3])
    same_zero = (np.zeros((), zero.dtype) if not operand.zero else graph.constants[operand.zero]).reshape(())
    if graph.values[operand.values].dtype != zero.dtype.name or same_zero != zero.reshape(()):
        return None
    value = float(operand.scale.reshape(()))
    exact = SCALE_RANGE[0] <= value <= SCALE_RANGE[1] and scale.reshape(()) == operand.scale.reshape(())
    return pool if exact else None
