"""The graph pass that fuses a linear layer's bias Add into the MatMul before it."""

from __future__ import annotations

import numpy as np

from farm.frontend.passes.rewrite import all_names, unique_name
from farm.ir.graph import Graph, Node, TensorInfo


def fuse_matmul_biases(graph: Graph) -> Graph:
    """Fold y = Add(MatMul(x, W), b) into the MatMul, which then adds b to each row as its GEMM stores each tile
    (loopir.GemmEpilogue, bias on columns; Node.bias): a transformer's linear layers (torch exports them as MatMul
    then Add) no longer make a pass of their own over their outputs (bert_style: 24 such Adds, 5% of a run). Only
    where W is a constant matrix (shared by every row), b a float32 constant of W's columns (leading axes of 1
    allowed), the MatMul's output has this single reader, is no model output and float32, and the MatMul has no
    activation or bias yet; an activation after the Add is fused into the MatMul afterwards (fuse_activations).
    The MatMul writes the Add's output, where it stands."""
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    taken = all_names(graph)
    fused: set[int] = set()
    for node in graph.nodes:
        if node.domain or node.op_type != "Add" or len(node.inputs) != 2:
            continue
        for value, bias in (node.inputs, node.inputs[::-1]):
            matmul = producers.get(value)
            columns = _bias_columns(graph, matmul, value, bias, users, outputs) if matmul is not None else None
            if matmul is not None and columns is not None:
                _absorb(graph, matmul, node, columns, taken)
                producers[node.outputs[0]] = matmul
                fused.add(id(node))
                break
    graph.nodes = [node for node in graph.nodes if id(node) not in fused]
    return graph


def _bias_columns(
    graph: Graph, matmul: Node, value: str, bias: str, users: dict[str, list[Node]], outputs: set[str]
) -> np.ndarray | None:
    """The bias as one value per column of the MatMul's output, or None where the Add can't be fused."""
    if matmul.op_type != "MatMul" or matmul.domain or matmul.activation is not None or matmul.bias:
        return None
    if len(matmul.inputs) != 2 or matmul.outputs != [value] or value in outputs or len(users.get(value, [])) != 1:
        return None
    info, constants = graph.values.get(value), graph.constants
    if matmul.inputs[1] not in constants or bias not in constants or info is None or info.dtype != "float32":
        return None
    weight, given = constants.info(matmul.inputs[1]), constants.info(bias)  # shapes only: a big weight stays unread
    columns = weight.shape[-1] if len(weight.shape) == 2 else 0
    if not columns or given.dtype != "float32" or given.size != columns or len(given.shape) > len(info.shape):
        return None
    if given.shape and given.shape[-1] != columns:
        return None
    return constants[bias].reshape(columns)


def _absorb(graph: Graph, matmul: Node, add: Node, columns: np.ndarray, taken: set[str]) -> None:
    """Give the MatMul the bias as its third input and make it write the Add's output."""
    name = unique_name(taken, f"{matmul.name}/bias")
    graph.constants[name] = np.ascontiguousarray(columns)
    graph.values[name] = TensorInfo.of_array(graph.constants[name])
    graph.values.pop(matmul.outputs[0], None)
    matmul.inputs = [*matmul.inputs, name]
    matmul.outputs = list(add.outputs)
    matmul.bias = True
