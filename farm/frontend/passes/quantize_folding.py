"""Constant folding of QuantizeLinear and DequantizeLinear in numpy, computing what farm's own kernels compute
(farm.ops.quantize), at every opset farm accepts.

ONNX's reference evaluator, which folds other ops, implements these two only from opset 19 on, and rounds in its
own order there; a QDQ model of an older opset (onnxruntime's quantize_static writes opset 17) kept every weight's
DequantizeLinear as a kernel that ran on each inference, and the Conv after it read a weight it could neither pack
nor fold a BatchNormalization into. Folded here, the weight is a float32 constant like any other.

A node folds exactly where the kernel would be built: its attributes are the kernel's own normalisation of it
(`LOWERINGS[op].normalize`: dtypes, the scale's and zero point's layout, the division's dtype), and a node that
normalisation refuses stays, for the planner to refuse naming it. The arithmetic is the kernel's, step for step, in
numpy's IEEE float32 and float64 operations and its round-to-nearest-even float16 conversions, so the folded
constant has the kernel's bits, float16 cases included."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from farm.errors import UnsupportedError
from farm.ir.graph import Graph, Node
from farm.ops import LOWERINGS
from farm.ops.quantize import QUANT_RANGES
from farm.ops.registry import NodeContext, check_dtypes


def kernel_attrs(graph: Graph, node: Node) -> dict[str, Any] | None:
    """The normalised attributes farm's kernel for `node` would be built with, or None where it would refuse the
    node or an output's info is not known yet (a later folding round retries it)."""
    if any(name not in graph.values for name in node.outputs if name):
        return None
    lowering = LOWERINGS[node.op_type]
    ctx = NodeContext.of(node, graph)
    try:
        check_dtypes(ctx, lowering.dtypes)
        return lowering.normalize(ctx)
    except UnsupportedError:
        return None


def _parameter(graph: Graph, node: Node, index: int, attrs: dict[str, Any]) -> np.ndarray | None:
    """Node input `index` (a scale or zero point) broadcastable against x, as the kernel indexes it: its one value
    (per tensor), its values along `axis` (per axis), or each block's value repeated over the block; None if the
    node lacks it."""
    if index >= len(node.inputs) or not node.inputs[index]:
        return None
    param, x = graph.constants[node.inputs[index]], graph.constants[node.inputs[0]]
    axis, block = attrs["axis"], attrs["block_size"]
    if param.size == 1:
        return param.reshape(())
    if block:
        return np.repeat(param, block, axis=axis).take(range(x.shape[axis]), axis=axis)
    return param.reshape([-1 if i == axis else 1 for i in range(x.ndim)])


def _zero_point(graph: Graph, node: Node, attrs: dict[str, Any]) -> np.ndarray:
    """The zero point as int64 (0 where the node has none)."""
    zero = _parameter(graph, node, 2, attrs)
    return np.zeros((), np.int64) if zero is None else zero.astype(np.int64)


def _scale(graph: Graph, node: Node, attrs: dict[str, Any]) -> np.ndarray:
    scale = _parameter(graph, node, 1, attrs)
    assert scale is not None, "the kernel's normalisation refuses a node without its scale"
    return scale


# Overflow to infinity, division by zero and NaN are results here, as in the kernels, not faults to warn of.
_IEEE_RESULTS = np.errstate(over="ignore", divide="ignore", invalid="ignore")


@_IEEE_RESULTS
def fold_dequantize(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """(x - zero point) exact in int64, to float32, times the scale in float32, stored in the output's dtype (a
    float16 output rounds the float32 product once more, as the kernel's store does)."""
    attrs = kernel_attrs(graph, node)
    if attrs is None:
        return None
    difference = graph.constants[node.inputs[0]].astype(np.int64) - _zero_point(graph, node, attrs)
    product = difference.astype(np.float32) * _scale(graph, node, attrs).astype(np.float32)
    return [np.asarray(product.astype(graph.values[node.outputs[0]].dtype))]


def _to_half(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest float16 (ties to even, overflow to infinity), kept as float32: the
    kernel's round_to_half."""
    return values.astype(np.float16).astype(np.float32)


def _in_division_dtype(values: np.ndarray, division: str) -> np.ndarray:
    """An operand of x / scale as the kernel computes it: float64 for a float64 division, else float32, rounded to
    float16 for a float16 one."""
    if division == "float64":
        return values.astype(np.float64)
    wide = values.astype(np.float32)
    return _to_half(wide) if division == "float16" else wide


@_IEEE_RESULTS
def fold_quantize(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """saturate(round_half_even(x / scale) + zero point): the correctly rounded quotient in the division's dtype
    (a float16 one computed in float32 and rounded to float16), the zero point added in float32 (float64 for a
    float64 division), clamped to the output's range, NaN to its low end."""
    attrs = kernel_attrs(graph, node)
    if attrs is None:
        return None
    division = attrs["division"]
    x = _in_division_dtype(graph.constants[node.inputs[0]], division)
    scale = _in_division_dtype(_scale(graph, node, attrs), division)
    quotient = x / scale
    if division == "float16":
        quotient = _to_half(quotient)
    total = np.rint(quotient) + _zero_point(graph, node, attrs).astype(quotient.dtype)
    low, high = QUANT_RANGES[attrs["to"]]
    saturated = np.where(np.isnan(total), low, np.clip(total, low, high))
    return [np.asarray(saturated.astype(attrs["to"]))]


QUANTIZE_FOLDERS: dict[str, Callable[[Graph, Node], list[np.ndarray] | None]] = {
    "QuantizeLinear": fold_quantize,
    "DequantizeLinear": fold_dequantize,
}
"""The direct folders of farm.frontend.passes.constant_folding for the quantization ops."""
