"""The constant folding graph pass: every node whose inputs are constants (and Shape/Size of static shapes)
evaluated into constants, alternating with shape re-inference, and the shapes the model declared checked again."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from farm import defaults
from farm.errors import UnsupportedError
from farm.frontend.onnx_import import infer_shapes_bounded
from farm.frontend.passes.quantize_folding import QUANTIZE_FOLDERS
from farm.frontend.passes.rewrite import prune_unreferenced
from farm.ir.graph import Graph, Node, TensorInfo

# Ops never folded even with constant inputs: folding would freeze one random draw into the artifact.
_NEVER_FOLD = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)

# Folding alternates with shape re-inference (a folded shape can make a Reshape's output static, which lets the
# Shape after it fold); real models settle in two or three rounds.
_MAX_FOLD_ROUNDS = 8

# Constants up to this many elements are given to shape inference as data (they may be shapes or axes).
_SHAPE_DATA_MAX_ELEMENTS = 4096


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every node whose inputs are all constants (and Shape/Size of static shapes) into constants.

    Nodes that write a model output are left in place so that each output stays computed by a node. Empty
    tensors fold too (`_empty_inputs_as_constants`, `_empty_outputs`).
    """
    _empty_inputs_as_constants(graph)
    budget = FoldBudget(defaults.max_folded_bytes())
    for _ in range(_MAX_FOLD_ROUNDS):
        _fold_sweep(graph, budget)
        if not _infer_missing_shapes(graph):
            break
    _recheck_declared_shapes(graph)
    return prune_unreferenced(graph)


def _recheck_declared_shapes(graph: Graph) -> None:
    """Infer again, now that folding made inputs constant, each node output whose shape import took from the
    model's declaration; a declaration inference now contradicts is refused (it would size the kernel's buffers).
    One that inference still can't confirm because it depends on the values of integer inputs given at run time
    (a Reshape to a shape that is a graph input) is kept only where the op can't read past its inputs with it
    (RUNTIME_SHAPE_CHECKS), and refused otherwise."""
    for node in graph.nodes:
        names = [name for name in node.outputs if name in graph.declared_shapes and name in graph.values]
        if not names or node.domain or not all(name in graph.values for name in node.inputs if name):
            continue
        inferred = _infer_node(graph, node)
        if any(name not in inferred for name in names):
            _check_consistent(graph, node)
        for name in names:
            if name in inferred and inferred[name].shape != graph.values[name].shape:
                raise UnsupportedError(
                    f"value {name!r} is declared with shape {list(graph.values[name].shape)} but computes to "
                    f"{list(inferred[name].shape)}",
                    node=node.name,
                    op=node.op_type,
                    opset=graph.opset,
                )
        if not all(name in inferred for name in names) and _reads_runtime_integers(graph, node):
            _check_runtime_shapes(graph, node)


def _reads_runtime_integers(graph: Graph, node: Node) -> bool:
    """Whether an integer input of `node` is known only at run time (a shape, axes, sizes or repeats)."""
    return any(
        name and name not in graph.constants and np.dtype(graph.values[name].dtype).kind in "iu" for name in node.inputs
    )


def _same_count(graph: Graph, node: Node) -> bool:
    return math.prod(graph.values[node.inputs[0]].shape) == math.prod(graph.values[node.outputs[0]].shape)


def _broadcasts_to_output(graph: Graph, node: Node) -> bool:
    source, shape = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape
    try:
        return np.broadcast_shapes(source, shape) == tuple(shape)
    except ValueError:
        return False


def _tiles_output(graph: Graph, node: Node) -> bool:
    source, shape = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape
    return len(source) == len(shape) and all(s > 0 and o % s == 0 for s, o in zip(source, shape))


def _splits_input(graph: Graph, node: Node) -> bool:
    source = graph.values[node.inputs[0]].shape
    axis = int(node.attrs.get("axis", 0)) % max(len(source), 1)
    parts = [graph.values[name].shape for name in node.outputs if name]
    others = [tuple(d for i, d in enumerate(part) if i != axis) for part in parts]
    rest = tuple(d for i, d in enumerate(source) if i != axis)
    return (
        all(len(part) == len(source) for part in parts)
        and all(o == rest for o in others)
        and sum(part[axis] for part in parts) == source[axis]
    )


def _indices_fill_output(graph: Graph, node: Node) -> bool:
    indices, shape = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape
    axis = int(node.attrs.get("axis", -1)) % max(len(shape), 1)
    return len(shape) == len(indices) + 1 and tuple(shape[:axis]) + tuple(shape[axis + 1 :]) == tuple(indices)


def _transforms_one_axis(graph: Graph, node: Node) -> bool:
    """DFT with its axis a run-time input: the output differs from the input in one axis before the last (the
    transform's) and in the last (1 or 2); its normalisation checks that some axis gives exactly that shape."""
    source, shape = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape
    changed = [i for i, (s, o) in enumerate(zip(source[:-1], shape[:-1])) if s != o]
    return len(shape) == len(source) and len(changed) <= 1 and shape[-1] in (1, 2)


RUNTIME_SHAPE_CHECKS: dict[str, Callable[[Graph, Node], bool] | None] = {
    "Reshape": _same_count,
    "Squeeze": _same_count,
    "Unsqueeze": _same_count,
    "Expand": _broadcasts_to_output,
    "Tile": _tiles_output,
    "Split": _splits_input,
    "OneHot": _indices_fill_output,
    "ConstantOfShape": None,
    "Range": None,
    "DFT": _transforms_one_axis,
}
"""The ops whose output shape may come from the model's declaration when it depends on run-time integer inputs,
each with the relation its kernel needs between that shape and its input's, so that it reads only inside its
input (None: the op reads no tensor the output shape indexes). The artifact is built for the declared shape; the
run-time values are not checked against it. Any other op with such an output is refused, unless the output's
values don't depend on those inputs (_ignores_runtime_values: an empty output, a reduction of an empty input)."""


REDUCTIONS = frozenset(
    {
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSum",
        "ReduceLogSumExp",
    }
)


def _ignores_runtime_values(graph: Graph, node: Node) -> bool:
    """Whether the node's outputs, at the shapes the model declares, are the same whatever the values of its
    run-time integer inputs, so that those shapes stand for an op that has no RUNTIME_SHAPE_CHECKS entry: when every
    output is empty (no value, and no kernel runs: farm.plan.planner), or when the node reduces an empty input into
    an output of the input's rank (keepdims) or less (each element of a non-empty output reduces every axis of
    extent 0, whatever the axes, so it is the op's value over nothing)."""
    if all(graph.values[name].size == 0 for name in node.outputs if name):
        return True
    if node.op_type not in REDUCTIONS or graph.values[node.inputs[0]].size:
        return False
    rank, out_rank = len(graph.values[node.inputs[0]].shape), len(graph.values[node.outputs[0]].shape)
    return out_rank == rank if node.attrs.get("keepdims", 1) else out_rank <= rank


def _check_runtime_shapes(graph: Graph, node: Node) -> None:
    declared = ", ".join(f"{name!r} {list(graph.values[name].shape)}" for name in node.outputs if name)
    if node.op_type not in RUNTIME_SHAPE_CHECKS:
        if _ignores_runtime_values(graph, node):
            return
        raise UnsupportedError(
            f"the shape of {declared} depends on the values of integer inputs known only at run "
            "time, and farm compiles static shapes",
            node=node.name,
            op=node.op_type,
            opset=graph.opset,
        )
    check = RUNTIME_SHAPE_CHECKS[node.op_type]
    if check is not None and not check(graph, node):
        raise UnsupportedError(
            f"the declared shape of {declared} doesn't fit input {node.inputs[0]!r} "
            f"{list(graph.values[node.inputs[0]].shape)} (it depends on run-time inputs, so only "
            "the declaration gives it)",
            node=node.name,
            op=node.op_type,
            opset=graph.opset,
        )


def _check_consistent(graph: Graph, node: Node) -> None:
    """Refuse a node whose static input shapes ONNX's strict shape inference finds inconsistent. Inference without
    strict mode gives such a node no output shape, and a shape the model declares then stood in: a Gemm whose A has
    2048 columns and whose B has 16 rows built, and its kernel read past B (SIGSEGV at run). Ops ONNX
    defines by a function body are skipped: strict inference fails inside some bodies of valid nodes
    (MeanVarianceNormalization's Constant), and their normalisations check what their kernels index by."""
    try:
        schema = onnx.defs.get_schema(node.op_type, graph.opset)
    except onnx.defs.SchemaError:
        return
    # onnx's stub of OpSchema lacks these two properties, which the C++ binding has
    if schema.has_function or schema.has_context_dependent_function:  # type: ignore[attr-defined]
        return
    try:
        onnx.shape_inference.infer_shapes(_node_model(graph, node), strict_mode=True)
    except Exception as exc:  # onnx raises InferenceError, or ValueError / RuntimeError from a converter
        reason = str(exc).replace("\n", " ").strip()
        raise UnsupportedError(
            f"its input shapes are inconsistent ({reason})",
            node=node.name,
            op=node.op_type,
            domain=node.domain,
            opset=graph.opset,
        ) from exc


class FoldBudget:
    """The bytes constant folding may make in one plan (defaults.max_folded_bytes, FARM_MAX_FOLDED_BYTES): each
    folded constant is bounded by MAX_FOLDED_CONSTANT_BYTES, but not their sum, and eight ConstantOfShape of 256 MiB
    each feeding Add took a worker past its memory on every delivery. Only new memory is counted: an
    output that is a view of an input (Unsqueeze, Reshape) costs nothing."""

    def __init__(self, limit: int) -> None:
        self.limit, self.spent = limit, 0

    def spend(self, graph: Graph, node: Node, arrays: list[np.ndarray]) -> None:
        """Count the memory `node`'s folded outputs hold that its inputs don't; UnsupportedError (exit 2) naming the
        node once the sum passes the budget."""
        held = {
            id(_memory_of(graph.constants[name]))
            for name in node.inputs
            if name in graph.constants and graph.constants.deferred(name) is None
        }
        new = {id(root): root.nbytes for root in map(_memory_of, arrays) if id(root) not in held}
        self.spent += sum(new.values())
        if self.spent > self.limit:
            raise UnsupportedError(
                f"folding it at build time takes the constants folded to {self.spent >> 20} MiB "
                f"({self.spent} bytes), over the budget FARM_MAX_FOLDED_BYTES={self.limit}",
                node=node.name,
                op=node.op_type,
                opset=graph.opset,
            )


def _memory_of(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory `array` shows (itself, unless it is a view)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _fold_sweep(graph: Graph, budget: FoldBudget) -> int:
    """Fold in topological order, so one sweep folds whole chains; returns how many nodes it folded."""
    outputs = set(graph.outputs)
    kept: list[Node] = []
    for node in graph.nodes:
        arrays = None if any(name in outputs for name in node.outputs) else _try_fold(graph, node)
        if arrays is None:
            kept.append(node)
            continue
        budget.spend(graph, node, arrays)
        for name, array in zip(node.outputs, arrays):
            if name:
                _check_folded_shape(graph, node, name, array)
                graph.constants[name] = array
                graph.values[name] = TensorInfo.of_array(array)
                graph.dynamic_shapes.pop(name, None)
    folded = len(graph.nodes) - len(kept)
    graph.nodes = kept
    return folded


def _check_folded_shape(graph: Graph, node: Node, name: str, array: np.ndarray) -> None:
    """A value whose shape the model declared (and inference could not check) must fold to that shape."""
    info = graph.values.get(name)
    if info is not None and info.shape != array.shape:
        raise UnsupportedError(
            f"value {name!r} is declared with shape {list(info.shape)} but computes to {list(array.shape)}",
            node=node.name,
            op=node.op_type,
            domain=node.domain,
            opset=graph.opset,
        )


def _empty_inputs_as_constants(graph: Graph) -> None:
    """A graph input of a static shape with a 0 dim can only ever be fed one value, the empty array of that shape
    and dtype: it becomes a constant too (so that an empty `axes` input reads as no axes, and nodes that read only
    constants fold), and stays a graph input that the runtime is fed."""
    for name in graph.inputs:
        info = graph.values.get(name)
        if info is not None and info.size == 0:
            graph.constants.setdefault(name, np.zeros(info.shape, info.dtype))


def _empty_outputs(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Empty arrays for a node whose outputs all have a static shape with a 0 dim, else None: such an output has
    one possible value whatever its inputs (even ones known only at run time), so the node folds without running.
    Not where a shape came from the model's declaration alone: _recheck_declared_shapes checks those first."""
    names = [name for name in node.outputs if name]
    if not names or any(
        name not in graph.values or graph.values[name].size or name in graph.declared_shapes for name in names
    ):
        return None
    return [
        np.zeros(graph.values[name].shape, graph.values[name].dtype) if name else np.empty(0) for name in node.outputs
    ]


def _try_fold(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """The node's output arrays when it can be evaluated now, else None."""
    if node.domain:
        return None
    empty = _empty_outputs(graph, node)
    if empty is not None or node.op_type in _NEVER_FOLD:
        return empty
    shape_folder = _SHAPE_FOLDERS.get(node.op_type)
    if shape_folder is not None:
        info = graph.values.get(node.inputs[0])
        return None if info is None else [shape_folder(node, info)]
    if not all(name in graph.constants for name in node.inputs if name):
        return None
    if any(_is_subgraph(value) for value in node.attrs.values()):
        return None  # a subgraph may read values from the outer graph that the one-node model would lack
    if _too_big_to_fold(graph, node):
        return None
    direct = _DIRECT_FOLDERS.get(node.op_type)
    arrays = direct(graph, node) if direct else None
    return _evaluate(graph, node) if arrays is None else arrays


def _too_big_to_fold(graph: Graph, node: Node) -> bool:
    """True when an output is known (declared, or inferred from the constant inputs) to exceed
    MAX_FOLDED_CONSTANT_BYTES: evaluating Range(0, 2**28) at build time would take gigabytes."""
    infos = [graph.values.get(name) for name in node.outputs if name]
    if any(info is None for info in infos):
        inferred = _infer_node(graph, node)
        infos = [graph.values.get(name) or inferred.get(name) for name in node.outputs if name]
    return any(info is not None and info.nbytes > defaults.MAX_FOLDED_CONSTANT_BYTES for info in infos)


def _fold_shape(node: Node, info: TensorInfo) -> np.ndarray:
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return np.array(info.shape, dtype=np.int64)[start:end].copy()


def _fold_size(node: Node, info: TensorInfo) -> np.ndarray:
    return np.array(info.size, dtype=np.int64)


# Ops that fold from their input's static shape alone, with no need for its data.
_SHAPE_FOLDERS: dict[str, Callable[[Node, TensorInfo], np.ndarray]] = {"Shape": _fold_shape, "Size": _fold_size}


def _fold_constant_of_shape(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """ConstantOfShape in numpy: its `value` (one element, float32 0 without it) filled to the shape."""
    shape = graph.constants[node.inputs[0]]
    value = node.attrs.get("value", np.zeros(1, np.float32))
    if shape.ndim != 1 or shape.dtype != np.int64 or (shape < 0).any() or np.size(value) != 1:
        return None  # the reference evaluator decides what these mean (or refuses them)
    return [
        _as_output(
            graph,
            node.outputs[0],
            np.full(tuple(int(d) for d in shape), np.ravel(value)[0], dtype=np.asarray(value).dtype),
        )
    ]


def _fold_unsqueeze(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Unsqueeze in numpy: ones inserted at `axes` (an input from opset 13, an attribute before), counted in the
    output's rank."""
    data = graph.constants[node.inputs[0]]
    axes = graph.constants.get(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] else node.attrs.get("axes")
    if axes is None:
        return None
    axes = [int(axis) for axis in np.ravel(axes)]
    rank = data.ndim + len(axes)
    normalised = sorted(axis + rank if axis < 0 else axis for axis in axes)
    if len(set(normalised)) != len(normalised) or any(not 0 <= axis < rank for axis in normalised):
        return None
    return [_as_output(graph, node.outputs[0], np.expand_dims(data, tuple(normalised)))]


# Ops whose folding numpy does directly: exporters write thousands of them (onnx's light models keep every weight
# as a ConstantOfShape and an Unsqueeze), and a reference evaluator per node took 0.2 ms each, 0.23 s of light
# DenseNet-121's plan; and the quantization ops, which the reference evaluator lacks below opset 19 and which fold
# with farm's own kernels' semantics (quantize_folding). Anything these decline goes to the reference evaluator.
_DIRECT_FOLDERS: dict[str, Callable[[Graph, Node], list[np.ndarray] | None]] = {
    "ConstantOfShape": _fold_constant_of_shape,
    "Unsqueeze": _fold_unsqueeze,
    **QUANTIZE_FOLDERS,
}


def _is_subgraph(value: Any) -> bool:
    if isinstance(value, list):
        return any(isinstance(item, onnx.GraphProto) for item in value)
    return isinstance(value, onnx.GraphProto)


def _evaluate(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Run one node with onnx's reference evaluator at the model's opset; None when it can't run there."""
    proto = onnx.helper.make_node(node.op_type, node.inputs, node.outputs, **_proto_attrs(node.attrs))
    feeds = {name: graph.constants[name] for name in node.inputs if name}
    one_node = onnx.helper.make_graph(
        [proto],
        "fold",
        [onnx.helper.make_empty_tensor_value_info(name) for name in feeds],
        [onnx.helper.make_empty_tensor_value_info(name) for name in node.outputs if name],
    )
    try:
        results = ReferenceEvaluator(one_node, opsets={"": graph.opset}).run(None, feeds)
    except MemoryError:
        raise  # past a worker's step memory limit: the step fails naming it (an artifact never depends on memory)
    except Exception:
        return None  # the node stays; a later stage reports it if farm can't run it either
    arrays = iter(results)
    return [_as_output(graph, name, next(arrays)) if name else np.empty(0) for name in node.outputs]


def _as_output(graph: Graph, name: str, result: Any) -> np.ndarray:
    """A contiguous array of the dtype shape inference declared (the reference ops occasionally widen types)."""
    array = np.asarray(result)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")  # not np.ascontiguousarray: that turns a scalar into shape (1,)
    info = graph.values.get(name)
    if info is not None and info.dtype != array.dtype.name:
        array = array.astype(info.dtype)
    return array


def _proto_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Python attribute values back into what onnx.helper.make_attribute accepts."""
    converted: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            converted[key] = numpy_helper.from_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], np.ndarray):
            converted[key] = [numpy_helper.from_array(item) for item in value]
        elif not (isinstance(value, list) and not value):  # an empty list has no type; the default applies
            converted[key] = value
    return converted


def _infer_missing_shapes(graph: Graph) -> int:
    """Shape-infer, node by node, outputs that import couldn't type; returns how many outputs became static."""
    found = 0
    for node in graph.nodes:
        missing = [name for name in node.outputs if name and name not in graph.values]
        present = [name for name in node.inputs if name]
        if not missing or node.domain or not all(name in graph.values for name in present):
            continue
        inferred = _infer_node(graph, node)
        for name in missing:
            if name in inferred:
                graph.values[name] = inferred[name]
                graph.dynamic_shapes.pop(name, None)
                found += 1
    return found


def _infer_node(graph: Graph, node: Node) -> dict[str, TensorInfo]:
    """Static output infos of one node from ONNX shape inference, small constant inputs given as data."""
    try:
        typed = infer_shapes_bounded(_node_model(graph, node))
    except Exception:
        return {}
    return {vi.name: info for vi in typed.graph.value_info if (info := _static_info(vi)) is not None}


def _node_model(graph: Graph, node: Node) -> onnx.ModelProto:
    """A model of `node` alone: its inputs typed with their static shapes, small constant inputs given as data."""
    inputs, initializers = [], []
    for name in dict.fromkeys(name for name in node.inputs if name):
        info = graph.values[name]
        if name in graph.constants and info.size <= _SHAPE_DATA_MAX_ELEMENTS and info.dtype != "object":
            initializers.append(numpy_helper.from_array(graph.constants[name], name))
        else:
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
            inputs.append(onnx.helper.make_tensor_value_info(name, elem, info.shape))
    proto = onnx.helper.make_node(node.op_type, node.inputs, node.outputs, **_proto_attrs(node.attrs))
    one_node = onnx.helper.make_graph([proto], "infer", inputs, [], initializers)
    return onnx.helper.make_model(one_node, opset_imports=[onnx.helper.make_opsetid("", graph.opset)])


def _static_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    tensor_type = vi.type.tensor_type
    if not tensor_type.HasField("shape") or not all(d.HasField("dim_value") for d in tensor_type.shape.dim):
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
    except (KeyError, TypeError, ValueError):
        return None
    return TensorInfo(tuple(int(d.dim_value) for d in tensor_type.shape.dim), dtype)
