"""The graph pass that drops Dropout and Identity nodes (no-ops at inference), rewiring their consumers to the
value they pass through."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from farm.errors import UnsupportedError
from farm.ir.graph import Graph, Node


def _identity_source(graph: Graph, node: Node, users: dict[str, list[Node]], outputs: set[str]) -> str:
    return node.inputs[0]


def _dropout_source(graph: Graph, node: Node, users: dict[str, list[Node]], outputs: set[str]) -> str:
    """Inference Dropout passes input 0 through; its mask has no inference meaning, so a used mask is an error,
    and so is training mode (random drops) unless it is a constant false."""
    mask = node.outputs[1] if len(node.outputs) > 1 else ""
    if mask and (mask in users or mask in outputs):
        raise _inference_only(graph, node, f"Dropout mask output {mask!r} is used")
    training = node.inputs[2] if len(node.inputs) > 2 else ""
    if training and (training not in graph.constants or bool(np.any(graph.constants[training]))):
        raise _inference_only(graph, node, f"Dropout training_mode input {training!r} is not a constant false")
    return node.inputs[0]


def _inference_only(graph: Graph, node: Node, reason: str) -> UnsupportedError:
    return UnsupportedError(
        f"{reason}; farm only runs inference", node=node.name, op=node.op_type, domain=node.domain, opset=graph.opset
    )


# Pass-through ops: each returns the value the node's output 0 equals at inference.
_PASSTHROUGH: dict[str, Callable[[Graph, Node, dict[str, list[Node]], set[str]], str]] = {
    "Identity": _identity_source,
    "Dropout": _dropout_source,
}


def drop_passthrough(graph: Graph) -> Graph:
    """Remove Identity and Dropout nodes, rewiring their consumers to the node's input.

    When the node's output is a model output, the upstream value is renamed to that output instead, so the
    model's interface keeps its names; if that is impossible (the upstream value is a model input, a constant or
    another output) the node stays as an Identity copy.
    """
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    pinned = set(graph.inputs) | set(graph.constants) | outputs
    kept: list[Node] = []
    for node in graph.nodes:
        source_of = _PASSTHROUGH.get(node.op_type) if not node.domain else None
        if source_of is None:
            kept.append(node)
            continue
        src, dst = source_of(graph, node, users, outputs), node.outputs[0]
        _remove_user(users, src, node)
        if dst not in outputs:
            _rewire(graph, users, dst, src)
        elif src not in pinned and src in producers:
            _rename_produced(graph, users, producers, src, dst)
        else:
            users.setdefault(src, []).append(node)
            kept.append(Node(node.name, "Identity", [src], [dst]))
    graph.nodes = kept
    return graph


def _remove_user(users: dict[str, list[Node]], name: str, node: Node) -> None:
    readers = [user for user in users.get(name, []) if user is not node]
    if readers:
        users[name] = readers
    else:
        users.pop(name, None)


def _rewire(graph: Graph, users: dict[str, list[Node]], old: str, new: str) -> None:
    """Make every reader of `old` read `new` instead."""
    readers = users.pop(old, [])
    for reader in readers:
        reader.inputs = [new if name == old else name for name in reader.inputs]
    users.setdefault(new, []).extend(readers)


def _rename_produced(
    graph: Graph, users: dict[str, list[Node]], producers: dict[str, Node], old: str, new: str
) -> None:
    """Rename the produced value `old` to `new` everywhere: its producer now writes `new` directly."""
    producer = producers.pop(old)
    producer.outputs = [new if name == old else name for name in producer.outputs]
    producers[new] = producer
    _rewire(graph, users, old, new)
    _move_value_info(graph, old, new)


def _move_value_info(graph: Graph, old: str, new: str) -> None:
    """Carry old's shape info over to new, the name that now holds the same data."""
    if old in graph.values:
        graph.values.setdefault(new, graph.values.pop(old))
    if old in graph.dynamic_shapes:
        graph.dynamic_shapes.setdefault(new, graph.dynamic_shapes.pop(old))
