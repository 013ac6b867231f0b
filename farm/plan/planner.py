"""The planner: from an optimised, validated Graph to a BuildPlan.

One KernelSpec per distinct (op, attributes, shapes, dtype, activation), shared by every node that needs it, a
BlobSpec per distinct constant, a schedule of steps in graph order and a static memory plan (farm/plan/memory.py)
that reuses buffers once their last reader has run. A node that writes only empty tensors (a 0 dim) gets no step.
The plan is target-independent; kernels are specialised per target at build time (with the variant tuning chose
for that target, if any).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from farm import defaults
from farm.errors import UnsupportedError
from farm.ir import launching
from farm.ir.graph import DeferredArray, Graph, Node
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import LOWERINGS
from farm.ops.conv import RESIDUAL_IN_PLACE
from farm.ops.registry import NodeContext, OpLowering, check_dtypes, lower_kernel
from farm.plan.in_place import copies_in_place
from farm.plan.memory import MemoryPlan, plan_memory


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


Blob = Union[np.ndarray, DeferredArray]
"""A plan's weight blob: its bytes (uint8), or a deferred weight's handle that reads them (farm.ir.graph)."""


@dataclass(frozen=True)
class BuildPlan:
    """What to build. `tuned` holds the variants that tuning chose, by (kernel key, target id): the variant JSON
    the kernel's spec carries on that target, "" when the default won. A kernel that is not in it uses the default
    variant. A plan is a value: farm/tuning/variants.py `with_variants` gives a new plan with the variants, so a
    plan never changes under whoever holds it."""

    graph: Graph
    steps: list[Step]
    blobs: dict[str, Blob]
    memory: MemoryPlan
    tuned: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    _targeted: dict[tuple[str, str], KernelSpec] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """kernel_for's answers: a link plan asks for each step's spec on each target several times, and a new spec
    computes its key (a sha256 over its JSON) again: 2,166 keys, 0.09 s of light DenseNet-121's finish."""

    def kernels(self) -> dict[str, KernelSpec]:
        """Distinct kernel specs by key, in first-use order."""
        return {step.spec.key: step.spec for step in self.steps}

    def kernel_for(self, spec: KernelSpec, target_id: str) -> KernelSpec:
        """The spec that is compiled for `target_id`: the plan's spec with that target and its tuned variant."""
        found = self._targeted.get((spec.key, target_id))
        if found is None:
            found = dataclasses.replace(
                spec, target_id=target_id, variant_json=self.tuned.get((spec.key, target_id), "")
            )
            self._targeted[spec.key, target_id] = found
        return found


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


def plan_node(
    node: Node,
    graph: Graph,
    blobs: dict[str, Blob],
    digests: Mapping[str, str] | None = None,
) -> Step:
    """The step for one node: normalised attributes, data arguments and scratch; constants go into `blobs`
    (`digests`: their sha256s by name where already known, see constant_digests)."""
    lowering = LOWERINGS[node.op_type]
    ctx = NodeContext.of(node, graph)
    check_dtypes(ctx, lowering.dtypes)
    attrs = {k: _jsonable(v) for k, v in lowering.normalize(ctx).items()}
    data = [node.inputs[i] for i in lowering.data_input_indices(node)]
    outputs = [name for name in node.outputs if name]
    spec = KernelSpec(
        node.op_type,
        canonical_json(attrs),
        tuple(graph.values[n] for n in data),
        tuple(graph.values[n] for n in outputs),
        node.activation,
        target_id="",
    )
    _check_empty_operands(node, graph, lowering, [*outputs, *data])
    args = [Arg("arena", n) for n in outputs]
    args += [_data_arg(n, graph, blobs, digests or {}) for n in data]
    if lowering.scratch_floats(spec):
        args.append(Arg("arena", f"{node.name}::scratch"))
    return Step(node.name, spec, args)


def _check_empty_operands(node: Node, graph: Graph, lowering: OpLowering, names: list[str]) -> None:
    """Refuse a kernel that would compute a non-empty output with an empty buffer among its arguments, unless its
    op's lowering says it is right so (OpLowering.empty_operands: a reduction over nothing gives its identity, a
    Concat copies nothing from an empty input): other kernels were not written for it (a Gather from an empty
    tensor, a MatMul over an empty inner axis)."""
    empty = next((name for name in names if graph.values[name].size == 0), None)
    if empty is None or lowering.empty_operands:
        return
    role = "output" if empty in node.outputs else "input"
    raise UnsupportedError(
        f"{role} {empty!r} is empty (shape {list(graph.values[empty].shape)}) and the node "
        f"computes a non-empty output; farm's {node.op_type} kernel is not written for empty operands",
        node=node.name,
        op=node.op_type,
        domain=node.domain,
        opset=graph.opset,
    )


def _writes_something(node: Node, graph: Graph) -> bool:
    """Whether some output of `node` has an element: a node whose outputs are all empty has nothing to compute and
    gets no step (its outputs still get their buffers of no bytes)."""
    return any(graph.values[name].size for name in node.outputs if name)


def _data_arg(name: str, graph: Graph, blobs: dict[str, Blob], digests: Mapping[str, str]) -> Arg:
    """A data input's argument: a constant's blob, else its arena buffer. An empty constant (an empty graph input
    among them) gets an arena buffer, which its kernel never reads, rather than a blob of no bytes. A deferred
    constant (farm.ir.graph.Constants) is its blob unread, by its digest."""
    if name not in graph.constants or graph.constants.info(name).size == 0:
        return Arg("arena", name)
    deferred = graph.constants.deferred(name)
    if deferred is not None:
        blobs.setdefault(deferred.digest, deferred)
        return Arg("blob", deferred.digest)
    return _blob_arg(graph.constants[name], blobs, digests.get(name))


def _blob_bytes(array: np.ndarray) -> np.ndarray:
    """A constant's bytes as a uint8 array (memoryview refuses dtypes outside Python's buffer protocol, bfloat16's
    among them)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _sha256(array: np.ndarray) -> str:
    return hashlib.sha256(_blob_bytes(array).data).hexdigest()


def _blob_arg(array: np.ndarray, blobs: dict[str, Blob], sha: str | None = None) -> Arg:
    """A constant passed to a kernel: one blob per distinct byte content, kept as its bytes."""
    sha = sha or _sha256(array)
    blobs.setdefault(sha, _blob_bytes(array))
    return Arg("blob", sha)


def constant_digests(graph: Graph) -> dict[str, str]:
    """The sha256 of every non-empty constant that a node's kernel takes as data (a blob): known from the import
    for a farm job's submitted weights (Graph.known_digests), else hashed on threads: hashlib releases the GIL on
    large buffers, and hashing took 0.44 s of BERT-base's 0.92 s plan on one."""
    names = sorted(
        {
            node.inputs[index]
            for node in graph.nodes
            for index in LOWERINGS[node.op_type].data_input_indices(node)
            if node.inputs[index] in graph.constants and graph.constants.info(node.inputs[index]).size
        }
    )
    known = {name: digest for name in names if (digest := graph.constant_digest(name)) is not None}
    unknown = [name for name in names if name not in known]
    with ThreadPoolExecutor(max_workers=max(1, min(len(unknown), defaults.cpu_count()))) as pool:
        return {**known, **dict(zip(unknown, pool.map(lambda name: _sha256(graph.constants[name]), unknown)))}


# The most work (farm/ir/loopir.py `work`: innermost statements run, each about a nanosecond) one kernel call may
# take: 2**40 is over ten minutes on one core, far beyond any real model's kernel. A hostile attribute can make a
# kernel loop that long over a small output (MaxPool with kernel_shape 2**40 and pads of half that, five outputs
# per row), so such a model is refused when it is planned instead of building an artifact that never finishes.
MAX_KERNEL_WORK = 2**40


def make_plan(graph: Graph) -> BuildPlan:
    """Plan the whole graph."""
    for name in graph.outputs:
        if name in graph.constants:
            raise UnsupportedError(f"graph output {name!r} is a constant; farm needs it computed by a node")
    blobs: dict[str, Blob] = {}
    digests = constant_digests(graph)
    steps = _residuals_in_place(
        graph, [plan_node(node, graph, blobs, digests) for node in graph.nodes if _writes_something(node, graph)]
    )
    overwritten = [step.args[0].name for step in steps if step.spec.attrs.get("residual") == RESIDUAL_IN_PLACE]
    in_place, aliases = copies_in_place(graph, steps, overwritten)
    steps = [_copying_nothing(step) if step.node in in_place else step for step in steps]
    _check_work(graph, steps)
    return BuildPlan(graph, steps, blobs, plan_memory(graph, steps, aliases))


def _residuals_in_place(graph: Graph, steps: list[Step]) -> list[Step]:
    """Convs that add a residual which dies there write their output over it: one buffer instead of two, so that
    the lines the conv stores are the ones its residual loads just brought into cache (ResNet-50's pointwise convs
    with a residual ran faster so: docs/architecture.md, "Memory plan"). Such a conv's
    spec says so (residual RESIDUAL_IN_PLACE: no residual input), its output argument is the residual's buffer,
    and every later step reads the output there. The residual must be an activation (no constant, model input or output) that no other
    argument of the conv and no later step reads; the output no model output."""
    last_reader: dict[str, int] = {}
    for index, step in enumerate(steps):
        for arg in step.args:
            last_reader[arg.name] = index
    kept = set(graph.inputs) | set(graph.outputs)
    buffer_of: dict[str, str] = {}
    placed = []
    for index, original in enumerate(steps):
        residual = _dying_residual(original, last_reader, index, kept)
        step = Step(
            original.node, original.spec, [Arg(arg.kind, buffer_of.get(arg.name, arg.name)) for arg in original.args]
        )
        if residual is not None:
            buffer_of[original.args[0].name] = step.args[residual].name
            step = _written_over_residual(step, residual)
        placed.append(step)
    return placed


def _dying_residual(step: Step, last_reader: dict[str, int], index: int, kept: set[str]) -> int | None:
    """The argument index of the residual that conv step `index` may write over (_residuals_in_place), or None;
    `step` names the graph's values (no buffer renamed yet)."""
    if step.spec.op != "Conv" or step.spec.attrs.get("residual") is not True:
        return None
    position = len(step.spec.outputs) + len(step.spec.inputs) - 1
    value, output = step.args[position], step.args[0].name
    names = [arg.name for arg in step.args]
    if value.kind != "arena" or value.name in kept or output in kept or names.count(value.name) != 1:
        return None
    return position if last_reader[value.name] == index else None


def _written_over_residual(step: Step, residual: int) -> Step:
    """The conv step that writes its output into its residual's buffer and has no residual input."""
    spec = step.spec
    attrs = {**spec.attrs, "residual": RESIDUAL_IN_PLACE}
    spec = dataclasses.replace(spec, attrs_json=canonical_json(attrs), inputs=spec.inputs[:-1])
    args = [step.args[residual], *step.args[1:residual], *step.args[residual + 1 :]]
    return Step(step.node, spec, args)


def _copying_nothing(step: Step) -> Step:
    """The Concat or reshape step whose copy the memory plan makes unnecessary (farm.plan.in_place): its spec says
    so (`in_place`), and its CPU kernel copies nothing."""
    attrs = {**step.spec.attrs, "in_place": True}
    return Step(step.node, dataclasses.replace(step.spec, attrs_json=canonical_json(attrs)), step.args)


def _check_work(graph: Graph, steps: list[Step]) -> None:
    """Refuse a kernel whose loops would run over MAX_KERNEL_WORK, naming the first node that uses it (each distinct
    kernel is lowered once here; compiling lowers it again per target)."""
    checked: set[str] = set()
    nodes = {node.name: node for node in graph.nodes}
    for step in steps:
        if step.spec.key in checked:
            continue
        checked.add(step.spec.key)
        total = launching.work(lower_kernel(step.spec).body)
        if total > MAX_KERNEL_WORK:
            node = nodes[step.node]
            raise UnsupportedError(
                f"its kernel would run {total} loop steps, over farm's limit of {MAX_KERNEL_WORK} per call",
                node=node.name,
                op=node.op_type,
                domain=node.domain,
                opset=graph.opset,
            )


def for_target(spec: KernelSpec, target_id: str) -> KernelSpec:
    return dataclasses.replace(spec, target_id=target_id)
