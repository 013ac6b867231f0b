"""The static memory plan: one arena for every buffer of a build (activations, graph inputs and outputs, scratch),
first-fit over lifetimes, so that a buffer reuses the bytes of buffers whose last reader has already run.

It reads the planner's steps (farm/plan/planner.py Step and Arg) through the small protocols below rather than by
importing them: the planner imports this module to lay out its plan.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from farm.ir.graph import Graph
from farm.ir.specs import KernelSpec
from farm.ops import LOWERINGS

ALIGNMENT = 64
INPUT_POINTERS = "::input_pointers"
"""The buffer of the model inputs' pointer slots, 8 bytes an input in graph order, held for the whole run: where a
runtime writes the address of a feed that kernels read in place, or 0 for the input's own buffer (the entry's
"input" arguments, farm.backends.llvm.entry). Zero-filled, as an arena starts, every input is read from its buffer."""
POINTER_BYTES = 8
Alias = tuple[str, int]
"""Where a buffer lies inside another: (that buffer's name, byte offset). farm.plan.in_place places a Concat's
inputs so, in its output, and a reshape's output on its input."""


class Argument(Protocol):
    """What the memory plan reads of a kernel argument (planner.Arg): "arena" or "blob", and its name."""

    @property
    def kind(self) -> str: ...

    @property
    def name(self) -> str: ...


class Call(Protocol):
    """What the memory plan reads of a kernel call (planner.Step): its spec, for the scratch size, and arguments."""

    @property
    def spec(self) -> KernelSpec: ...

    @property
    def args(self) -> Sequence[Argument]: ...


@dataclass
class MemoryPlan:
    """Offsets of every arena buffer (activations, graph inputs and outputs, scratch) in one arena."""

    arena_bytes: int
    offsets: dict[str, int]
    sizes: dict[str, int]
    aliases: dict[str, Alias] = field(default_factory=dict)
    """The buffers that lie inside others (plan_memory's `aliases`): they share those buffers' bytes."""
    pointers: dict[str, int] = field(default_factory=dict)
    """Each model input's pointer slot (INPUT_POINTERS): its arena offset, by input name (none for an input that is
    also a model output)."""

    def input_within(self, name: str) -> tuple[str, int] | None:
        """(the model input, byte offset inside it) where buffer `name` lies in a model input's bytes (the input
        itself, or a reshape placed on it); None for any other buffer."""
        offset = 0
        while name in self.aliases:
            name, inner = self.aliases[name]
            offset += inner
        return (name, offset) if name in self.pointers else None

    def to_json(self) -> dict[str, Any]:
        buffers = [{"name": n, "offset": self.offsets[n], "bytes": self.sizes[n]} for n in sorted(self.offsets)]
        return {"arena_bytes": self.arena_bytes, "alignment": ALIGNMENT, "buffers": buffers}


def _scratch_steps(steps: Sequence[Call]) -> dict[str, Call]:
    """The step that names each arena buffer, for the scratch buffers, which are no graph values (one pass, so
    that sizing every scratch buffer stays linear in the step count)."""
    owners: dict[str, Call] = {}
    for step in steps:
        for arg in step.args:
            if arg.kind == "arena":
                owners.setdefault(arg.name, step)
    return owners


def _buffer_bytes(name: str, graph: Graph, owners: dict[str, Call]) -> int:
    """A graph value's bytes, or the scratch of the step that names the buffer (scratch is no graph value)."""
    if name in graph.values:
        return graph.values[name].nbytes
    if name == INPUT_POINTERS:
        return POINTER_BYTES * len(graph.inputs)
    step = owners[name]
    return LOWERINGS[step.spec.op].scratch_floats(step.spec) * 4


def _lifetimes(graph: Graph, steps: Sequence[Call]) -> dict[str, list[int]]:
    """[first step that writes or holds it, last step that reads it] for every arena buffer."""
    spans: dict[str, list[int]] = {name: [-1, -1] for name in graph.inputs}
    if graph.inputs:
        spans[INPUT_POINTERS] = [-1, len(steps)]
    for index, step in enumerate(steps):
        for arg in step.args:
            if arg.kind == "arena":
                spans.setdefault(arg.name, [index, index])[1] = index
    for name in graph.outputs:  # an empty output that no step writes is held from the end of the run
        spans.setdefault(name, [len(steps), len(steps)])[1] = len(steps)
    return spans


def plan_memory(graph: Graph, steps: Sequence[Call], aliases: Mapping[str, Alias] | None = None) -> MemoryPlan:
    """First-fit placement: a buffer shares bytes only with buffers whose lifetimes don't overlap its own.

    Buffers are placed in order of their first step, so a placed buffer whose last step is before the current
    buffer's first can never overlap this or any later buffer: it leaves the live set for good (a heap by last
    step), and each placement scans only the buffers live at that point. Planning so stays near-linear in the
    node count (a 20,000-node chain took over a minute when every placement scanned every placed buffer).

    A buffer in `aliases` is not placed: it lies at its offset inside the buffer it names (a slice of a slice
    inside the outermost), which is held for the lifetimes of all the buffers inside it.
    """
    spans = _lifetimes(graph, steps)
    owners = _scratch_steps(steps)
    offsets: dict[str, int] = {}
    sizes = {name: _align(max(_buffer_bytes(name, graph, owners), 1)) for name in spans}
    inside = _outermost(aliases or {})
    for name, (outer, _) in inside.items():
        spans[outer] = [min(spans[outer][0], spans[name][0]), max(spans[outer][1], spans[name][1])]
    live: list[tuple[int, int, str]] = []  # (offset, size, name), sorted: the busy ranges in offset order
    ending: list[tuple[int, int, int, str]] = []  # heap of (last step, offset, size, name) of the live buffers
    arena = 0
    for name in sorted((n for n in spans if n not in inside), key=lambda n: (spans[n][0], n)):
        start, end = spans[name]
        while ending and ending[0][0] < start:
            _, offset, size, dead = heapq.heappop(ending)
            del live[bisect.bisect_left(live, (offset, size, dead))]
        offsets[name] = _first_gap([(offset, size) for offset, size, _ in live], sizes[name])
        bisect.insort(live, (offsets[name], sizes[name], name))
        heapq.heappush(ending, (end, offsets[name], sizes[name], name))
        arena = max(arena, offsets[name] + sizes[name])
    offsets.update({name: offsets[outer] + offset for name, (outer, offset) in inside.items()})
    pointers = {
        name: offsets[INPUT_POINTERS] + POINTER_BYTES * index
        for index, name in enumerate(graph.inputs)
        if name not in graph.outputs  # a model output's slot is read after the run: the input must be copied there
    }
    return MemoryPlan(arena, offsets, sizes, dict(aliases or {}), pointers)


def _outermost(aliases: Mapping[str, Alias]) -> dict[str, Alias]:
    """For each buffer in `aliases`, the buffer it lies inside that lies inside no other, and its offset there.
    Each chain is walked once (a resolved buffer ends the walk), so a model of many nested slices or chained
    reshapes resolves in linear time."""
    resolved: dict[str, Alias] = {}
    for name in aliases:
        chain, outer = [], name
        while outer in aliases and outer not in resolved:
            chain.append(outer)
            outer = aliases[outer][0]
        for inner in reversed(chain):
            parent, offset = aliases[inner]
            root, more = resolved.get(parent, (parent, 0))
            resolved[inner] = (root, more + offset)
    return resolved


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
