"""What several graph passes share to rewrite a Graph in place: fresh names for rewritten weights, pruning what
no node reads any more, and the sweep that folds a node into the Conv that alone feeds it."""

from __future__ import annotations

from collections.abc import Callable

from farm.ir.graph import Graph, Node


def all_names(graph: Graph) -> set[str]:
    """Every value name the graph uses: what a new value's name must differ from (unique_name)."""
    names = set(graph.inputs) | set(graph.outputs) | set(graph.values) | set(graph.constants)
    for node in graph.nodes:
        names.update(node.inputs)
        names.update(node.outputs)
    return names


def constant_weight(graph: Graph, conv: Node) -> bool:
    """Whether the Conv's weight is a constant, and its bias (when given) too: what folding into it needs. A weight
    left empty ('') is not one: validation refuses that Conv, after the passes, naming the node."""
    if len(conv.inputs) < 2 or not conv.inputs[1]:
        return False
    return all(name in graph.constants for name in conv.inputs[1:3] if name)


def unique_name(taken: set[str], base: str) -> str:
    """A value name not in `taken` (which is updated), so a rewritten weight never overwrites a shared one."""
    name, suffix = base, 1
    while name in taken:
        name, suffix = f"{base}_{suffix}", suffix + 1
    taken.add(name)
    return name


def prune_unreferenced(graph: Graph) -> Graph:
    """Drop constants and value infos that no node, input or output refers to any more (frees folded weights)."""
    used = set(graph.inputs) | set(graph.outputs)
    for node in graph.nodes:
        used.update(node.inputs)
        used.update(node.outputs)
    for name in [name for name in graph.constants if name not in used]:
        del graph.constants[name]
    graph.values = {name: info for name, info in graph.values.items() if name in used}
    graph.dynamic_shapes = {name: dims for name, dims in graph.dynamic_shapes.items() if name in used}
    return graph


FoldOne = Callable[[Graph, Node, dict[str, list[Node]], dict[str, Node], set[str], set[str]], Node | None]


def fold_into_convs(graph: Graph, fold_one: FoldOne) -> Graph:
    """One sweep in graph order: fold_one(graph, node, users, producers, outputs, taken) folds `node` into the
    Conv that alone feeds it (the Conv then writes node's output) and returns that Conv, or returns None. The
    maps are kept current, so a chain folds in one sweep."""
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    taken = all_names(graph)
    folded: set[int] = set()
    for node in graph.nodes:
        data = next((name for name in node.inputs if name in producers), None)
        conv = fold_one(graph, node, users, producers, outputs, taken)
        if conv is not None:
            if data is not None:
                users.pop(data, None)
            producers[node.outputs[0]] = conv
            folded.add(id(node))
    graph.nodes = [node for node in graph.nodes if id(node) not in folded]
    return prune_unreferenced(graph) if folded else graph
