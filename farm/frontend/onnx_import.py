"""ONNX frontend: turn a .onnx file into farm's Graph IR (whether farm accepts it: farm.frontend.validate).

This is the only module that reads ONNX protobufs (with the checks it calls in farm.frontend.validate). Models are
untrusted input: external weight files are read only from inside the model's own folder, and every refusal names
the file, initializer, node or value at fault.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from farm import defaults
from farm.errors import ModelLoadError, UnsupportedError
from farm.frontend import wire
from farm.frontend.external import DEFERRED_MIN_BYTES, ExternalData, ExternalDataError, ModelFolder
from farm.frontend.shapes import apply_shapes
from farm.frontend.validate import check_attr_types, check_names
from farm.ir.graph import FUSED_OPS, Constants, DeferredArray, Graph, Node, TensorInfo
from farm.ir.shapes import PinnedShapes

MIN_OPSET = 9
MAX_OPSET = 28  # the newest opset of onnx 1.23, whose conformance cases check every supported op
DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})

# Initializers up to this many elements stay in the model given to shape inference (they may hold shapes that
# inference needs); bigger ones are replaced by typed inputs so that inference never serialises large weights.
_SHAPE_DATA_MAX_ELEMENTS = 4096


# --------------------------------------------------------------------------------------------------- import_model


def import_model(
    path: str | os.PathLike[str], shapes: PinnedShapes | None = None, external: ExternalData | None = None
) -> Graph:
    """Load the ONNX model at `path` into a Graph with static value infos, constants and named nodes; `shapes`
    (farm.frontend.shapes, from `--shape`) fix the sizes of dynamic input dimensions before shape inference.

    Raises ModelLoadError when the file can't be read, is not an ONNX model or refers to external data outside its
    folder, BadInputError for a pinned shape that doesn't fit the model, and UnsupportedError when its ai.onnx opset is
    outside 9..28 (older ones only where its ops have not changed since 9). Dynamic shapes and unknown ops are left
    for `validate`, which can name the node that uses them. `external`: where external data is read from (default:
    files inside the model's folder; a worker planning a submitted model reads blobs from the farm's store).
    """
    path = os.fspath(path)
    model, mapped = _load_proto(path)
    if shapes:
        apply_shapes(model.graph, shapes, path)
    opset = _default_opset(model, path)
    if external is None:
        external = ModelFolder(os.path.realpath(os.path.dirname(os.path.abspath(path))))
    _check_declared_sizes(model.graph)
    constants = _read_initializers(model.graph, external, mapped, path)
    known = _known_digests(model.graph, external, constants)
    nodes, node_constants = _convert_nodes(model.graph.node, external, opset)
    constants.update(node_constants)
    inferred, declared = _infer_shapes(model, constants, path)
    values, dynamic = _collect_value_infos(inferred.graph)
    values.update({name: constants.info(name) for name in constants})
    for name in values:
        dynamic.pop(name, None)
    inputs = [vi.name for vi in model.graph.input if vi.name not in constants]
    graph = Graph(
        name=model.graph.name or os.path.splitext(os.path.basename(path))[0],
        opset=opset,
        inputs=inputs,
        outputs=[vi.name for vi in model.graph.output],
        values=values,
        constants=constants,
        nodes=_topological_order(nodes, set(inputs) | set(constants), path),
        dynamic_shapes=dynamic,
        declared_shapes=declared & set(values),
        known_digests=known,
    )
    _correct_ceil_mode_pools(graph)
    return graph


def _ceil_pool_extent(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int) -> int:
    """Output size of a ceil_mode pool, dropping a last window that would start in the end padding."""
    span = (kernel - 1) * dilation + 1
    out = -(-(size + begin + end - span) // stride) + 1
    return out - 1 if (out - 1) * stride >= size + begin else out


def _correct_ceil_mode_pools(graph: Graph) -> None:
    """ONNX shape inference keeps a ceil_mode window that starts in the padding; onnxruntime and the ONNX reference
    drop it. Use the smaller shape and forget every shape downstream, so that folding's re-inference recomputes them.
    """
    for node in graph.nodes:
        if node.op_type not in ("MaxPool", "AveragePool") or not node.attrs.get("ceil_mode"):
            continue
        x, y = graph.values.get(node.inputs[0]), graph.values.get(node.outputs[0])
        if x is None or y is None or len(x.shape) < 3 or node.attrs.get("auto_pad", "NOTSET") != "NOTSET":
            continue
        rank = len(x.shape) - 2
        kernel, pads = node.attrs["kernel_shape"], node.attrs.get("pads", [0] * 2 * rank)
        strides, dilations = node.attrs.get("strides", [1] * rank), node.attrs.get("dilations", [1] * rank)
        if any(len(v) != rank for v in (kernel, strides, dilations)) or len(pads) != 2 * rank:
            continue  # the op's normalisation refuses it
        spatial = tuple(
            _ceil_pool_extent(x.shape[2 + i], kernel[i], strides[i], dilations[i], pads[i], pads[rank + i])
            for i in range(rank)
        )
        if spatial != y.shape[2:]:
            graph.values[node.outputs[0]] = TensorInfo(y.shape[:2] + spatial, y.dtype)
            _forget_shapes_after(graph, node)


def _forget_shapes_after(graph: Graph, changed: Node) -> None:
    stale = set(changed.outputs)
    for node in graph.nodes:
        if node is not changed and stale.intersection(node.inputs):
            stale.update(node.outputs)
            for name in node.outputs:
                graph.values.pop(name, None)


def _check_declared_sizes(graph: onnx.GraphProto) -> None:
    """Refuse a graph input or initializer whose claimed shape exceeds MAX_TENSOR_BYTES before anything (shape
    inference's data propagation, decoding) allocates for it: a 200-byte file may claim 2**40 elements."""
    for vi in graph.input:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")]
        _check_size(vi.name, "input", dims, _dtype_name(vi.type.tensor_type.elem_type) or "float32")
    for tensor in graph.initializer:
        _check_size(tensor.name, "initializer", list(tensor.dims), _dtype_name(tensor.data_type) or "float32")


def _check_size(name: str, role: str, dims: list[int], dtype: str) -> None:
    if any(d < 0 for d in dims):
        raise UnsupportedError(f"{role} {name!r} has a negative dim in shape {dims}")
    nbytes = math.prod(dims) * np.dtype(dtype).itemsize
    if nbytes > defaults.MAX_TENSOR_BYTES:
        raise UnsupportedError(
            f"{role} {name!r} of shape {dims} {dtype} needs {nbytes} bytes, over farm's limit of "
            f"{defaults.MAX_TENSOR_BYTES} per tensor"
        )


def _load_proto(path: str) -> tuple[onnx.ModelProto, dict[int, memoryview]]:
    """Parse the file without touching external data (those paths are checked by _read_external before any read),
    and without copying its big initializers: (the model, initializer index -> a read-only view of its raw bytes in a
    map of the file) (farm.frontend.wire)."""
    model, mapped = _load_mapped(path)
    if model is None:
        try:
            model = onnx.load(path, load_external_data=False)
        except MemoryError:
            raise  # a worker's step memory limit (FARM_STEP_MEMORY_BYTES): the step names it
        except Exception as exc:  # protobuf raises several unrelated types for a truncated or garbage file
            raise ModelLoadError(f"can't read ONNX model {path}: {exc}") from exc
    if not model.HasField("graph") or not model.opset_import:
        raise ModelLoadError(f"{path} is not an ONNX model (no graph or no opset import); is the file truncated?")
    check_names(model.graph, path)
    return model, mapped


def _load_mapped(path: str) -> tuple[onnx.ModelProto | None, dict[int, memoryview]]:
    """The model parsed from a map of the file with its big initializers' bytes cut out (wire.cut_raw_initializers),
    and a view of each one's bytes; (None, {}) when the file can't be mapped or walked, for onnx.load to read it
    (and name what is wrong). The views keep the map open; a file truncated while they live would fault, as with
    onnxruntime's mapped external data, so a model must not be rewritten while it is being built."""
    try:
        with open(path, "rb") as f:
            data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError):  # an empty file, a pipe, a folder
        return None, {}
    try:
        stripped, spans = wire.cut_raw_initializers(data)
        model = onnx.ModelProto()
        model.ParseFromString(stripped)
    except Exception:  # wire.WireError or protobuf's DecodeError: onnx.load gives the reason
        return None, {}
    return model, {index: data[span.offset : span.offset + span.length] for index, span in spans.items()}


def _default_opset(model: onnx.ModelProto, path: str) -> int:
    """The ai.onnx opset version, which decides every default-domain op's semantics."""
    versions = [entry.version for entry in model.opset_import if entry.domain in DEFAULT_DOMAINS]
    if not versions:
        raise ModelLoadError(f"{path} imports no ai.onnx opset")
    opset = int(versions[0])
    if opset > MAX_OPSET or (opset < MIN_OPSET and not _ops_unchanged_since(model, opset)):
        raise UnsupportedError(
            f"ai.onnx opset {opset} is not supported (farm supports opsets {MIN_OPSET} to {MAX_OPSET}, and older "
            f"ones for models whose ops have not changed since)",
            opset=opset,
        )
    return opset


def _ops_unchanged_since(model: onnx.ModelProto, opset: int) -> bool:
    """True when every ai.onnx op of the main graph means at `opset` what it means at MIN_OPSET (the same schema
    version), so an old model that uses only such ops (And at opset 7, Not at opset 1) builds as it is."""
    return all(
        _schema_version(node.op_type, opset) == _schema_version(node.op_type, MIN_OPSET)
        for node in model.graph.node
        if node.domain in DEFAULT_DOMAINS
    )


def _schema_version(op: str, opset: int) -> int | None:
    try:
        return onnx.defs.get_schema(op, opset).since_version
    except onnx.defs.SchemaError:
        return None


# ---------------------------------------------------------------------------------------------- tensors and data


def _read_initializers(
    graph: onnx.GraphProto, external: ExternalData, mapped: dict[int, memoryview], path: str
) -> Constants:
    """Every initializer as a numpy array: views of the model file's map where `mapped` has its bytes, external ones
    read through `external` (which refuses locations outside the model's folder), except the big ones `external`
    lets wait (a farm job's weights named by digest): those are deferred, read only if something asks for their
    values (Constants), so that a plan whose passes never look at a weight moves none of its bytes."""
    if graph.sparse_initializer:
        name = graph.sparse_initializer[0].values.name
        raise UnsupportedError(f"sparse initializer {name!r} is not supported")
    arrays, deferred = {}, {}
    for index, tensor in enumerate(graph.initializer):
        later = None if index in mapped else _deferred(tensor, external)
        if later is not None:
            deferred[tensor.name] = later
        else:
            arrays[tensor.name] = (
                _array_from_bytes(tensor, mapped[index], path)
                if index in mapped
                else _tensor_to_array(tensor, external)
            )
    return Constants(arrays, deferred)


def _deferred(tensor: TensorProto, external: ExternalData) -> DeferredArray | None:
    """The initializer as a DeferredArray when its bytes are external, DEFERRED_MIN_BYTES or more of a plain numeric
    type, and `external` lets their read wait; else None."""
    if tensor.data_location != TensorProto.EXTERNAL:
        return None
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    shape = tuple(int(d) for d in tensor.dims)
    if dtype.kind not in "fiub" or min(shape, default=1) < 0 or math.prod(shape) * dtype.itemsize < DEFERRED_MIN_BYTES:
        return None
    try:
        digest = external.deferrable(tensor.name, {entry.key: entry.value for entry in tensor.external_data})
    except ExternalDataError as error:
        raise ModelLoadError(str(error)) from None
    return (
        None
        if digest is None
        else DeferredArray(shape, dtype, digest, functools.partial(_read_external, tensor, external))
    )


def _known_digests(
    graph: onnx.GraphProto, external: ExternalData, constants: Constants
) -> dict[str, tuple[np.ndarray, str]]:
    """The sha256 of each initializer whose bytes came by digest (a submitted model's blobs), with the very array
    they became: planning hashes only constants it doesn't know, and only while they are that unchanged array
    (a plain numeric view of the blob's bytes)."""
    known = {}
    for tensor in graph.initializer:
        digest = (
            external.digest({e.key: e.value for e in tensor.external_data})
            if (tensor.data_location == TensorProto.EXTERNAL)
            else None
        )
        array = constants.get(tensor.name) if constants.deferred(tensor.name) is None else None
        if digest and array is not None and array.dtype.kind in "fiub" and array.dtype.byteorder in "=|<":
            known[tensor.name] = (array, digest)
    return known


def _tensor_to_array(tensor: TensorProto, external: ExternalData | None) -> np.ndarray:
    """Convert a TensorProto, reading its bytes through `external` when they are stored externally (None: a tensor
    whose bytes are its own)."""
    if tensor.data_location == TensorProto.EXTERNAL:
        assert external is not None, f"tensor {tensor.name!r} is external, so a reader of its data is given"
        return _read_external(tensor, external)
    try:
        return numpy_helper.to_array(tensor)
    except MemoryError:
        raise  # a worker's step memory limit (FARM_STEP_MEMORY_BYTES): the step names it
    except Exception as exc:
        raise ModelLoadError(f"tensor {tensor.name!r} can't be decoded: {exc}") from exc


def _read_external(tensor: TensorProto, external: ExternalData) -> np.ndarray:
    """Read an external tensor's bytes (ModelFolder refuses any location that is absolute or leaves the model's
    folder)."""
    try:
        data, where = external.read(tensor.name, {entry.key: entry.value for entry in tensor.external_data})
    except ExternalDataError as error:
        raise ModelLoadError(str(error)) from None
    return _array_from_bytes(tensor, data, where)


def _array_from_bytes(tensor: TensorProto, data: bytes | memoryview, file_path: str) -> np.ndarray:
    """Little-endian raw bytes (read from an external data file, or mapped from the model's own) as an array: a
    zero-copy view for plain numeric types, onnx's decoder otherwise."""
    dims = tuple(int(d) for d in tensor.dims)
    count = int(np.prod(dims, dtype=np.int64))
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"initializer {tensor.name!r} has unknown data type {tensor.data_type}") from exc
    if dtype.kind in "fiub":
        if len(data) != count * dtype.itemsize:
            raise ModelLoadError(
                f"initializer {tensor.name!r}: data in {file_path} has {len(data)} bytes, "
                f"expected {count * dtype.itemsize} for {dtype.name}{list(dims)}"
            )
        return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=False).reshape(dims)
    raw = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=dims, raw_data=bytes(data))
    return _tensor_to_array(raw, None)


# ----------------------------------------------------------------------------------------------- nodes and attrs


def _read_tensor_attr(attr: AttributeProto, external: ExternalData) -> np.ndarray:
    return _tensor_to_array(attr.t, external)


def _read_sparse_attr(attr: AttributeProto, external: ExternalData) -> Any:
    raise UnsupportedError(f"sparse tensor attribute {attr.name!r} is not supported")


# Attribute readers by ONNX attribute type. Subgraphs stay protobufs: farm runs no op that has them, so validate
# rejects such nodes by op, and keeping the proto lets that error name the node instead of crashing here.
_ATTR_READERS: dict[int, Callable[[AttributeProto, ExternalData], Any]] = {
    AttributeProto.FLOAT: lambda a, _: float(a.f),
    AttributeProto.INT: lambda a, _: int(a.i),
    AttributeProto.STRING: lambda a, _: a.s.decode("utf-8", errors="replace"),
    AttributeProto.TENSOR: _read_tensor_attr,
    AttributeProto.SPARSE_TENSOR: _read_sparse_attr,
    AttributeProto.GRAPH: lambda a, _: a.g,
    AttributeProto.TYPE_PROTO: lambda a, _: a.tp,
    AttributeProto.FLOATS: lambda a, _: [float(v) for v in a.floats],
    AttributeProto.INTS: lambda a, _: [int(v) for v in a.ints],
    AttributeProto.STRINGS: lambda a, _: [s.decode("utf-8", errors="replace") for s in a.strings],
    AttributeProto.TENSORS: lambda a, d: [_tensor_to_array(t, d) for t in a.tensors],
    AttributeProto.GRAPHS: lambda a, _: list(a.graphs),
    AttributeProto.TYPE_PROTOS: lambda a, _: list(a.type_protos),
}

# How each of Constant's mutually exclusive attributes becomes an array (after _ATTR_READERS ran).
_CONSTANT_VALUES: dict[str, Callable[[Any], np.ndarray]] = {
    "value": np.asarray,
    "value_float": lambda v: np.array(v, dtype=np.float32),
    "value_floats": lambda v: np.array(v, dtype=np.float32),
    "value_int": lambda v: np.array(v, dtype=np.int64),
    "value_ints": lambda v: np.array(v, dtype=np.int64),
    "value_string": lambda v: np.array(v, dtype=object),
    "value_strings": lambda v: np.array(v, dtype=object),
}


def _convert_nodes(
    protos: Iterable[onnx.NodeProto], external: ExternalData, opset: int
) -> tuple[list[Node], dict[str, np.ndarray]]:
    """Nodes as farm Nodes with Python attributes; Constant nodes become constants instead of nodes."""
    nodes: list[Node] = []
    constants: dict[str, np.ndarray] = {}
    protos = list(protos)
    used_names = _unique_node_names(protos)
    for index, proto in enumerate(protos):
        node = _convert_node(proto, index, external, used_names)
        check_attr_types(proto, node, opset)
        if node.op_type == "Constant" and node.domain == "":
            constants[node.outputs[0]] = _constant_value(node)
        else:
            nodes.append(node)
    return nodes, constants


def _unique_node_names(protos: list[onnx.NodeProto]) -> set[str]:
    """The names the model gives its nodes, refused when two nodes share one (onnxruntime refuses such a model too):
    names key per-node buffers such as a Conv's scratch, which two nodes of one name shared at the first one's size,
    so that the second wrote past it."""
    names: set[str] = set()
    for proto in protos:
        if proto.name in names:
            raise ModelLoadError(f"two nodes are named {proto.name!r}; node names must be unique")
        if proto.name:
            names.add(proto.name)
    return names


def _convert_node(proto: onnx.NodeProto, index: int, external: ExternalData, used_names: set[str]) -> Node:
    """One node; an unnamed node gets the stable name `<op_type>_<index>` (one no node of the model has) so that
    errors can point at it."""
    domain = "" if proto.domain in DEFAULT_DOMAINS else proto.domain
    name = proto.name or _fresh_name(f"{proto.op_type}_{index}", used_names)
    used_names.add(name)
    if not domain and proto.op_type in FUSED_OPS:
        raise UnsupportedError(
            "op is not one of ONNX's: farm's graph passes make it, and a model may not", node=name, op=proto.op_type
        )
    try:
        attrs = {attr.name: _ATTR_READERS[attr.type](attr, external) for attr in proto.attribute}
    except KeyError as exc:
        raise UnsupportedError(f"attribute of unknown type {exc}", node=name, op=proto.op_type, domain=domain) from exc
    return Node(name, proto.op_type, list(proto.input), list(proto.output), attrs, domain)


def _fresh_name(base: str, used: set[str]) -> str:
    name, suffix = base, 1
    while name in used:
        name, suffix = f"{base}_{suffix}", suffix + 1
    return name


def _constant_value(node: Node) -> np.ndarray:
    """The array a Constant node holds, whichever of its attributes carries it."""
    for key, convert in _CONSTANT_VALUES.items():
        if key in node.attrs:
            return convert(node.attrs[key])
    raise UnsupportedError(
        f"Constant with attributes {sorted(node.attrs)} is not supported", node=node.name, op="Constant"
    )


def _topological_order(nodes: list[Node], defined: set[str], path: str) -> list[Node]:
    """Nodes in an order where every input is defined first; the usual already-sorted case costs one scan.

    Otherwise nodes are taken in rounds: a round holds, in model order, every node whose inputs the earlier rounds
    define. Each node waits on a count of its undefined inputs, so the sort is linear in the node count (scanning
    every pending node each round made a reversed 20,000-node chain take over a minute).
    """
    known = set(defined) | {""}
    if all(_defines_in_order(node, known) for node in nodes):
        return nodes
    known = set(defined) | {""}
    waiting_on: dict[str, list[int]] = {}
    missing = [0] * len(nodes)
    for index, node in enumerate(nodes):
        for name in set(node.inputs) - known:
            waiting_on.setdefault(name, []).append(index)
            missing[index] += 1
    ordered: list[Node] = []
    ready = [index for index, count in enumerate(missing) if count == 0]
    while ready:
        ordered.extend(nodes[index] for index in ready)
        ready = sorted(_newly_ready([nodes[index] for index in ready], known, waiting_on, missing))
    if len(ordered) < len(nodes):
        node = next(node for node, count in zip(nodes, missing) if count)
        undefined = next(name for name in node.inputs if name not in known)
        raise ModelLoadError(
            f"{path}: node {node.name!r} reads {undefined!r}, which no input, initializer or node defines "
            f"(or the graph has a cycle)"
        )
    return ordered


def _newly_ready(
    placed: list[Node], known: set[str], waiting_on: dict[str, list[int]], missing: list[int]
) -> list[int]:
    """Record the outputs of a round's nodes as known; the indices of the nodes that no longer miss an input."""
    ready = []
    for name in {out for node in placed for out in node.outputs} - known:
        known.add(name)
        for index in waiting_on.pop(name, ()):
            missing[index] -= 1
            if missing[index] == 0:
                ready.append(index)
    return ready


def _defines_in_order(node: Node, known: set[str]) -> bool:
    """True when all of node's inputs are already known; records its outputs as known."""
    ok = all(name in known for name in node.inputs)
    known.update(node.outputs)
    return ok


# --------------------------------------------------------------------------------------------- shape inference


def _infer_shapes(model: onnx.ModelProto, constants: Constants, path: str) -> tuple[onnx.ModelProto, set[str]]:
    """Run ONNX shape inference on a copy of the model without its big weights, which inference doesn't need.

    The shapes a model declares for its outputs and intermediate values are untrusted: inference runs without
    them, each must agree with the inferred shape (a larger declared output would make kernels write past their
    buffers), and only a value inference can't shape keeps its declared shape: those are returned too, for
    passes.fold_constants to check again.
    """
    skeleton = _shape_skeleton(model, constants)
    inferred = _run_inference(skeleton, path)
    return inferred, _check_declared_shapes(model, inferred)


def _run_inference(skeleton: onnx.ModelProto, path: str) -> onnx.ModelProto:
    try:
        return infer_shapes_bounded(skeleton)
    except MemoryError:
        raise  # a worker's step memory limit (FARM_STEP_MEMORY_BYTES): the step names it
    except Exception as exc:
        raise ModelLoadError(f"ONNX shape inference failed on {path}: {exc}") from exc


def infer_shapes_bounded(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference, with data propagation only where it stays small.

    Data propagation computes integer values (shapes) in memory, so Range(0, 2**28) would take gigabytes: plain
    inference runs first, and propagation only when no integer value it found has more than
    _SHAPE_DATA_MAX_ELEMENTS elements (a shape never has). Raises what onnx raises when plain inference fails.
    """
    plain = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    if any(_is_big_integer_value(vi) for vi in (*plain.graph.value_info, *plain.graph.output)):
        return plain
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except MemoryError:
        raise  # a worker's step memory limit (FARM_STEP_MEMORY_BYTES): the step names it
    except Exception:
        return plain  # data propagation is an extra


def _is_big_integer_value(vi: onnx.ValueInfoProto) -> bool:
    tensor_type = vi.type.tensor_type
    if tensor_type.elem_type not in (TensorProto.INT64, TensorProto.INT32) or not tensor_type.HasField("shape"):
        return False
    dims = [d.dim_value if d.HasField("dim_value") else _SHAPE_DATA_MAX_ELEMENTS + 1 for d in tensor_type.shape.dim]
    return math.prod(dims) > _SHAPE_DATA_MAX_ELEMENTS


def _without_shape(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto:
    """A copy of a declared value info with its element type but no shape, for inference to fill in."""
    bare = onnx.ValueInfoProto()
    bare.CopyFrom(vi)
    if bare.type.HasField("tensor_type"):
        bare.type.tensor_type.ClearField("shape")
    return bare


def _check_declared_shapes(model: onnx.ModelProto, inferred: onnx.ModelProto) -> set[str]:
    """Refuse a declared output or value-info shape that contradicts inference; adopt it where inference has none
    (and its static dims where inference has symbolic ones).

    Returns the names whose shape (or some dim) was taken from the declaration; raises UnsupportedError naming the
    value, its producing node and both shapes.
    """
    found = {
        vi.name: vi
        for vi in (*inferred.graph.output, *inferred.graph.value_info)
        if vi.type.tensor_type.HasField("shape")
    }
    producers = {out: node for node in model.graph.node for out in node.output}
    outputs = {vi.name for vi in inferred.graph.output}
    trusted: set[str] = set()
    for declared in (*model.graph.output, *model.graph.value_info):
        if not declared.type.tensor_type.HasField("shape"):
            continue
        ours = found.get(declared.name)
        if ours is None:
            trusted.add(declared.name)
            if declared.name not in outputs:
                inferred.graph.value_info.append(declared)
            else:
                _replace_output(inferred.graph, declared)
            continue
        claimed = tuple(_dim_of(d) for d in declared.type.tensor_type.shape.dim)
        computed = tuple(_dim_of(d) for d in ours.type.tensor_type.shape.dim)
        if not _shapes_agree(claimed, computed):
            reason = f"value {declared.name!r} is declared with shape {list(claimed)} but computes to {list(computed)}"
            raise _node_error(reason, producers.get(declared.name), model)
        if any(not isinstance(d, int) for d in computed):
            trusted.add(declared.name)
            _fill_unknown_dims(ours, declared)
    return trusted


def _fill_unknown_dims(ours: onnx.ValueInfoProto, declared: onnx.ValueInfoProto) -> None:
    """Take the declared size of each dim inference left symbolic (a data-dependent shape the model states);
    folding checks it again once the value is computed."""
    for dim, stated in zip(ours.type.tensor_type.shape.dim, declared.type.tensor_type.shape.dim):
        if not dim.HasField("dim_value") and stated.HasField("dim_value"):
            dim.dim_value = stated.dim_value


def _node_error(reason: str, node: onnx.NodeProto | None, model: onnx.ModelProto) -> UnsupportedError:
    """An UnsupportedError naming `node` as the rest of farm names it (unnamed nodes as `<op_type>_<index>`)."""
    if node is None:
        return UnsupportedError(reason)
    name = node.name or f"{node.op_type}_{list(model.graph.node).index(node)}"
    domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
    opset = next((int(e.version) for e in model.opset_import if e.domain in DEFAULT_DOMAINS), 0)
    return UnsupportedError(reason, node=name, op=node.op_type, domain=domain, opset=opset)


def _replace_output(graph: onnx.GraphProto, declared: onnx.ValueInfoProto) -> None:
    for vi in graph.output:
        if vi.name == declared.name:
            vi.CopyFrom(declared)


def _shapes_agree(claimed: tuple[int | str, ...], computed: tuple[int | str, ...]) -> bool:
    """Same rank, and every dim that both know statically is equal."""
    return len(claimed) == len(computed) and all(
        a == b for a, b in zip(claimed, computed) if isinstance(a, int) and isinstance(b, int)
    )


def _shape_skeleton(model: onnx.ModelProto, constants: Constants) -> onnx.ModelProto:
    """The model with small initializers only; big ones become typed graph inputs (declared once)."""
    graph = model.graph
    skeleton_graph = onnx.GraphProto(name=graph.name)
    skeleton_graph.node.extend(graph.node)
    skeleton_graph.input.extend(graph.input)
    skeleton_graph.output.extend(_without_shape(vi) for vi in graph.output)
    declared = {vi.name for vi in graph.input}
    for tensor in graph.initializer:
        info = constants.info(tensor.name)
        if info.size <= _SHAPE_DATA_MAX_ELEMENTS and info.dtype != "object":
            skeleton_graph.initializer.append(numpy_helper.from_array(constants[tensor.name], tensor.name))
        elif tensor.name not in declared:
            skeleton_graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, info.shape))
    skeleton = onnx.ModelProto(ir_version=model.ir_version, graph=skeleton_graph)
    skeleton.functions.extend(model.functions)
    _normalise_domains(skeleton, model)
    return skeleton


def _normalise_domains(skeleton: onnx.ModelProto, model: onnx.ModelProto) -> None:
    """Spell ai.onnx as "" and import every domain a node uses, so inference skips unknown ops instead of failing."""
    opsets = {("" if e.domain in DEFAULT_DOMAINS else e.domain): e.version for e in model.opset_import}
    for node in skeleton.graph.node:
        if node.domain in DEFAULT_DOMAINS:
            node.domain = ""
        opsets.setdefault(node.domain, 1)
    skeleton.opset_import.extend(onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items())


def _all_static(dims: tuple[int | str, ...]) -> TypeGuard[tuple[int, ...]]:
    """Whether every dim is a number (none symbolic or unknown)."""
    return all(isinstance(d, int) for d in dims)


def _collect_value_infos(graph: onnx.GraphProto) -> tuple[dict[str, TensorInfo], dict[str, tuple[int | str, ...]]]:
    """Static infos of every typed value, and the partial shapes of those with symbolic or unknown dims."""
    values: dict[str, TensorInfo] = {}
    dynamic: dict[str, tuple[int | str, ...]] = {}
    for vi in (*graph.input, *graph.output, *graph.value_info):
        tensor_type = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not tensor_type.HasField("shape"):
            continue
        dims = tuple(_dim_of(d) for d in tensor_type.shape.dim)
        dtype = _dtype_name(tensor_type.elem_type)
        if dtype and _all_static(dims):
            values[vi.name] = TensorInfo(dims, dtype)
        else:
            dynamic[vi.name] = dims
    return values, dynamic


def _dim_of(dim: onnx.TensorShapeProto.Dimension) -> int | str:
    if dim.HasField("dim_value"):
        return int(dim.dim_value)
    return dim.dim_param or "?"


def _dtype_name(elem_type: int) -> str:
    """numpy dtype name of an ONNX element type ("" when undefined or unknown to numpy)."""
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return ""
