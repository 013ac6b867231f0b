"""Seeded mutants of the example models, for fuzzing farm's handling of hostile ONNX files.

tests/test_fuzz.py plans a few hundred of them in one process; benchmarks/bench_fuzz.py puts thousands through the
real `farm submit` and `farm run`, one limited child process each. Both draw them from `mutants`, so a seed names
the same models in both. Each mutant is one of five kinds, in turn: byte flips outside the weights (names, shapes,
attributes, field tags), a truncation, an attribute replaced by a hostile value, a hostile graph input or output
dim, and a structural change (a rewired input, a dropped node, an output nothing defines).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import onnx
from onnx import helper

KINDS = ("byte-flip", "truncation", "attribute", "shape", "structure")


def _structure_bytes(model: onnx.ModelProto, data: bytes) -> list[int]:
    """Offsets of `data` outside the initializers' raw bytes, where a flip hits names, shapes, attributes and
    field tags (flips in weights only change numbers)."""
    weights = bytearray(len(data))
    for tensor in model.graph.initializer:
        start = data.find(tensor.raw_data) if tensor.raw_data else -1
        if start >= 0:
            weights[start : start + len(tensor.raw_data)] = b"\x01" * len(tensor.raw_data)
    return [offset for offset, in_weight in enumerate(weights) if not in_weight]


def _byte_flips(model: onnx.ModelProto, rng: random.Random) -> bytes:
    data = model.SerializeToString()
    offsets = _structure_bytes(model, data)
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        mutated[rng.choice(offsets)] ^= 1 << rng.randrange(8)
    return bytes(mutated)


def _truncation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    data = model.SerializeToString()
    return data[: rng.randrange(len(data))]


# Values an attribute is replaced with: wrong types, zero, negative and huge numbers.
_HOSTILE_ATTRIBUTES = [0, -1, 2**40, -(2**40), 1.5, "x", [0], [-1, -1], [2**31, 1], [1.0, 2.0], b"\xff"]


def _attribute_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    nodes = [node for node in model.graph.node if node.attribute]
    node = rng.choice(nodes)
    attribute = rng.choice(list(node.attribute))
    replacement = helper.make_attribute(attribute.name, rng.choice(_HOSTILE_ATTRIBUTES))
    attribute.CopyFrom(replacement)
    return model.SerializeToString()


_HOSTILE_DIMS = [0, -1, 1, 2, 7, 2**20, 2**31, 2**32, 2**40]


def _shape_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    infos = [vi for vi in (*model.graph.input, *model.graph.output) if vi.type.tensor_type.shape.dim]
    dims = rng.choice(infos).type.tensor_type.shape.dim
    dims[rng.randrange(len(dims))].dim_value = rng.choice(_HOSTILE_DIMS)
    return model.SerializeToString()


def _structure_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    """Rewire an input, drop a node, or rename an output to one nothing defines."""
    choice = rng.randrange(3)
    node = rng.choice(list(model.graph.node))
    if choice == 0 and node.input:
        names = [vi.name for vi in model.graph.input] + [out for n in model.graph.node for out in n.output] + [""]
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif choice == 1:
        model.graph.node.remove(node)
    else:
        model.graph.output[0].name = "undefined"
    return model.SerializeToString()


# How each kind turns a (private copy of a) base model into the mutant's bytes.
MUTATIONS: dict[str, Callable[[onnx.ModelProto, random.Random], bytes]] = {
    "byte-flip": _byte_flips,
    "truncation": _truncation,
    "attribute": _attribute_mutation,
    "shape": _shape_mutation,
    "structure": _structure_mutation,
}


def base_models() -> list[onnx.ModelProto]:
    """The models mutated: small enough that a build of an unharmed one takes a second or two."""
    from farm.tools import examples

    return [examples.tiny_cnn(), examples.mlp(), examples.small_cnn(image=16)]


def mutants(rng: random.Random, count: int) -> Iterator[tuple[str, bytes]]:
    """`count` (kind, model bytes) pairs; the kinds take turns, the base model and the mutation come from `rng`."""
    bases = base_models()
    for index in range(count):
        base = rng.choice(bases)
        kind = KINDS[index % len(KINDS)]
        model = onnx.ModelProto()
        model.CopyFrom(base)
        yield kind, MUTATIONS[kind](model, rng)
