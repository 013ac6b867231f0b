"""Graph passes that simplify an imported model before planning; `optimize` runs them in order.

Every pass rewrites the Graph in place and returns it. Passes never mutate a constant array: a weight may be
shared by several nodes, so a rewritten weight always gets a new name.
"""

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
from farm.ir.graph import Activation, Graph, Node, TensorInfo

# Ops whose output the fused activation may be applied to, in the op's own kernel.
FUSABLE_PRODUCERS = frozenset(
    {"Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "Sum", "BatchNormalization", "ConvTranspose"}
)

# Ops never folded even with constant inputs: folding would freeze one random draw into the artifact.
_NEVER_FOLD = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)

# Folding alternates with shape re-inference (a folded shape can make a Reshape's output static, which lets the
# Shape after it fold); real models settle in two or three rounds.
_MAX_FOLD_ROUNDS = 8

# Constants up to this many elements are given to shape inference as data (they may be shapes or axes).
_SHAPE_DATA_MAX_ELEMENTS = 4096


# ------------------------------------------------------------------------------------------------------ helpers


def _all_names(graph: Graph) -> set[str]:
    names = set(graph.inputs) | set(graph.outputs) | set(graph.values) | set(graph.constants)
    for node in graph.nodes:
        names.update(node.inputs)
        names.update(node.outputs)
    return names


def _unique_name(taken: set[str], base: str) -> str:
    """A value name not in `taken` (which is updated), so a rewritten weight never overwrites a shared one."""
    name, suffix = base, 1
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    taken.add(name)
    return name


def _move_value_info(graph: Graph, old: str, new: str) -> None:
    """Carry old's shape info over to new, the name that now holds the same data."""
    if old in graph.values:
        graph.values.setdefault(new, graph.values.pop(old))
    if old in graph.dynamic_shapes:
        graph.dynamic_shapes.setdefault(new, graph.dynamic_shapes.pop(old))


def _prune_unreferenced(graph: Graph) -> Graph:
    """Drop constants and value infos that no node, input or output refers to any more (frees folded weights)."""
    used = set(graph.inputs) | set(graph.outputs)
    for node in graph.nodes:
        used.update(node.inputs)
        used.update(node.outputs)
    for name in [name for name in graph.constants if name not in used]:
        del graph.constants[name]
    graph.values = {name: info for name, info in graph.values.items() if name in used}
    graph.dynamic_shapes = {name: dims for name, dims in graph.dynamic_shapes.items() if name in used}
    return graph


# ---------------------------------------------------------------------------------------- 1. Dropout and Identity


def _identity_source(graph: Graph, node: Node, users: dict[str, list[Node]], outputs: set[str]) -> str:
    return node.inputs[0]


def _dropout_source(graph: Graph, node: Node, users: dict[str, list[Node]], outputs: set[str]) -> str:
    """Inference Dropout passes input 0 through; its mask has no inference meaning, so a used mask is an error,
    and so is training mode (random drops) unless it is a constant false."""
    mask = node.outputs[1] if len(node.outputs) > 1 else ""
    if mask and (mask in users or mask in outputs):
        raise _inference_only(graph, node, f"Dropout mask output {mask!r} is used")
    training = node.inputs[2] if len(node.inputs) > 2 else ""
    if training and (training not in graph.constants or bool(np.any(graph.constants[training]))):
        raise _inference_only(graph, node, f"Dropout training_mode input {training!r} is not a constant false")
    return node.inputs[0]


def _inference_only(graph: Graph, node: Node, reason: str) -> UnsupportedError:
    return UnsupportedError(f"{reason}; farm only runs inference", node=node.name, op=node.op_type,
                            domain=node.domain, opset=graph.opset)


# Pass-through ops: each returns the value the node's output 0 equals at inference.
_PASSTHROUGH: dict[str, Callable[[Graph, Node, dict[str, list[Node]], set[str]], str]] = {
    "Identity": _identity_source,
    "Dropout": _dropout_source,
}


def drop_passthrough(graph: Graph) -> Graph:
    """Remove Identity and Dropout nodes, rewiring their consumers to the node's input.

    When the node's output is a model output, the upstream value is renamed to that output instead, so the
    model's interface keeps its names; if that is impossible (the upstream value is a model input, a constant or
    another output) the node stays as an Identity copy.
    """
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    pinned = set(graph.inputs) | set(graph.constants) | outputs
    kept: list[Node] = []
    for node in graph.nodes:
        source_of = _PASSTHROUGH.get(node.op_type) if not node.domain else None
        if source_of is None:
            kept.append(node)
            continue
        src, dst = source_of(graph, node, users, outputs), node.outputs[0]
        _remove_user(users, src, node)
        if dst not in outputs:
            _rewire(graph, users, dst, src)
        elif src not in pinned and src in producers:
            _rename_produced(graph, users, producers, src, dst)
        else:
            users.setdefault(src, []).append(node)
            kept.append(Node(node.name, "Identity", [src], [dst]))
    graph.nodes = kept
    return graph


def _remove_user(users: dict[str, list[Node]], name: str, node: Node) -> None:
    readers = [user for user in users.get(name, []) if user is not node]
    if readers:
        users[name] = readers
    else:
        users.pop(name, None)


def _rewire(graph: Graph, users: dict[str, list[Node]], old: str, new: str) -> None:
    """Make every reader of `old` read `new` instead."""
    readers = users.pop(old, [])
    for reader in readers:
        reader.inputs = [new if name == old else name for name in reader.inputs]
    users.setdefault(new, []).extend(readers)


def _rename_produced(
    graph: Graph, users: dict[str, list[Node]], producers: dict[str, Node], old: str, new: str
) -> None:
    """Rename the produced value `old` to `new` everywhere: its producer now writes `new` directly."""
    producer = producers.pop(old)
    producer.outputs = [new if name == old else name for name in producer.outputs]
    producers[new] = producer
    _rewire(graph, users, old, new)
    _move_value_info(graph, old, new)


# --------------------------------------------------------------------------------------------- 2. constant folding


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
    return _prune_unreferenced(graph)


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
                    f"{list(inferred[name].shape)}", node=node.name, op=node.op_type, opset=graph.opset)
        if not all(name in inferred for name in names) and _reads_runtime_integers(graph, node):
            _check_runtime_shapes(graph, node)


def _reads_runtime_integers(graph: Graph, node: Node) -> bool:
    """Whether an integer input of `node` is known only at run time (a shape, axes, sizes or repeats)."""
    return any(name and name not in graph.constants and np.dtype(graph.values[name].dtype).kind in "iu"
               for name in node.inputs)


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
    return all(len(part) == len(source) for part in parts) and all(o == rest for o in others) and \
        sum(part[axis] for part in parts) == source[axis]


def _indices_fill_output(graph: Graph, node: Node) -> bool:
    indices, shape = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape
    axis = int(node.attrs.get("axis", -1)) % max(len(shape), 1)
    return len(shape) == len(indices) + 1 and tuple(shape[:axis]) + tuple(shape[axis + 1:]) == tuple(indices)


def _transforms_one_axis(graph: Graph, node: Node) -> bool:
    """DFT with its axis a run-time input: the output differs from the input in one axis before the last (the
    transform's) and in the last (1 or 2); its normalisation checks that some axis gives exactly that shape."""
    source, shape = graph.values[node.inputs[0]].shape, graph.values[node.outputs[0]].shape
    changed = [i for i, (s, o) in enumerate(zip(source[:-1], shape[:-1])) if s != o]
    return len(shape) == len(source) and len(changed) <= 1 and shape[-1] in (1, 2)


RUNTIME_SHAPE_CHECKS: dict[str, Callable[[Graph, Node], bool] | None] = {
    "Reshape": _same_count, "Squeeze": _same_count, "Unsqueeze": _same_count,
    "Expand": _broadcasts_to_output, "Tile": _tiles_output, "Split": _splits_input, "OneHot": _indices_fill_output,
    "ConstantOfShape": None, "Range": None, "DFT": _transforms_one_axis,
}
"""The ops whose output shape may come from the model's declaration when it depends on run-time integer inputs,
each with the relation its kernel needs between that shape and its input's, so that it reads only inside its
input (None: the op reads no tensor the output shape indexes). The artifact is built for the declared shape; the
run-time values are not checked against it. Any other op with such an output is refused, unless the output's
values don't depend on those inputs (_ignores_runtime_values: an empty output, a reduction of an empty input)."""


REDUCTIONS = frozenset({"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"})


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
        raise UnsupportedError(f"the shape of {declared} depends on the values of integer inputs known only at run "
                               "time, and farm compiles static shapes", node=node.name, op=node.op_type,
                               opset=graph.opset)
    check = RUNTIME_SHAPE_CHECKS[node.op_type]
    if check is not None and not check(graph, node):
        raise UnsupportedError(f"the declared shape of {declared} doesn't fit input {node.inputs[0]!r} "
                               f"{list(graph.values[node.inputs[0]].shape)} (it depends on run-time inputs, so only "
                               "the declaration gives it)", node=node.name, op=node.op_type, opset=graph.opset)


def _check_consistent(graph: Graph, node: Node) -> None:
    """Refuse a node whose static input shapes ONNX's strict shape inference finds inconsistent. Inference without
    strict mode gives such a node no output shape, and a shape the model declares then stood in: a Gemm whose A has
    2048 columns and whose B has 16 rows built, and its kernel read past B (SIGSEGV at run, issue 13). Ops ONNX
    defines by a function body are skipped: strict inference fails inside some bodies of valid nodes
    (MeanVarianceNormalization's Constant), and their normalisations check what their kernels index by."""
    try:
        schema = onnx.defs.get_schema(node.op_type, graph.opset)
    except onnx.defs.SchemaError:
        return
    if schema.has_function or schema.has_context_dependent_function:
        return
    try:
        onnx.shape_inference.infer_shapes(_node_model(graph, node), strict_mode=True)
    except Exception as exc:  # onnx raises InferenceError, or ValueError / RuntimeError from a converter
        reason = str(exc).replace("\n", " ").strip()
        raise UnsupportedError(f"its input shapes are inconsistent ({reason})", node=node.name, op=node.op_type,
                               domain=node.domain, opset=graph.opset) from exc


class FoldBudget:
    """The bytes constant folding may make in one plan (defaults.max_folded_bytes, FARM_MAX_FOLDED_BYTES): each
    folded constant is bounded by MAX_FOLDED_CONSTANT_BYTES, but not their sum, and eight ConstantOfShape of 256 MiB
    each feeding Add took a worker past its memory on every delivery (issue 30). Only new memory is counted: an
    output that is a view of an input (Unsqueeze, Reshape) costs nothing."""

    def __init__(self, limit: int) -> None:
        self.limit, self.spent = limit, 0

    def spend(self, graph: Graph, node: Node, arrays: list[np.ndarray]) -> None:
        """Count the memory `node`'s folded outputs hold that its inputs don't; UnsupportedError (exit 2) naming the
        node once the sum passes the budget."""
        held = {id(_memory_of(graph.constants[name])) for name in node.inputs
                if name in graph.constants and graph.constants.deferred(name) is None}
        new = {id(root): root.nbytes for root in map(_memory_of, arrays) if id(root) not in held}
        self.spent += sum(new.values())
        if self.spent > self.limit:
            raise UnsupportedError(
                f"folding it at build time takes the constants folded to {self.spent >> 20} MiB "
                f"({self.spent} bytes), over the budget FARM_MAX_FOLDED_BYTES={self.limit}", node=node.name,
                op=node.op_type, opset=graph.opset)


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
        raise UnsupportedError(f"value {name!r} is declared with shape {list(info.shape)} but computes to "
                               f"{list(array.shape)}", node=node.name, op=node.op_type, domain=node.domain,
                               opset=graph.opset)


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
    if not names or any(name not in graph.values or graph.values[name].size or name in graph.declared_shapes
                        for name in names):
        return None
    return [np.zeros(graph.values[name].shape, graph.values[name].dtype) if name else np.empty(0)
            for name in node.outputs]


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
    return [_as_output(graph, node.outputs[0], np.full(tuple(int(d) for d in shape), np.ravel(value)[0],
                                                       dtype=np.asarray(value).dtype))]


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
# DenseNet-121's plan. Anything these decline goes to the reference evaluator.
_DIRECT_FOLDERS: dict[str, Callable[[Graph, Node], list[np.ndarray] | None]] = {
    "ConstantOfShape": _fold_constant_of_shape, "Unsqueeze": _fold_unsqueeze}


def _is_subgraph(value: Any) -> bool:
    if isinstance(value, list):
        return any(isinstance(item, onnx.GraphProto) for item in value)
    return isinstance(value, onnx.GraphProto)


def _evaluate(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """Run one node with onnx's reference evaluator at the model's opset; None when it can't run there."""
    proto = onnx.helper.make_node(node.op_type, node.inputs, node.outputs, **_proto_attrs(node.attrs))
    feeds = {name: graph.constants[name] for name in node.inputs if name}
    one_node = onnx.helper.make_graph(
        [proto], "fold", [onnx.helper.make_empty_tensor_value_info(name) for name in feeds],
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


# ------------------------------------------------------------------------------------- 3. BatchNormalization -> Conv


def fold_batchnorm(graph: Graph) -> Graph:
    """Fold an inference BatchNormalization with constant parameters into the Conv that alone feeds it.

    W' = W * scale / sqrt(var + eps) per output channel and b' = (b - mean) * scale / sqrt(var + eps) + beta; the
    folded weight and bias are new constants, since the originals may be shared with other nodes.
    """
    return _fold_into_convs(graph, _fold_bn)


def _fold_bn(graph: Graph, bn: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str],
             taken: set[str]) -> Node | None:
    conv = _conv_to_fold_into(graph, bn, users, producers, outputs)
    if conv is not None:
        _merge_bn_into_conv(graph, conv, bn, taken)
    return conv


FoldOne = Callable[[Graph, Node, dict[str, list[Node]], dict[str, Node], set[str], set[str]], Node | None]


def _fold_into_convs(graph: Graph, fold_one: FoldOne) -> Graph:
    """One sweep in graph order: fold_one(graph, node, users, producers, outputs, taken) folds `node` into the
    Conv that alone feeds it (the Conv then writes node's output) and returns that Conv, or returns None. The
    maps are kept current, so a chain folds in one sweep."""
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    taken = _all_names(graph)
    folded: set[int] = set()
    for node in graph.nodes:
        data = next((name for name in node.inputs if name in producers), None)
        conv = fold_one(graph, node, users, producers, outputs, taken)
        if conv is not None:
            users.pop(data, None)
            producers[node.outputs[0]] = conv
            folded.add(id(node))
    graph.nodes = [node for node in graph.nodes if id(node) not in folded]
    return _prune_unreferenced(graph) if folded else graph


def _constant_weight(graph: Graph, conv: Node) -> bool:
    """Whether the Conv's weight is a constant, and its bias (when given) too: what folding into it needs. A weight
    left empty ('') is not one: validation refuses that Conv, after the passes, naming the node."""
    if len(conv.inputs) < 2 or not conv.inputs[1]:
        return False
    return all(name in graph.constants for name in conv.inputs[1:3] if name)


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
    if not _constant_weight(graph, conv):
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
    w_name = _unique_name(taken, f"{conv.name}/bn_folded_weight")
    b_name = _unique_name(taken, f"{conv.name}/bn_folded_bias")
    for name, array in ((w_name, new_weight), (b_name, new_bias)):
        graph.constants[name] = array
        graph.values[name] = TensorInfo.of_array(array)
    old_output = conv.outputs[0]
    conv.inputs = [conv.inputs[0], w_name, b_name]
    conv.outputs = [bn.outputs[0], *conv.outputs[1:]]
    graph.values.pop(old_output, None)


def fold_channel_affine(graph: Graph) -> Graph:
    """Fold Mul and Add by per-output-channel constants that follow a Conv into its weight and bias.

    Exporters often write an inference BatchNormalization as Conv -> Mul(scale) -> Add(shift) (the light
    inception_v2 does, 58 times): folded, the scale and shift cost nothing instead of two passes over every
    activation (8% of that model's time), and a following Relu fuses into the Conv. Mul: W' = W * s[m],
    b' = b * s[m]; Add: b' = b + t[m]. Chains fold in one sweep (the Conv takes over each node's output).
    """
    return _fold_into_convs(graph, _fold_affine)


def _fold_affine(graph: Graph, node: Node, users: dict[str, list[Node]], producers: dict[str, Node],
                 outputs: set[str], taken: set[str]) -> Node | None:
    found = _conv_and_channel_constant(graph, node, users, producers, outputs)
    if found is None:
        return None
    conv, constant = found
    _merge_affine_into_conv(graph, conv, node, constant, taken)
    conv.outputs = [node.outputs[0], *conv.outputs[1:]]
    return conv


def _conv_and_channel_constant(
    graph: Graph, node: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[Node, np.ndarray] | None:
    """(the Conv, the per-channel constant as a vector) when `node` is a Mul or Add of a Conv's output alone by a
    constant of shape (M, 1, 1) or (1, M, 1, 1) or one value; None when folding would change the result."""
    if node.op_type not in ("Mul", "Add") or node.domain or len(node.inputs) != 2:
        return None
    for data, other in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
        conv = producers.get(data)
        if conv is None or other not in graph.constants or conv.op_type != "Conv" or conv.domain:
            continue
        if conv.activation is not None or data in outputs or users.get(data) != [node] or conv.outputs[0] != data:
            continue
        if not _constant_weight(graph, conv):
            continue
        weight, constant = graph.constants[conv.inputs[1]], graph.constants[other]
        channels = weight.shape[0]
        if weight.dtype.kind != "f" or constant.dtype != weight.dtype or graph.values[node.outputs[0]].shape != \
                graph.values[data].shape:
            continue
        shape = (1,) * (len(graph.values[data].shape) - constant.ndim) + constant.shape
        if constant.ndim <= len(shape) and shape[0] == 1 and shape[1] in (1, channels) and \
                all(dim == 1 for dim in shape[2:]):
            return conv, np.broadcast_to(constant.reshape(-1), (channels,))
    return None


def _merge_affine_into_conv(graph: Graph, conv: Node, node: Node, constant: np.ndarray, taken: set[str]) -> None:
    """Give conv a new weight and bias with node's per-channel Mul or Add applied; forget conv's old output."""
    weight = graph.constants[conv.inputs[1]]
    has_bias = len(conv.inputs) > 2 and conv.inputs[2]
    bias = graph.constants[conv.inputs[2]] if has_bias else np.zeros(weight.shape[0], weight.dtype)
    if node.op_type == "Mul":
        weight = weight * constant.reshape((-1,) + (1,) * (weight.ndim - 1))
        bias = bias * constant
    else:
        bias = bias + constant
    names = []
    for label, array in (("weight", weight), ("bias", bias)):
        names.append(_unique_name(taken, f"{conv.name}/{node.op_type.lower()}_folded_{label}"))
        graph.constants[names[-1]] = np.ascontiguousarray(array, dtype=weight.dtype)
        graph.values[names[-1]] = TensorInfo.of_array(graph.constants[names[-1]])
    graph.values.pop(conv.outputs[0], None)
    conv.inputs = [conv.inputs[0], *names]


# ------------------------------------------------------------------------------------- 4. residual-add fusion


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


def _absorbs_residual(graph: Graph, conv: Node, value: str, residual: str, users: dict[str, list[Node]],
                      outputs: set[str]) -> bool:
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
    return Node(conv.name, conv.op_type, [*inputs, residual], list(add.outputs), dict(conv.attrs), conv.domain,
                residual=True)


# ------------------------------------------------------------------------------------------ 5. activation fusion


def _relu(graph: Graph, node: Node) -> Activation | None:
    return Activation("relu")


def _leaky_relu(graph: Graph, node: Node) -> Activation | None:
    return Activation("leakyrelu", (float(node.attrs.get("alpha", 0.01)),))


def _clip(graph: Graph, node: Node) -> Activation | None:
    """Clip's bounds: attributes before opset 11, constant inputs from 11 (absent: unbounded); None if not constant."""
    if graph.opset < 11:
        return Activation("clip", (float(node.attrs.get("min", -math.inf)), float(node.attrs.get("max", math.inf))))
    bounds = []
    for index, default in ((1, -math.inf), (2, math.inf)):
        name = node.inputs[index] if index < len(node.inputs) else ""
        if not name:
            bounds.append(default)
        elif name in graph.constants and graph.constants[name].size == 1:
            bounds.append(float(graph.constants[name].reshape(-1)[0]))
        else:
            return None
    return Activation("clip", tuple(bounds))


# Activation ops that can be fused, each giving the Activation to set on the producer (None: not fusable).
_ACTIVATIONS: dict[str, Callable[[Graph, Node], Activation | None]] = {
    "Relu": _relu,
    "LeakyRelu": _leaky_relu,
    "Clip": _clip,
}


def fuse_activations(graph: Graph) -> Graph:
    """Fuse Relu, LeakyRelu and Clip into the node producing their input, so no separate pass over memory runs.

    Only when that input has this single consumer, is not a model output, and its producer is one of
    FUSABLE_PRODUCERS without an activation yet; the producer then writes the activation's output.
    """
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    fused: set[int] = set()
    for node in graph.nodes:
        read = _ACTIVATIONS.get(node.op_type) if not node.domain else None
        producer = _fusable_producer(node, users, producers, outputs) if read else None
        activation = read(graph, node) if read and producer else None
        if producer is None or activation is None:
            continue
        x, y = node.inputs[0], node.outputs[0]
        producer.activation = activation
        producer.outputs = [y, *producer.outputs[1:]]
        producers[y] = producers.pop(x)
        users.pop(x, None)
        graph.values.pop(x, None)
        fused.add(id(node))
    graph.nodes = [node for node in graph.nodes if id(node) not in fused]
    return graph


def _fusable_producer(
    node: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> Node | None:
    x = node.inputs[0] if node.inputs else ""
    producer = producers.get(x)
    if producer is None or producer.domain or producer.op_type not in FUSABLE_PRODUCERS:
        return None
    if producer.activation is not None or producer.outputs[0] != x:
        return None
    if x in outputs or users.get(x) != [node]:
        return None
    return producer


# ---------------------------------------------------------------------------------------------- 6. dead nodes


def remove_dead_nodes(graph: Graph) -> Graph:
    """Remove nodes none of whose outputs reach a model output, then the constants and infos only they used."""
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(name in live for name in node.outputs if name):
            kept.append(node)
            live.update(name for name in node.inputs if name)
    graph.nodes = kept[::-1]
    return _prune_unreferenced(graph)


# ---------------------------------------------------------------------------------------------------- pipeline

PIPELINE: tuple[Callable[[Graph], Graph], ...] = (
    drop_passthrough,
    fold_constants,
    fold_batchnorm,
    fold_channel_affine,
    fuse_residual_adds,
    fuse_activations,
    remove_dead_nodes,
)


def optimize(graph: Graph) -> Graph:
    """Run PIPELINE in order on `graph` (rewritten in place) and return it."""
    for graph_pass in PIPELINE:
        graph = graph_pass(graph)
    return graph
