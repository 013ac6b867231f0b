"""The graph IR's small helpers."""

import hashlib

import numpy as np

from farm.ir.graph import Constants, DeferredArray, Graph, Node, TensorInfo


def test_tensor_info_sizes():
    info = TensorInfo((2, 3, 4))
    assert (info.size, info.nbytes) == (24, 96)
    assert TensorInfo((5,), "int64").nbytes == 40


def test_consumers_and_producers():
    a = Node("a", "Relu", ["x"], ["y"])
    b = Node("b", "Add", ["y", "y"], ["z"])
    graph = Graph("g", 17, ["x"], ["z"], {}, {}, [a, b])
    assert graph.producers() == {"y": a, "z": b}
    assert graph.consumers()["y"] == [b, b] and graph.consumers()["x"] == [a]


def test_tensor_info_sizes_do_not_wrap():
    """numpy's int64 product of (2**32, 2**32) is 0; a hostile shape must not look like an empty tensor."""
    info = TensorInfo((2**32, 2**32), "float32")
    assert info.size == 2**64 and info.nbytes == 2**66


def _deferred(reads: list[str], name: str, value: np.ndarray) -> DeferredArray:
    def load() -> np.ndarray:
        reads.append(name)
        return value

    return DeferredArray(value.shape, value.dtype, hashlib.sha256(value.tobytes()).hexdigest(), load)


def test_a_deferred_constant_is_read_only_when_its_values_are_asked_for_and_keeps_its_digest_while_unchanged():
    """Constants: membership, iteration, info and digest never read a deferred constant; its first value access
    does, once; its digest holds while it is the array it was read into, and goes when a pass replaces it."""
    reads: list[str] = []
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    constants = Constants({"b": np.zeros(4, np.float32)}, {"W": _deferred(reads, "W", weight)})
    assert "W" in constants and list(constants) == ["b", "W"] and len(constants) == 2
    assert constants.info("W") == TensorInfo((3, 4), "float32") and constants.deferred("W") is not None
    digest = hashlib.sha256(weight.tobytes()).hexdigest()
    assert constants.digest("W") == digest and constants.digest("b") is None and reads == []
    assert constants["W"] is weight and constants.get("W") is weight and reads == ["W"]
    assert constants.deferred("W") is None and constants.digest("W") == digest
    constants["W"] = weight * 2  # a pass rewrote it: its bytes are no longer the digest's
    assert constants.digest("W") is None


def test_a_graph_takes_a_dict_of_constants_and_knows_a_deferred_ones_digest_unread():
    reads: list[str] = []
    weight = np.ones((2, 2), np.float32)
    graph = Graph("g", 17, [], [], {}, {"c": weight}, [], known_digests={"c": (weight, "d" * 64)})
    assert isinstance(graph.constants, Constants) and graph.constant_digest("c") == "d" * 64
    graph.constants["c"] = weight.copy()
    assert graph.constant_digest("c") is None
    graph.constants = Constants({}, {"w": _deferred(reads, "w", weight)})
    assert graph.constant_digest("w") == hashlib.sha256(weight.tobytes()).hexdigest() and reads == []
    del graph.constants["w"]
    assert "w" not in graph.constants and reads == []
