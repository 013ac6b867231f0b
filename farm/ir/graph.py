"""farm's graph IR: what the frontend produces, the passes rewrite and the planner reads.

It is deliberately small: static shapes, named values, nodes in topological order, constants as numpy arrays.
ONNX protobufs stop at the frontend so that nothing downstream depends on them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ITEMSIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}
"""The bytes of an element of each dtype farm computes in, known without numpy's dtype of the name: bfloat16's is
ml_dtypes', and a compile worker must not import ml_dtypes (0.6 s) for a size."""


def itemsize(dtype: str) -> int:
    """The bytes of one element of `dtype` (a numpy dtype name)."""
    return ITEMSIZES.get(dtype) or np.dtype(dtype).itemsize


FUSED_OPS = frozenset({"QLinearAdd", "MatMulIntegerToFloat"})
"""Ops that only farm's graph passes make, each lowered by farm.ops like an ONNX op: the importer refuses them in a
model file, and farm.ops.SUPPORTED_OPS (the ONNX ops farm takes) leaves them out."""


@dataclass(frozen=True)
class Activation:
    """An elementwise activation fused into the op that produces its input (Relu, Clip, LeakyRelu)."""

    kind: str
    params: tuple[float, ...] = ()


@dataclass(frozen=True)
class TensorInfo:
    """Static shape and numpy dtype name of one value."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @classmethod
    def of_array(cls, array: np.ndarray) -> TensorInfo:
        """The info of a constant: the import and the passes that make new constants both describe them so."""
        return cls(tuple(int(d) for d in array.shape), array.dtype.name)

    @property
    def size(self) -> int:
        """The element count, exact (numpy's int64 product would wrap for a hostile shape such as 2**32 x 2**32)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * itemsize(self.dtype)


@dataclass(frozen=True)
class DeferredArray:
    """A constant known by its shape, dtype and sha256 whose bytes are read only when its values are asked for: a
    weight a farm job's submitter named by digest (farm.frontend.external.StoredBlobs). `load` reads it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    digest: str
    load: Callable[[], np.ndarray]

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.shape, self.dtype.name)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


class Constants(MutableMapping[str, np.ndarray]):
    """A graph's constants by name. Some may be deferred (DeferredArray): read the first time something asks for
    their values (`constants[name]`, `get`), so that planning a farm job whose passes never look at a weight's
    values moves none of its bytes; membership, iteration, `info` and `digest` never read one."""

    def __init__(
        self, arrays: Mapping[str, np.ndarray] | None = None, deferred: Mapping[str, DeferredArray] | None = None
    ) -> None:
        self._arrays: dict[str, np.ndarray] = dict(arrays or {})
        self._deferred: dict[str, DeferredArray] = dict(deferred or {})
        self._read: dict[str, tuple[np.ndarray, str]] = {}
        """Deferred constants read since, each with its digest (which holds while the constant is that array)."""

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._arrays:
            return self._arrays[name]
        deferred = self._deferred.pop(name)
        array = self._arrays[name] = deferred.load()
        self._read[name] = (array, deferred.digest)
        return array

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._deferred.pop(name, None)
        self._arrays[name] = value

    def __delitem__(self, name: str) -> None:
        if self._deferred.pop(name, None) is None:
            del self._arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self._arrays or name in self._deferred

    def __iter__(self) -> Iterator[str]:
        yield from list(self._arrays)
        yield from list(self._deferred)

    def __len__(self) -> int:
        return len(self._arrays) + len(self._deferred)

    def info(self, name: str) -> TensorInfo:
        """The constant's shape and dtype, without reading a deferred one."""
        deferred = self._deferred.get(name)
        return deferred.info if deferred is not None else TensorInfo.of_array(self._arrays[name])

    def deferred(self, name: str) -> DeferredArray | None:
        """The constant while it is still deferred (unread), else None."""
        return self._deferred.get(name)

    def digest(self, name: str) -> str | None:
        """The sha256 of a deferred constant's bytes, while it is unread or still the array it was read into."""
        deferred = self._deferred.get(name)
        if deferred is not None:
            return deferred.digest
        read = self._read.get(name)
        return read[1] if read is not None and read[0] is self._arrays.get(name) else None


@dataclass
class Node:
    """One operation. `inputs` may hold "" for an absent optional input, as in ONNX."""

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""
    activation: Activation | None = None
    residual: bool = False
    """Set by the residual-add fusion pass only (never read from a model file): the node's last input is added to
    its output before the activation (a Conv that absorbed the Add of a skip connection)."""
    bias: bool = False
    """Set by the bias fusion pass only (never read from a model file): the MatMul's third input, one value per
    column of its output, is added to every row before the activation (a MatMul that absorbed a linear layer's
    bias Add)."""


@dataclass
class Graph:
    """A whole model: graph inputs and outputs by name, the info of every value, constants and nodes."""

    name: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    values: dict[str, TensorInfo]
    constants: Constants
    nodes: list[Node]
    # Values whose shape is not fully static (a symbolic dim by name, "?" when unknown), kept out of `values` so
    # that everything downstream sees only static shapes, and kept here so that validate can name the shape.
    dynamic_shapes: dict[str, tuple[int | str, ...]] = field(default_factory=dict)
    # Values whose static shape came from the model's own declaration because inference could not compute it; the
    # passes check each again once its inputs are known (a wrong declared shape would size a kernel's buffers).
    declared_shapes: set[str] = field(default_factory=set)
    # Constants whose sha256 is known without hashing (the blobs a farm job's submitter named by digest), each with
    # the array it was read into: a digest holds only while the constant is still that array (read-only, so its
    # bytes can't change), which a pass that replaces it breaks (planner.constant_digests hashes it then).
    known_digests: dict[str, tuple[np.ndarray, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.constants, Constants):
            self.constants = Constants(self.constants)

    def constant_digest(self, name: str) -> str | None:
        """The sha256 of constant `name`'s bytes when it is known without hashing them: a weight the submitter named
        by digest, while it is still the bytes it named (known_digests, Constants.digest)."""
        digest = self.constants.digest(name)
        if (
            digest is None
            and name in self.known_digests
            and name in self.constants
            and (self.constants.deferred(name) is None and self.known_digests[name][0] is self.constants[name])
        ):
            digest = self.known_digests[name][1]
        return digest

    def consumers(self) -> dict[str, list[Node]]:
        """Map each value name to the nodes that read it."""
        users: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    users.setdefault(name, []).append(node)
        return users

    def producers(self) -> dict[str, Node]:
        """Map each value name to the node that writes it."""
        return {out: node for node in self.nodes for out in node.outputs}
