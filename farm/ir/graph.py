"""farm's graph IR: what the frontend produces, the passes rewrite and the planner reads.

It is deliberately small: static shapes, named values, nodes in topological order, constants as numpy arrays.
ONNX protobufs stop at the frontend so that nothing downstream depends on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
        return self.size * np.dtype(self.dtype).itemsize


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


@dataclass
class Graph:
    """A whole model: graph inputs and outputs by name, the info of every value, constants and nodes."""

    name: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    values: dict[str, TensorInfo]
    constants: dict[str, np.ndarray]
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
