"""Concats in place: each input of a Concat whose inputs are contiguous slices of its output is placed in the arena
at its slice of the output, so that the input's producer writes it where the Concat would have copied it, and the
Concat, on a CPU, copies nothing (its spec's attribute `in_place` is true, which the planner sets and no model
can: its kernel there has no statement).

The inputs are contiguous slices when every axis before the Concat's is of size 1 (a batch of one, joined along
channels: SqueezeNet's fire modules, Inception's branches, DenseNet's blocks). The copies took 5% of light
SqueezeNet's and DenseNet-121's time on one Xeon core. Nested Concats (DenseNet's block, each layer's Concat an
input of the next) nest their slices: farm.plan.memory resolves a slice of a slice.

OpenCL keeps a buffer per value and runs the Concat's copy as before: the aliases only place CPU arena offsets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import prod
from typing import Protocol

from farm.ir.graph import Graph
from farm.plan.memory import ALIGNMENT, Alias, Call


class NamedCall(Call, Protocol):
    """What this pass reads of a planner step (planner.Step): memory.Call's spec and arguments, and its node."""

    @property
    def node(self) -> str: ...


def concats_in_place(
    graph: Graph, steps: Sequence[NamedCall], overwritten: Iterable[str]
) -> tuple[set[str], dict[str, Alias]]:
    """The nodes of the Concats that can run in place, and the aliases that place their inputs: {input buffer: (its
    Concat's output buffer, byte offset)}. A Concat runs in place when it has no fused activation, its inputs are
    arena buffers of its own that no other Concat claimed, none is a model input or output, none is a buffer that
    an in-place conv writes over (`overwritten`: its bytes would change under the output), its output is no buffer
    that an in-place conv writes over either, and each input is not empty and starts at a multiple of ALIGNMENT
    bytes (kernels take buffers so aligned)."""
    overwritten = set(overwritten)
    kept = set(graph.inputs) | set(graph.outputs) | overwritten
    aliases: dict[str, Alias] = {}
    nodes = set()
    for step in steps:
        slices = None if step.args[0].name in overwritten else _slices(step, kept, aliases)
        if slices is not None:
            aliases.update({name: (step.args[0].name, offset) for name, offset in slices})
            nodes.add(step.node)
    return nodes, aliases


def _slices(step: NamedCall, kept: set[str], aliases: dict[str, Alias]) -> list[tuple[str, int]] | None:
    """(input buffer, byte offset in the output) of each input of a Concat step that can run in place, else
    None."""
    spec = step.spec
    if spec.op != "Concat" or spec.activation:
        return None
    axis, shape = spec.attrs["axis"], spec.outputs[0].shape
    inputs = step.args[1 : 1 + len(spec.inputs)]
    names = [arg.name for arg in inputs]
    if prod(shape[:axis]) != 1 or len(set(names)) != len(names) or step.args[0].name in names:
        return None
    if any(arg.kind != "arena" or arg.name in kept or arg.name in aliases for arg in inputs):
        return None
    offsets, offset = [], 0
    for info in spec.inputs:
        if offset % ALIGNMENT or not info.nbytes:
            return None
        offsets.append(offset)
        offset += info.nbytes
    return list(zip(names, offsets))
