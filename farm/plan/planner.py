"""The planner: from an optimised, validated Graph to a BuildPlan.

One KernelSpec per distinct (op, attributes, shapes, dtype, activation), shared by every node that needs it, a
BlobSpec per distinct constant, a schedule of steps in graph order and a static memory plan that reuses buffers
once their last reader has run. The plan is target-independent; kernels are specialised per target at build time
(with the variant tuning chose for that target, if any).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.errors import UnsupportedError
from farm.ir.graph import Graph, Node
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import LOWERINGS
from farm.ops.registry import NodeContext

ALIGNMENT = 64


@dataclass(frozen=True)
class Arg:
    """A kernel argument: an arena buffer (by name) or a constant blob (by the sha256 of its bytes)."""

    kind: str
    name: str


@dataclass
class Step:
    """One kernel call: the node it implements, its target-free spec and its arguments."""

    node: str
    spec: KernelSpec
    args: list[Arg]


@dataclass
class MemoryPlan:
    """Offsets of every arena buffer (activations, graph inputs and outputs, scratch) in one arena."""

    arena_bytes: int
    offsets: dict[str, int]
    sizes: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        buffers = [{"name": n, "offset": self.offsets[n], "bytes": self.sizes[n]} for n in sorted(self.offsets)]
        return {"arena_bytes": self.arena_bytes, "alignment": ALIGNMENT, "buffers": buffers}


@dataclass
class BuildPlan:
    """What to build. `tuned` holds the variants that tuning chose (farm/tuning/variants.py), by (kernel key, target id):
    the variant JSON the kernel's spec carries on that target, "" when the default won. A kernel that is not in it
    uses the default variant."""

    graph: Graph
    steps: list[Step]
    blobs: dict[str, np.ndarray]
    memory: MemoryPlan
    tuned: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)

    def kernels(self) -> dict[str, KernelSpec]:
        """Distinct kernel specs by key, in first-use order."""
        return {step.spec.key: step.spec for step in self.steps}

    def kernel_for(self, spec: KernelSpec, target_id: str) -> KernelSpec:
        """The spec that is compiled for `target_id`: the plan's spec with that target and its tuned variant."""
        return dataclasses.replace(spec, target_id=target_id, variant_json=self.tuned.get((spec.key, target_id), ""))


def _jsonable(value: Any) -> Any:
    """Attribute values as plain JSON types (numpy scalars and arrays become numbers and lists)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode()
    return value


def plan_node(node: Node, graph: Graph, blobs: dict[str, np.ndarray]) -> Step:
    """The step for one node: normalised attributes, data arguments and scratch; constants go into `blobs`."""
    lowering = LOWERINGS[node.op_type]
    ctx = NodeContext(node, [graph.values.get(name) for name in node.inputs],
                      [graph.values[name] for name in node.outputs if name], graph.constants, graph.opset)
    attrs = {k: _jsonable(v) for k, v in lowering.normalize(ctx).items()}
    data = [node.inputs[i] for i in lowering.data_input_indices(node)]
    outputs = [name for name in node.outputs if name]
    spec = KernelSpec(node.op_type, canonical_json(attrs), tuple(graph.values[n] for n in data),
                      tuple(graph.values[n] for n in outputs), node.activation, target_id="")
    args = [Arg("arena", n) for n in outputs]
    args += [_blob_arg(graph.constants[n], blobs) if n in graph.constants else Arg("arena", n) for n in data]
    if lowering.scratch_floats(spec):
        args.append(Arg("arena", f"{node.name}::scratch"))
    return Step(node.name, spec, args)


def _blob_arg(array: np.ndarray, blobs: dict[str, np.ndarray]) -> Arg:
    """A constant passed to a kernel: one blob per distinct byte content."""
    contiguous = np.ascontiguousarray(array)
    sha = hashlib.sha256(memoryview(contiguous).cast("B")).hexdigest()
    blobs.setdefault(sha, contiguous)
    return Arg("blob", sha)


def make_plan(graph: Graph) -> BuildPlan:
    """Plan the whole graph."""
    for name in graph.outputs:
        if name in graph.constants:
            raise UnsupportedError(f"graph output {name!r} is a constant; farm needs it computed by a node")
    blobs: dict[str, np.ndarray] = {}
    steps = [plan_node(node, graph, blobs) for node in graph.nodes]
    return BuildPlan(graph, steps, blobs, plan_memory(graph, steps))


def _buffer_bytes(name: str, graph: Graph, steps: list[Step]) -> int:
    if name in graph.values:
        return graph.values[name].nbytes
    step = next(s for s in steps if Arg("arena", name) in s.args)
    return LOWERINGS[step.spec.op].scratch_floats(step.spec) * 4


def _lifetimes(graph: Graph, steps: list[Step]) -> dict[str, list[int]]:
    """[first step that writes or holds it, last step that reads it] for every arena buffer."""
    spans: dict[str, list[int]] = {name: [-1, -1] for name in graph.inputs}
    for index, step in enumerate(steps):
        for arg in step.args:
            if arg.kind == "arena":
                spans.setdefault(arg.name, [index, index])[1] = index
    for name in graph.outputs:
        spans[name][1] = len(steps)
    return spans


def plan_memory(graph: Graph, steps: list[Step]) -> MemoryPlan:
    """First-fit placement: a buffer shares bytes only with buffers whose lifetimes don't overlap its own."""
    spans = _lifetimes(graph, steps)
    offsets: dict[str, int] = {}
    sizes = {name: _align(max(_buffer_bytes(name, graph, steps), 1)) for name in spans}
    placed: list[tuple[int, int, int, int]] = []
    for name in sorted(spans, key=lambda n: (spans[n][0], n)):
        start, end = spans[name]
        busy = sorted((off, size) for off, size, s, e in placed if s <= end and start <= e)
        offsets[name] = _first_gap(busy, sizes[name])
        placed.append((offsets[name], sizes[name], start, end))
    arena = max((off + size for off, size, _, _ in placed), default=0)
    return MemoryPlan(arena, offsets, sizes)


def _first_gap(busy: list[tuple[int, int]], size: int) -> int:
    """Lowest offset where `size` bytes fit between the (offset, size) ranges in `busy`."""
    candidate = 0
    for offset, length in busy:
        if candidate + size <= offset:
            return candidate
        candidate = max(candidate, offset + length)
    return candidate


def _align(nbytes: int) -> int:
    return (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def for_target(spec: KernelSpec, target_id: str) -> KernelSpec:
    return dataclasses.replace(spec, target_id=target_id)
