"""The static memory plan: one arena for every buffer of a build (activations, graph inputs and outputs, scratch),
first-fit over lifetimes, so that a buffer reuses the bytes of buffers whose last reader has already run.

It reads the planner's steps (farm/plan/planner.py Step and Arg) through the small protocols below rather than by
importing them: the planner imports this module to lay out its plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from farm.ir.graph import Graph
from farm.ir.specs import KernelSpec
from farm.ops import LOWERINGS

ALIGNMENT = 64


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

    def to_json(self) -> dict[str, Any]:
        buffers = [{"name": n, "offset": self.offsets[n], "bytes": self.sizes[n]} for n in sorted(self.offsets)]
        return {"arena_bytes": self.arena_bytes, "alignment": ALIGNMENT, "buffers": buffers}


def _buffer_bytes(name: str, graph: Graph, steps: Sequence[Call]) -> int:
    """A graph value's bytes, or the scratch of the step that names the buffer (scratch is no graph value)."""
    if name in graph.values:
        return graph.values[name].nbytes
    step = next(s for s in steps if any(arg.kind == "arena" and arg.name == name for arg in s.args))
    return LOWERINGS[step.spec.op].scratch_floats(step.spec) * 4


def _lifetimes(graph: Graph, steps: Sequence[Call]) -> dict[str, list[int]]:
    """[first step that writes or holds it, last step that reads it] for every arena buffer."""
    spans: dict[str, list[int]] = {name: [-1, -1] for name in graph.inputs}
    for index, step in enumerate(steps):
        for arg in step.args:
            if arg.kind == "arena":
                spans.setdefault(arg.name, [index, index])[1] = index
    for name in graph.outputs:
        spans[name][1] = len(steps)
    return spans


def plan_memory(graph: Graph, steps: Sequence[Call]) -> MemoryPlan:
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

