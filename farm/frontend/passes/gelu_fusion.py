"""The graph pass that runs an exporter's spelled-out erf GELU as one Gelu node."""

from __future__ import annotations

import math

from farm.ir.graph import Graph, Node

SCALE_TOLERANCE = 1e-6
"""How far (relatively) a constant may be from 1/sqrt(2), sqrt(2), 1 or 0.5 and still be taken for it: float32
holds sqrt(2) as 1.4142135 (1.5e-8 off) and exporters write it rounded so."""


def fuse_gelus(graph: Graph) -> Graph:
    """Replace y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5) (torch's nn.GELU and transformers' gelu as
    exported; Mul by 1/sqrt 2 for the Div, and either operand order of each Add and Mul) by Gelu(x): one kernel
    instead of five, each a pass over an activation (bert_style: 20 nodes, 7% of a run on one thread). The Gelu
    computes 0.5 * x * (1 + erf(x / sqrt 2)) with the same erf (farm.ops.mathfns.erf). Only where every
    intermediate value has its single reader in the chain and is no model output."""
    users, producers, outputs = graph.consumers(), graph.producers(), set(graph.outputs)
    replaced: dict[int, Node] = {}
    dropped: set[int] = set()
    for node in graph.nodes:
        chain = _gelu_chain(graph, node, users, producers, outputs)
        if chain is not None:
            source, members = chain
            replaced[id(node)] = Node(node.name, "Gelu", [source], list(node.outputs), {})
            dropped.update(id(member) for member in members)
            for member in members:
                graph.values.pop(member.outputs[0], None)
    graph.nodes = [replaced.get(id(node), node) for node in graph.nodes if id(node) not in dropped]
    return graph


def _gelu_chain(
    graph: Graph, last: Node, users: dict[str, list[Node]], producers: dict[str, Node], outputs: set[str]
) -> tuple[str, list[Node]] | None:
    """(x, the chain's nodes before `last`) when `last` is the chain's final Mul by 0.5, else None."""
    product = _operand_beside(graph, last, "Mul", 0.5)
    times = _single_use_producer(product, "Mul", users, producers, outputs)
    if times is None or len(times.inputs) != 2:
        return None
    for x, added in (times.inputs, times.inputs[::-1]):
        add = _single_use_producer(added, "Add", users, producers, outputs)
        erf_out = _operand_beside(graph, add, "Add", 1.0) if add is not None else None
        erf = _single_use_producer(erf_out, "Erf", users, producers, outputs)
        scaled = _single_use_producer(erf.inputs[0] if erf else None, ("Div", "Mul"), users, producers, outputs)
        if add is None or erf is None or scaled is None or not _scales_by_root_half(graph, scaled, x):
            continue
        if graph.values.get(x) is None or graph.values[x].dtype != "float32":
            return None
        return x, [scaled, erf, add, times]
    return None


def _single_use_producer(
    value: str | None,
    ops: str | tuple[str, ...],
    users: dict[str, list[Node]],
    producers: dict[str, Node],
    outputs: set[str],
) -> Node | None:
    """The node of op `ops` (one, or one of several) producing `value`, when `value` has one reader and is no model
    output; else None."""
    if value is None:
        return None
    node = producers.get(value)
    wanted = (ops,) if isinstance(ops, str) else ops
    if node is None or node.op_type not in wanted or node.domain or node.activation or node.outputs != [value]:
        return None
    return node if value not in outputs and len(users.get(value, [])) == 1 else None


def _operand_beside(graph: Graph, node: Node | None, op: str, constant: float) -> str | None:
    """The other operand of `node` (of op `op`, two inputs) when one of them is a scalar constant equal to
    `constant`; else None."""
    if node is None or node.op_type != op or node.domain or node.activation or len(node.inputs) != 2:
        return None
    for value, other in (node.inputs, node.inputs[::-1]):
        if _is_scalar(graph, other, constant):
            return value
    return None


def _scales_by_root_half(graph: Graph, node: Node, x: str) -> bool:
    """Whether `node` is Div(x, sqrt 2) or Mul by 1/sqrt 2 (either order)."""
    if len(node.inputs) != 2:
        return False
    if node.op_type == "Div":
        return node.inputs[0] == x and _is_scalar(graph, node.inputs[1], math.sqrt(2.0))
    return _operand_beside(graph, node, "Mul", math.sqrt(0.5)) == x


def _is_scalar(graph: Graph, name: str, value: float) -> bool:
    """Whether `name` is a float32 constant of one element within SCALE_TOLERANCE of `value`."""
    if name not in graph.constants:
        return False
    info = graph.constants.info(name)  # before any read: a big weight beside a Mul stays unread
    if info.size != 1 or info.dtype != "float32":
        return False
    return math.isclose(float(graph.constants[name].reshape(-1)[0]), value, rel_tol=SCALE_TOLERANCE)
