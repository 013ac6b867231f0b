"""The graph pass that folds an inference BatchNormalization into the weight and bias of the Conv that alone
feeds it."""

from __future__ import annotations

import numpy as np

from farm.frontend.passes.rewrite import constant_weight, fold_into_convs, unique_name
from farm.ir.graph import Graph, Node, TensorInfo


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold an inference BatchNormalization with constant parameters into the Conv that alone feeds it.

    W' = W * scale / sqrt(var + eps) per output channel and b' = (b - mean) * scale / sqrt(var + eps) + beta; the
    folded weight and bias are new constants, since the originals may be shared with other nodes.
    """
    return fold_into_convs(graph, _fold_bn)


def _fold_bn(
    graph: Graph, bn: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str], taken: set[str]
) -> Node | None:
    conv = _conv_to_fold_into(graph, bn, users, producers, outputs)
    if conv is not None:
        _merge_bn_into_conv(graph, conv, bn, taken)
    return conv


def _conv_to_fold_into(
    graph: Graph, bn: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> Node | None:
    """The Conv that `bn` can be folded into, or None when folding would change what the graph computes."""
    if bn.op_type != "BatchNormalization" or bn.domain or bn.attrs.get("training_mode", 0):
        return None
    if len(bn.inputs) < 5 or not all(name in graph.constants for name in bn.inputs[1:5]):
        return None
    if any(name and (name in users or name in outputs) for name in bn.outputs[1:]):
        return None  # running-statistics outputs are in use
    x = bn.inputs[0]
    conv = producers.get(x)
    if conv is None or conv.op_type != "Conv" or conv.domain or conv.activation is not None:
        return None
    if conv.outputs[0] != x or x in outputs or users.get(x) != [bn]:
        return None
    if not constant_weight(graph, conv):
        return None
    weight = graph.constants[conv.inputs[1]]
    if weight.dtype.kind != "f" or weight.ndim < 3:
        return None
    channels = weight.shape[0]
    return conv if all(graph.constants[name].size == channels for name in bn.inputs[1:5]) else None


def _merge_bn_into_conv(graph: Graph, conv: Node, bn: Node, taken: set[str]) -> None:
    """Give conv the folded weight and bias, make it write bn's output, and forget conv's old output."""
    scale, beta, mean, var = (graph.constants[name].astype(np.float64).reshape(-1) for name in bn.inputs[1:5])
    weight = graph.constants[conv.inputs[1]]
    has_bias = len(conv.inputs) > 2 and conv.inputs[2]
    bias = graph.constants[conv.inputs[2]].astype(np.float64) if has_bias else np.zeros_like(mean)
    factor = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
    new_weight = weight * factor.astype(weight.dtype).reshape((-1,) + (1,) * (weight.ndim - 1))
    new_bias = ((bias - mean) * factor + beta).astype(weight.dtype)
    w_name = unique_name(taken, f"{conv.name}/bn_folded_weight")
    b_name = unique_name(taken, f"{conv.name}/bn_folded_bias")
    for name, array in ((w_name, new_weight), (b_name, new_bias)):
        graph.constants[name] = array
        graph.values[name] = TensorInfo.of_array(array)
    old_output = conv.outputs[0]
    conv.inputs = [conv.inputs[0], w_name, b_name]
    conv.outputs = [bn.outputs[0], *conv.outputs[1:]]
    graph.values.pop(old_output, None)
