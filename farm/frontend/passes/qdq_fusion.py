"""The graph pass that runs a quantized (QDQ) Conv or MatMul on its integers.

onnxruntime's quantize_static writes DequantizeLinear(x_q) -> Conv(., DequantizeLinear(w_q), [DequantizeLinear(b_q)])
-> [Relu] -> QuantizeLinear: read as written, the Conv computes in float32 on dequantized copies of integers. The
same product is ConvInteger(x_q, w_q, x_zero, w_zero), whose int32 sum of (x_q - x_zero) * (w_q - w_zero) is exact,
times x_scale * w_scale (per tensor or per output channel) plus the bias dequantized at build time; only the float
rounding of the original differs, which the QuantizeLinear at the end turns into at most one quantization step.
MatMul(DequantizeLinear(a_q), DequantizeLinear(b_q)) becomes MatMulInteger the same way.

Where nothing but an optional Relu stands between the product and a per-tensor QuantizeLinear, and the bias (if
any) is int32 quantized with exactly x_scale * w_scale, the whole chain is one QLinearConv (QLinearMatMul): its
integer kernel requantizes as it stores, so no int32 or float32 tensor is written; the Relu is its fused
activation (quantizing is monotonic, so a Relu before it is a clamp at y_zero_point). Its requantization (float64,
exact) differs from the QDQ graph's float32 path only by that path's roundings, as above.

The pass runs before constant folding, while the weights' DequantizeLinear are still nodes, and fuses only where
that is exact up to that rounding: 8-bit operands, every scale and zero point a constant, the data's per tensor, the
weight's per tensor or along the output channel (Conv) or column (MatMul), and the product's float result read only
by a chain of Relu and Add of a constant ending in a QuantizeLinear, none of them a graph output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from farm.frontend.passes.dead_nodes import remove_dead_nodes
from farm.frontend.passes.quantize_folding import fold_dequantize, kernel_attrs
from farm.frontend.passes.rewrite import all_names, unique_name
from farm.ir.graph import Activation, Graph, Node, TensorInfo

INTEGER_PRODUCT_OPSET = 10
"""ConvInteger and MatMulInteger exist from this opset on."""
BYTE_INTS = frozenset({"int8", "uint8"})
"""The operand dtypes of ConvInteger and MatMulInteger."""


@dataclass(frozen=True)
class Dequantized:
    """A DequantizeLinear that a fused product reads through: its integer input, zero point ('' when absent), scale
    (one value or one per element along `axis`; `scale_name` the constant holding it) and the axis of a per-axis
    scale or zero point (None: per tensor)."""

    values: str
    zero: str
    scale: np.ndarray
    axis: int | None
    scale_name: str = ""


@dataclass(frozen=True)
class Fusion:
    """What replaces a float product: the integer op (and its requantizing form) with its operands and attributes,
    the shape its per-channel constants take to broadcast over its output, its channels, its float bias (None:
    none) and that bias as int32 quantized with the scales' product (`bias_q`, None when it isn't so quantized)."""

    op: str
    requantizing_op: str
    data: Dequantized
    weight: Dequantized
    attrs: dict[str, Any]
    channel_shape: tuple[int, ...]
    channels: int
    bias: np.ndarray | None = None
    bias_q: str | None = None
    weight_transposed: bool = False
    """The weight is stored [N, K] (a Gemm's transB): the rewrite gives the integer op a transposed copy."""


def fuse_qdq(graph: Graph) -> Graph:
    """Replace each Conv or MatMul of dequantized 8-bit operands (see the module's docstring for when) by its
    requantizing op writing the QuantizeLinear's output (with the Relu before it, if any), or by its integer op ->
    Cast to float32 -> Mul by the scales' product -> [Add of the bias] writing the product's output; DequantizeLinear
    nodes nothing reads any more go."""
    if graph.opset < INTEGER_PRODUCT_OPSET:
        return graph
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    taken = all_names(graph) | {node.name for node in graph.nodes}
    rewritten: list[Node] = []
    replaced: set[int] = set()
    fused = 0
    for node in graph.nodes:
        match = _FUSIONS.get(node.op_type) if not node.domain else None
        fusion = match(graph, node, producers) if match else None
        if fusion is None or not _quantized_after(graph, node.outputs[0], users, producers, outputs):
            rewritten.append(node)
            continue
        if fusion.weight_transposed:
            fusion = _transposed_weight(graph, fusion, taken)
        requantized = _requantized_chain(graph, node, fusion, users)
        if requantized is not None:
            replaced.update(id(step) for step in requantized.steps)
            rewritten.append(_requantizing_node(graph, node, fusion, requantized, taken))
        else:
            rewritten.extend(_integer_nodes(graph, node, fusion, taken))
        fused += 1
    graph.nodes = [node for node in rewritten if id(node) not in replaced]
    return remove_dead_nodes(graph) if fused else graph


# ------------------------------------------------------------------------------------------------ the operands


def dequantized(graph: Graph, name: str, producers: dict[str, Node]) -> Dequantized | None:
    """The DequantizeLinear writing `name`, when it turns 8-bit integers into float32 with a constant float32
    scale and zero point, per tensor or per axis (not blocked), as its kernel would be built; else None."""
    node = producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.domain or len(node.inputs) < 2:
        return None
    values, scale_name = node.inputs[:2]
    zero = node.inputs[2] if len(node.inputs) > 2 else ""
    if not scale_name or any(parameter not in graph.constants for parameter in (scale_name, zero) if parameter):
        return None
    values_info, output_info = graph.values.get(values), graph.values.get(name)
    if values_info is None or values_info.dtype not in BYTE_INTS or output_info is None:
        return None
    scale = graph.constants[scale_name]
    attrs = kernel_attrs(graph, node)
    if attrs is None or attrs["block_size"] or scale.dtype != np.float32 or output_info.dtype != "float32":
        return None
    return Dequantized(values, zero, scale.reshape(-1), attrs["axis"], scale_name)


def _float_constant(graph: Graph, name: str, producers: dict[str, Node]) -> np.ndarray | None:
    """The float32 value of `name` known at build time: a float32 constant, or a DequantizeLinear of constants
    folded as farm's kernel computes it; else None."""
    if name in graph.constants:
        array = graph.constants[name]
        return array if array.dtype == np.float32 else None
    node = producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.domain:
        return None
    if not all(name in graph.constants for name in node.inputs if name):
        return None
    folded = fold_dequantize(graph, node)
    return folded[0] if folded is not None and folded[0].dtype == np.float32 else None


def _operands(
    graph: Graph, node: Node, producers: dict[str, Node], weight_axis: int
) -> tuple[Dequantized, Dequantized] | None:
    """The product's data (per tensor) and constant weight (per tensor or along `weight_axis`), both dequantized
    8-bit integers; else None."""
    if len(node.inputs) < 2 or len(node.outputs) != 1 or node.outputs[0] not in graph.values:
        return None
    data, weight = (dequantized(graph, name, producers) for name in node.inputs[:2])
    if data is None or weight is None or data.axis is not None:
        return None
    if weight.values not in graph.constants or weight.axis not in (None, weight_axis):
        return None
    return data, weight


# --------------------------------------------------------------------------------------- the fusable products


def _conv_fusion(graph: Graph, conv: Node, producers: dict[str, Node]) -> Fusion | None:
    """A 2-D Conv of a dequantized input and a dequantized constant weight (per output channel: axis 0), its bias
    (if any) a float constant or a DequantizeLinear of constants: ConvInteger takes Conv's attributes."""
    operands = _operands(graph, conv, producers, weight_axis=0)
    if operands is None:
        return None
    data, weight = operands
    shape = graph.constants.info(weight.values).shape
    if len(shape) != 4 or len(graph.values[data.values].shape) != 4:
        return None
    channels = shape[0]
    bias_name, bias = _bias(graph, conv, producers)
    if bias_name and (bias is None or bias.size != channels):
        return None
    bias_q = _quantized_bias(graph, bias_name, producers, data, weight) if bias_name else None
    attrs = dict(conv.attrs)
    return Fusion("ConvInteger", "QLinearConv", data, weight, attrs, (1, channels, 1, 1), channels, bias, bias_q)


def _matmul_fusion(graph: Graph, matmul: Node, producers: dict[str, Node]) -> Fusion | None:
    """A MatMul of a dequantized input and a dequantized constant 2-D B (per column: axis 1)."""
    operands = _operands(graph, matmul, producers, weight_axis=1)
    if operands is None:
        return None
    data, weight = operands
    shape = graph.constants.info(weight.values).shape
    if len(shape) != 2 or not graph.values[data.values].shape:
        return None
    return Fusion("MatMulInteger", "QLinearMatMul", data, weight, {}, (shape[1],), shape[1])


def _bias(graph: Graph, node: Node, producers: dict[str, Node]) -> tuple[str, np.ndarray | None]:
    """A Conv's or Gemm's bias (input 2): its name ('' when absent) and its float32 value known at build time (None
    when it has none such)."""
    name = node.inputs[2] if len(node.inputs) > 2 else ""
    return name, _float_constant(graph, name, producers) if name else None


def _quantized_bias(
    graph: Graph, name: str, producers: dict[str, Node], data: Dequantized, weight: Dequantized
) -> str | None:
    """The int32 constant of a bias DequantizeLinear(b_q, x_scale * w_scale, 0), as onnxruntime's quantizers write
    it (the scale exactly the float32 product, per channel, the zero point absent or 0); else None."""
    node = producers.get(name)
    if node is None or node.op_type != "DequantizeLinear" or node.domain or len(node.inputs) < 2:
        return None
    values, scale = node.inputs[0], node.inputs[1]
    zero = node.inputs[2] if len(node.inputs) > 2 else ""
    if values not in graph.constants or scale not in graph.constants or (zero and zero not in graph.constants):
        return None
    if graph.constants[values].dtype != np.int32 or (zero and np.any(graph.constants[zero] != 0)):
        return None
    channels = graph.constants[values].size
    expected = np.broadcast_to((data.scale * weight.scale).astype(np.float32), (channels,))
    given = np.broadcast_to(graph.constants[scale].reshape(-1), (channels,))
    return values if np.array_equal(given, expected) else None


def _gemm_fusion(graph: Graph, gemm: Node, producers: dict[str, Node]) -> Fusion | None:
    """A Gemm that is a MatMul plus a bias: alpha and beta 1, A not transposed, a dequantized 2-D input and constant
    weight (B, or B transposed with transB: per output column either way), C absent or one float value per column.
    QLinearMatMul has no bias, so a Gemm with one runs as MatMulInteger -> Cast -> Mul -> Add of the bias."""
    attrs = gemm.attrs
    if float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0 or int(attrs.get("transA", 0)):
        return None
    transposed = bool(int(attrs.get("transB", 0)))
    operands = _operands(graph, gemm, producers, weight_axis=0 if transposed else 1)
    if operands is None:
        return None
    data, weight = operands
    shape = graph.constants.info(weight.values).shape
    if len(shape) != 2 or len(graph.values[data.values].shape) != 2:
        return None
    columns = shape[0] if transposed else shape[1]
    bias_name, bias = _bias(graph, gemm, producers)
    if bias_name and (bias is None or bias.shape not in ((columns,), (1, columns))):
        return None
    if transposed:
        weight = dataclasses.replace(weight, axis=None if weight.axis is None else 1)
    return Fusion("MatMulInteger", "QLinearMatMul", data, weight, {}, (columns,), columns, bias, None, transposed)


_FUSIONS: dict[str, Callable[[Graph, Node, dict[str, Node]], Fusion | None]] = {
    "Conv": _conv_fusion,
    "MatMul": _matmul_fusion,
    "Gemm": _gemm_fusion,
}
"""The float products this pass runs on integers, each giving its Fusion (None: it stays as it is)."""


# ----------------------------------------------------------------------------------------------- what follows


def _relu_of(graph: Graph, node: Node, name: str, producers: dict[str, Node]) -> bool:
    return node.inputs[:1] == [name]


def _add_of_a_constant(graph: Graph, node: Node, name: str, producers: dict[str, Node]) -> bool:
    """An Add of `name` and a float32 value known at build time."""
    others = [other for other in node.inputs if other != name]
    return len(node.inputs) == 2 and len(others) == 1 and _float_constant(graph, others[0], producers) is not None


_CARRIERS: dict[str, Callable[[Graph, Node, str, dict[str, Node]], bool]] = {
    "Relu": _relu_of,
    "Add": _add_of_a_constant,
}
"""The ops that may stand between a fused product and its QuantizeLinear, each saying whether a node of it applies
itself to the product's value `name` as the fusion needs (its other input, if any, known at build time)."""


def _quantized_after(
    graph: Graph, name: str, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> bool:
    """Whether float value `name` goes only through _CARRIERS, each the only reader of the value before it and
    none a graph output, into a QuantizeLinear (as its x)."""
    while name not in outputs:
        readers = users.get(name, [])
        if len(readers) != 1 or readers[0].domain:
            return False
        reader = readers[0]
        if reader.op_type == "QuantizeLinear":
            return reader.inputs[0] == name
        carries = _CARRIERS.get(reader.op_type)
        if carries is None or not carries(graph, reader, name, producers):
            return False
        name = reader.outputs[0]
    return False


# ------------------------------------------------------------------------------------------------ the rewrite


def _new_constant(graph: Graph, taken: set[str], base: str, array: np.ndarray) -> str:
    name = unique_name(taken, base)
    graph.constants[name] = array
    graph.values[name] = TensorInfo.of_array(array)
    return name


def _new_value(graph: Graph, taken: set[str], base: str, shape: tuple[int, ...], dtype: str) -> str:
    name = unique_name(taken, base)
    graph.values[name] = TensorInfo(shape, dtype)
    return name


def _transposed_weight(graph: Graph, fusion: Fusion, taken: set[str]) -> Fusion:
    """The fusion with its [N, K] weight's integers copied transposed, [K, N], under a new name."""
    values = graph.constants[fusion.weight.values]
    name = _new_constant(graph, taken, f"{fusion.weight.values}/transposed", np.ascontiguousarray(values.T))
    return dataclasses.replace(fusion, weight=dataclasses.replace(fusion.weight, values=name), weight_transposed=False)


def _integer_inputs(fusion: Fusion) -> list[str]:
    """The integer op's inputs: both operands, then their zero points (absent ones '', trailing ones dropped)."""
    inputs = [fusion.data.values, fusion.weight.values, fusion.data.zero, fusion.weight.zero]
    while not inputs[-1]:
        inputs.pop()
    return inputs


def _integer_nodes(graph: Graph, node: Node, fusion: Fusion, taken: set[str]) -> list[Node]:
    """The nodes that compute `node`'s output from the integers: the integer op, Cast to float32, Mul by
    data scale * weight scale per channel, and Add of the bias when there is one; new constants get new names."""
    output = node.outputs[0]
    shape = graph.values[output].shape
    product = np.broadcast_to(fusion.data.scale * fusion.weight.scale, (fusion.channels,))
    scale = _new_constant(graph, taken, f"{node.name}/integer_scale", product.reshape(fusion.channel_shape).copy())
    sums = _new_value(graph, taken, f"{output}/int32", shape, "int32")
    as_float = _new_value(graph, taken, f"{output}/float", shape, "float32")
    scaled = output if fusion.bias is None else _new_value(graph, taken, f"{output}/scaled", shape, "float32")
    nodes = [
        Node(unique_name(taken, f"{node.name}/integer"), fusion.op, _integer_inputs(fusion), [sums], fusion.attrs),
        Node(unique_name(taken, f"{node.name}/to_float"), "Cast", [sums], [as_float], {"to": TensorProto.FLOAT}),
        Node(unique_name(taken, f"{node.name}/scale"), "Mul", [as_float, scale], [scaled]),
    ]
    if fusion.bias is not None:
        bias = _new_constant(graph, taken, f"{node.name}/integer_bias", fusion.bias.reshape(fusion.channel_shape))
        nodes.append(Node(unique_name(taken, f"{node.name}/bias"), "Add", [scaled, bias], [output]))
    return nodes


# ------------------------------------------------------------------------------ the requantizing form


@dataclass(frozen=True)
class RequantizedChain:
    """A product's float result going through at most a Relu into a per-tensor QuantizeLinear of an 8-bit type
    (constant scale and zero point): the nodes it replaces, the QuantizeLinear's inputs and output, and the Relu."""

    steps: tuple[Node, ...]
    y_scale: str
    y_zero: str
    output: str
    relu: bool


def _requantized_chain(
    graph: Graph, node: Node, fusion: Fusion, users: dict[str, list[Node]]
) -> RequantizedChain | None:
    """The chain after `node` that its requantizing op can take whole, or None (then the integer op, Cast, Mul and
    Add compute the float result, and the chain stays)."""
    if fusion.bias is not None and fusion.bias_q is None:
        return None
    steps: list[Node] = []
    reader = users[node.outputs[0]][0]
    if reader.op_type == "Relu":
        steps.append(reader)
        reader = users[reader.outputs[0]][0]
    if reader.op_type != "QuantizeLinear" or len(reader.inputs) < 3 or not reader.inputs[2]:
        return None
    y_scale, y_zero = reader.inputs[1], reader.inputs[2]
    if y_scale not in graph.constants or y_zero not in graph.constants:
        return None
    scale, zero = graph.constants[y_scale], graph.constants[y_zero]
    if scale.size != 1 or zero.size != 1 or scale.dtype != np.float32 or zero.dtype.name not in BYTE_INTS:
        return None
    if reader.attrs.get("block_size") or graph.values[reader.outputs[0]].dtype != zero.dtype.name:
        return None
    steps.append(reader)
    return RequantizedChain(tuple(steps), y_scale, y_zero, reader.outputs[0], relu=len(steps) == 2)


def _requantizing_node(graph: Graph, node: Node, fusion: Fusion, chain: RequantizedChain, taken: set[str]) -> Node:
    """QLinearConv (QLinearMatMul) writing the chain's QuantizeLinear output from the integers; an absent data or
    weight zero point becomes a constant 0 of its operand's dtype (the op requires them)."""
    data_zero = fusion.data.zero or _zero_of(graph, taken, fusion.data.values)
    weight_zero = fusion.weight.zero or _zero_of(graph, taken, fusion.weight.values)
    inputs = [
        fusion.data.values,
        fusion.data.scale_name,
        data_zero,
        fusion.weight.values,
        fusion.weight.scale_name,
        weight_zero,
        chain.y_scale,
        chain.y_zero,
    ] + ([fusion.bias_q] if fusion.bias_q else [])
    return Node(
        unique_name(taken, f"{node.name}/requantized"),
        fusion.requantizing_op,
        inputs,
        [chain.output],
        fusion.attrs,
        activation=Activation("relu") if chain.relu else None,
    )


def _zero_of(graph: Graph, taken: set[str], values: str) -> str:
    dtype = graph.values[values].dtype if values in graph.values else graph.constants[values].dtype.name
    return _new_constant(graph, taken, f"{values}/zero_point", np.zeros((), dtype))
