"""Pinned shapes written into an ONNX model (`farm submit --shape`), so that a model with dynamic dimensions becomes
one farm can build.

The import (onnx_import.import_model) writes the pinned sizes (farm.ir.shapes: their parsing, limits and JSON
form) into the graph's inputs before ONNX shape inference, so that the Shape -> Gather -> Concat -> Reshape chains
exporters emit fold like any static model's. The pins are checked again here against the model (apply_shapes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import onnx

from farm.errors import BadInputError


def apply_shapes(graph: onnx.GraphProto, pins: Mapping[str, tuple[int, ...]], path: str) -> None:
    """Write `pins` into the graph's inputs (in place): a name that is a graph input fixes that input's whole
    shape; any other fixes each input dimension of that symbolic name. A pin that names neither, that gives an
    input another rank, or that contradicts a static size is a BadInputError naming the model's inputs and
    symbolic dimensions."""
    initializers = {tensor.name for tensor in graph.initializer}
    inputs = {vi.name: vi for vi in graph.input if vi.name not in initializers}
    symbolic = {dim.dim_param for vi in inputs.values() for dim in _dims(vi) if dim.dim_param}
    for name, sizes in pins.items():
        if name in inputs:
            _pin_input(inputs[name], sizes, path)
        elif name in symbolic and len(sizes) == 1:
            for vi in inputs.values():
                _pin_dimension(vi, name, sizes[0])
        else:
            raise BadInputError(
                f"{path}: --shape {name}: the model has no input or symbolic dimension of that name "
                f"({_described(inputs.values())})"
            )


def _dims(vi: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
    return list(vi.type.tensor_type.shape.dim) if vi.type.tensor_type.HasField("shape") else []


def _pin_input(vi: onnx.ValueInfoProto, sizes: tuple[int, ...], path: str) -> None:
    dims = _dims(vi)
    shown = "x".join(map(str, sizes))
    if vi.type.tensor_type.HasField("shape") and len(dims) != len(sizes):
        raise BadInputError(
            f"{path}: --shape {vi.name}={shown}: input {vi.name!r} has {len(dims)} dimensions ({_shape_text(vi)})"
        )
    for dim, size in zip(dims, sizes):
        if dim.HasField("dim_value") and dim.dim_value != size:
            raise BadInputError(f"{path}: --shape {vi.name}={shown}: input {vi.name!r} is {_shape_text(vi)}")
    shape = vi.type.tensor_type.shape
    shape.ClearField("dim")
    for size in sizes:
        shape.dim.add().dim_value = size


def _pin_dimension(vi: onnx.ValueInfoProto, name: str, size: int) -> None:
    for dim in _dims(vi):
        if dim.dim_param == name:
            dim.dim_value = size


def _shape_text(vi: onnx.ValueInfoProto) -> str:
    dims = _dims(vi)
    if not vi.type.tensor_type.HasField("shape"):
        return "of unknown rank"
    return "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else d.dim_param or "?" for d in dims) + "]"


def _described(inputs: Iterable[onnx.ValueInfoProto]) -> str:
    listed = [f"{vi.name} {_shape_text(vi)}" for vi in inputs]
    return "inputs: " + ("; ".join(listed) if listed else "none")


def dynamic_input_hint(name: str, dims: tuple[int | str, ...]) -> str:
    """What to pass to build a model whose input `name` has the symbolic or unknown dims in `dims`: a --shape
    per symbolic name, or for the whole input."""
    symbolic = [d for d in dims if isinstance(d, str) and d != "?"]
    whole = "x".join(str(d) if isinstance(d, int) else "N" for d in dims)
    by_name = " ".join(f"--shape {d}=N" for d in dict.fromkeys(symbolic))
    return f"pin it with {by_name + ' or ' if by_name else ''}--shape {name}={whole}"
