"""Copies the memory plan makes unnecessary: a Concat's inputs placed in their slices of its output, a reshape's
output placed on its input's bytes. The producers then write where the copy would have, and the copying node, on a
CPU, copies nothing: its spec's attribute `in_place` is true (which the planner sets and no model can), and its
kernel there has no statement. OpenCL keeps a buffer per value and runs the copies as before: the aliases only
place CPU arena offsets (farm.plan.memory, MemoryPlan.aliases).

A Concat's inputs are contiguous slices of its output when every axis before the Concat's is of size 1 (a batch of
one, joined along channels: SqueezeNet's fire modules, Inception's branches, DenseNet's blocks); the copies took 5%
of light SqueezeNet's and DenseNet-121's time on one Xeon core. Nested Concats (DenseNet's block, each layer's
Concat an input of the next) nest their slices: the memory plan resolves a slice of a slice. A reshape (Reshape,
Flatten, Squeeze, Unsqueeze, Identity, Dropout) keeps the row-major bytes, so its output is its input's buffer
under another shape: a transformer's attention reshapes its queries, keys, values and context in every layer.

What may lie inside another buffer never changes under a reader: no in-place conv writes over any of the buffers
involved (planner._residuals_in_place), no model output lies inside another buffer (its slot is the caller's), and
the outer buffer is held for the lifetimes of all those inside it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import prod
from typing import Protocol

from farm.ir.graph import Graph
from farm.plan.memory import ALIGNMENT, Alias, Call

RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
"""The ops whose output is their first input's bytes under another shape (ops/tensor.py _lower_copy)."""


class NamedCall(Call, Protocol):
    """What this pass reads of a planner step (planner.Step): memory.Call's spec and arguments, and its node."""

    @property
    def node(self) -> str: ...


def copies_in_place(
    graph: Graph, steps: Sequence[NamedCall], overwritten: Iterable[str]
) -> tuple[set[str], dict[str, Alias]]:
    """The nodes whose copies the memory plan makes unnecessary, and the aliases that do it: {buffer: (the buffer
    it lies inside, byte offset)}. Concats first (concats_in_place), then reshapes (reshapes_in_place). No buffer
    that an in-place conv writes over (`overwritten`) is involved in either."""
    overwritten = set(overwritten)
    nodes, aliases = concats_in_place(graph, steps, overwritten)
    reshaped, onto = reshapes_in_place(graph, steps, overwritten, aliases)
    return nodes | reshaped, {**aliases, **onto}


def concats_in_place(
    graph: Graph, steps: Sequence[NamedCall], overwritten: set[str]
) -> tuple[set[str], dict[str, Alias]]:
    """The nodes of the Concats that can run in place, and the aliases that place their inputs: {input buffer: (its
    Concat's output buffer, byte offset)}. A Concat runs in place when it has no fused activation, its inputs are
    arena buffers of its own that no other Concat claimed, none is a model input or output, none is a buffer that
    an in-place conv writes over (its bytes would change under the output), its output is no buffer that an
    in-place conv writes over either, and each input is not empty and starts at a multiple of ALIGNMENT bytes
    (kernels take buffers so aligned)."""
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


def reshapes_in_place(
    graph: Graph, steps: Sequence[NamedCall], overwritten: set[str], aliases: dict[str, Alias]
) -> tuple[set[str], dict[str, Alias]]:
    """The nodes of the reshapes whose output can lie on their input, and those aliases ({output: (input, 0)}): a
    reshape (RESHAPES) with one output, no fused activation, its input an arena buffer (a model input too), its
    output no model output and not in `aliases` already (a Concat's input), neither a buffer that an in-place conv
    writes over. A chain of reshapes lies on its first input."""
    kept = set(graph.outputs) | overwritten | set(aliases)
    onto: dict[str, Alias] = {}
    nodes = set()
    for step in steps:
        spec = step.spec
        if spec.op not in RESHAPES or spec.activation or len(spec.outputs) != 1 or len(step.args) < 2:
            continue
        output, source = step.args[0], step.args[1]
        if source.kind != "arena" or output.name in kept or source.name in overwritten:
            continue
        onto[output.name] = (source.name, 0)
        nodes.add(step.node)
    return nodes, onto
