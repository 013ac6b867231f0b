"""The graph pass that removes the nodes no model output depends on, with the constants and infos only they
used."""

from __future__ import annotations

from farm.frontend.passes.rewrite import prune_unreferenced
from farm.ir.graph import Graph, Node


def remove_dead_nodes(graph: Graph) -> Graph:
    """Remove nodes none of whose outputs reach a model output, then the constants and infos only they used."""
    live = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(name in live for name in node.outputs if name):
            kept.append(node)
            live.update(name for name in node.inputs if name)
    graph.nodes = kept[::-1]
    return prune_unreferenced(graph)
