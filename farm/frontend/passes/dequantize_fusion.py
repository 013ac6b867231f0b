"""The graph pass that dequantizes an integer product as it is stored: MatMulInteger -> Cast to float32 -> Mul by a
scale -> [Add of a bias] becomes one MatMulIntegerToFloat node (farm.ops.dequantized_matmul), which computes what
the chain computed bit for bit.

onnxruntime's quantize_dynamic writes that chain for every MatMul of a transformer (the scale is the runtime data
scale times the weight's, the bias the linear layer's), and the QDQ fusion pass writes it for a product that no
QuantizeLinear follows. Read as written it is four kernels, and an int32 and two float32 tensors between them: on
the small BERT's AVX2 code, 0.07 ms of 0.74 and, on two threads, three launches (each ending in a barrier) per
product. The pass fuses where the kernel is exact: a default-domain MatMulInteger whose int32 output only the Cast
reads, a Cast to float32 that only the Mul reads, a Mul by a float32 scale of one value or one per output column
that leaves the shape as it is, and an Add of a float32 bias of one value or one per column that only reads the
Mul's output; no value inside the chain is a graph output.
"""

from __future__ import annotations

from onnx import TensorProto

from farm.frontend.passes.quantized_add import fuse_chains, sole_producer
from farm.ir.graph import Graph, Node

Chain = tuple[Node, Node, Node, str, str]
"""(MatMulInteger, Cast, Mul, the scale, the bias or "") of a fusable chain."""


def fuse_dequantized_products(graph: Graph) -> Graph:
    """Replace each fusable MatMulInteger -> Cast -> Mul -> [Add] chain by one MatMulIntegerToFloat."""
    return fuse_chains(graph, _dequantized_product)


def _dequantized_product(
    graph: Graph, last: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[Node, list[Node]] | None:
    """(the MatMulIntegerToFloat that takes `last`'s place, named as the MatMulInteger was, and the chain's other
    nodes) where `last` ends a chain: the Add of a bias, or the Mul when no such Add follows it."""
    chain = _chain_into(graph, last, users, producers, outputs)
    if chain is None:
        return None
    matmul, cast, mul, scale, bias = chain
    inputs = [*matmul.inputs, *[""] * (4 - len(matmul.inputs)), scale, bias]
    fused = Node(matmul.name, "MatMulIntegerToFloat", inputs, [last.outputs[0]])  # `farm bench --compare` pairs them
    return fused, [matmul, cast] + ([mul] if mul is not last else [])


def _chain_into(
    graph: Graph, last: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> Chain | None:
    """The fusable chain ending in `last` (an Add of a bias, or a Mul that no such Add reads), or None."""
    if last.domain or len(last.inputs) != 2 or len(last.outputs) != 1:
        return None
    if last.op_type == "Add":
        for value, bias in (last.inputs, last.inputs[::-1]):
            mul = sole_producer(graph, value, users, producers, outputs)
            chain = None if mul is None else _scaled_sums(graph, mul, users, producers, outputs)
            if chain is not None and _per_column(graph, bias, value, last.outputs[0]):
                return (*chain, bias)
        return None
    if last.op_type != "Mul" or any(_chain_into(graph, add, users, producers, outputs) for add in _adds(last, users)):
        return None
    chain = _scaled_sums(graph, last, users, producers, outputs)
    return None if chain is None else (*chain, "")


def _adds(mul: Node, users: dict[str, list[Node]]) -> list[Node]:
    """The Add nodes that read `mul`'s output (one of them may end the chain instead of `mul`)."""
    return [node for node in users.get(mul.outputs[0], []) if node.op_type == "Add"]


def _scaled_sums(
    graph: Graph, mul: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[Node, Node, Node, str] | None:
    """(MatMulInteger, Cast, `mul`, the scale) where `mul` multiplies a fusable product's float32 sums by a scale."""
    if mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2:
        return None
    for value, scale in (mul.inputs, mul.inputs[::-1]):
        cast = sole_producer(graph, value, users, producers, outputs)
        if cast is None or cast.op_type != "Cast" or cast.attrs.get("to") != TensorProto.FLOAT:
            continue
        matmul, sums = producers.get(cast.inputs[0]), cast.inputs[0]
        if matmul is None or matmul.op_type != "MatMulInteger" or matmul.domain:
            continue
        if sums in outputs or len(users.get(sums, [])) != 1 or not _per_column(graph, scale, sums, mul.outputs[0]):
            continue
        return matmul, cast, mul, scale
    return None


def _per_column(graph: Graph, value: str, operand: str, result: str) -> bool:
    """Whether float32 `value` is one value or one per column of `result`, and `result` has its `operand`'s shape
    (what `value` multiplies or is added to): no broadcast grows it."""
    info, before, out = (graph.values.get(name) for name in (value, operand, result))
    if info is None or before is None or out is None or info.dtype != "float32" or not out.shape:
        return False
    return out.shape == before.shape and (info.size == 1 or list(info.shape) == [out.shape[-1]])
