"""Whether a model is one farm accepts, apart from turning it into a Graph (farm.frontend.onnx_import): the checks
the import makes of the ONNX protobuf as it reads it (names, attribute types), and `validate`, which refuses a
Graph farm can't build (an op outside farm's set, a value whose shape isn't static, a dtype farm doesn't compute
with, a required input left out).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import onnx
from onnx import AttributeProto

from farm import defaults
from farm.errors import ModelLoadError, UnsupportedError
from farm.frontend.shapes import dynamic_input_hint
from farm.ir.graph import FUSED_OPS, Graph, Node
from farm.ops.registry import ALL_DTYPES

# ------------------------------------------------------------------------------------------ the ONNX file, on import


def check_names(graph: onnx.GraphProto, path: str) -> None:
    """Every name must be text (protobuf hands back bytes for invalid UTF-8), and graph inputs and outputs must be
    named and defined, so that later stages can compare, sort and print names."""
    for where, names in _graph_names(graph):
        for name in names:
            if not isinstance(name, str):
                raise ModelLoadError(f"{path}: {where} name {name!r} is not valid UTF-8")
    for role, infos in (("input", graph.input), ("output", graph.output)):
        if any(not vi.name for vi in infos):
            raise ModelLoadError(f"{path}: a graph {role} has an empty name")
    defined = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    defined |= {out for node in graph.node for out in node.output}
    for vi in graph.output:
        if vi.name not in defined:
            raise ModelLoadError(f"{path}: graph output {vi.name!r} is not defined by any input, initializer or node")


def _graph_names(graph: onnx.GraphProto) -> Iterable[tuple[str, Iterable[Any]]]:
    yield "graph", [graph.name]
    yield "value", [vi.name for vi in (*graph.input, *graph.output, *graph.value_info)]
    yield "initializer", [t.name for t in graph.initializer]
    for node in graph.node:
        yield "node", [node.name, node.op_type, node.domain, *node.input, *node.output]
        yield "attribute", [attr.name for attr in node.attribute]


def check_attr_types(proto: onnx.NodeProto, node: Node, opset: int) -> None:
    """Each attribute of an ai.onnx op must have the type its schema gives (an INTS where FLOATS are expected, a
    GRAPH or STRING where an INT is, would otherwise reach an op's normalisation as the wrong Python type)."""
    if node.domain:
        return
    try:
        schema = onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return  # an unknown op: validate names it
    for attr in proto.attribute:
        expected = schema.attributes.get(attr.name)
        if expected is not None and attr.type != expected.type:
            # expected.type is a pybind int enum, which onnx's stub (OpSchema.AttrType) doesn't say
            raise UnsupportedError(
                f"attribute {attr.name!r} is of type {_attr_type_name(attr.type)}, expected "
                f"{_attr_type_name(expected.type)}",  # type: ignore[arg-type]
                node=node.name,
                op=node.op_type,
                opset=opset,
            )


def _attr_type_name(attr_type: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(attr_type)
    except ValueError:
        return str(attr_type)


# ------------------------------------------------------------------------------------------------------ validate


def validate(graph: Graph, supported_ops: Collection[str]) -> None:
    """Refuse a graph farm can't build: an op outside `supported_ops`, a non-static shape, a dtype outside
    VALUE_DTYPES.

    Raises UnsupportedError naming the node (op, domain, opset) and the value at fault.
    """
    supported = frozenset(supported_ops)
    for node in graph.nodes:
        _check_op(graph, node, supported)
    first_user: dict[str, Node] = {}
    for node in graph.nodes:
        for name in node.inputs:
            first_user.setdefault(name, node)
    producers = graph.producers()
    for name in graph.inputs:
        _check_model_io(graph, name, "input", first_user.get(name))
    for node in graph.nodes:
        _check_node_values(graph, node)
    for name in graph.outputs:
        _check_model_io(graph, name, "output", producers.get(name))


def _unsupported(graph: Graph, node: Node | None, reason: str) -> UnsupportedError:
    if node is None:
        return UnsupportedError(reason, opset=graph.opset)
    return UnsupportedError(reason, node=node.name, op=node.op_type, domain=node.domain, opset=graph.opset)


def _check_op(graph: Graph, node: Node, supported: frozenset[str]) -> None:
    if node.domain:
        raise _unsupported(graph, node, f"ops of domain {node.domain!r} are not supported by farm")
    if node.op_type not in supported and node.op_type not in FUSED_OPS:
        raise _unsupported(graph, node, "op is not supported by farm")


# Element types a computed value may have (each op says which of them it takes: ops.registry.OpLowering.dtypes).
VALUE_DTYPES = tuple(sorted(ALL_DTYPES))


def _check_model_io(graph: Graph, name: str, role: str, node: Node | None) -> None:
    """A model input or output must have a static shape and a dtype farm computes with."""
    _check_static(graph, name, f"model {role}", node)
    _check_dtype(graph, name, f"model {role}", node)


def _check_node_values(graph: Graph, node: Node) -> None:
    for name in node.inputs:
        if name:
            _check_static(graph, name, "input", node)
            if name not in graph.constants:
                _check_dtype(graph, name, "input", node)
    _check_input_types(graph, node)
    for name in node.outputs:
        if name:
            _check_static(graph, name, "output", node)
            _check_dtype(graph, name, "output", node)


# ONNX's spelling of the numpy dtypes whose names differ from ONNX's, for a schema's type constraints.
_ONNX_ELEMENT_NAMES = {"float32": "float", "float64": "double", "object": "string"}


def _check_input_types(graph: Graph, node: Node) -> None:
    """Each input's dtype must be one the op's schema allows (an int64 input to Conv would reach codegen)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, graph.opset)
    except onnx.defs.SchemaError:
        return
    _check_required_inputs(graph, node, schema)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    for index, name in enumerate(node.inputs):
        if not name or not schema.inputs:
            continue
        formal = schema.inputs[min(index, len(schema.inputs) - 1)]
        dtype = graph.values[name].dtype
        types = allowed.get(formal.type_str, {formal.type_str})
        if f"tensor({_ONNX_ELEMENT_NAMES.get(dtype, dtype)})" not in types:
            raise _unsupported(
                graph,
                node,
                f"input {name!r} has dtype {dtype}, which {node.op_type} does not "
                f"take for {formal.name!r} ({', '.join(sorted(types))})",
            )


def _check_required_inputs(graph: Graph, node: Node, schema: onnx.defs.OpSchema) -> None:
    """Every input the op's schema requires must be named: an empty name ('') marks an optional input left out, and
    a required one left out reached the kernel (a BatchNormalization without its bias failed its compile)."""
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    for index, formal in enumerate(schema.inputs):
        if formal.option == single and (index >= len(node.inputs) or not node.inputs[index]):
            raise _unsupported(graph, node, f"required input {formal.name!r} (input {index}) is missing")


def _check_dtype(graph: Graph, name: str, role: str, node: Node | None) -> None:
    dtype = graph.values[name].dtype
    if dtype not in VALUE_DTYPES:
        raise _unsupported(
            graph, node, f"{role} {name!r} has dtype {dtype}; farm computes with {', '.join(VALUE_DTYPES)}"
        )


def _uninferred(graph: Graph, node: Node | None) -> str:
    """Why an output of `node` can be dynamic though every input of it is static: ONNX's shape inference gave it
    no shape, most often because the inputs' shapes don't fit the op (a MatMul of [1, 196] by [144, 5])."""
    if node is None or not all(not name or name in graph.values for name in node.inputs):
        return ""
    shapes = ", ".join(f"{name} {list(graph.values[name].shape)}" for name in node.inputs if name)
    return (
        f"; ONNX's shape inference gave it no shape from its node's static inputs ({shapes}): check that they "
        f"fit {node.op_type}"
    )


def _check_static(graph: Graph, name: str, role: str, node: Node | None) -> None:
    """The value must have a TensorInfo of static dims. A dim may be 0: an empty tensor is computed like any other
    (farm.frontend.passes makes it a constant where it can, farm.plan.planner skips the nodes that write only
    empty tensors and refuses an op whose kernel was not written for empty operands)."""
    info = graph.values.get(name)
    if info is None:
        partial = graph.dynamic_shapes.get(name)
        if partial is None:
            raise _unsupported(graph, node, f"{role} {name!r} has an unknown shape")
        shown = ", ".join(str(d) for d in partial)
        hint = f"; {dynamic_input_hint(name, partial)}" if role == "model input" else _uninferred(graph, node)
        raise _unsupported(graph, node, f"{role} {name!r} has dynamic shape [{shown}]{hint}")
    if any(d < 0 for d in info.shape):
        raise _unsupported(graph, node, f"{role} {name!r} has a negative dim in shape {list(info.shape)}")
    if info.nbytes > defaults.MAX_TENSOR_BYTES:
        raise _unsupported(
            graph,
            node,
            f"{role} {name!r} of shape {list(info.shape)} {info.dtype} needs "
            f"{info.nbytes} bytes, over farm's limit of {defaults.MAX_TENSOR_BYTES} "
            f"per tensor",
        )
