"""The graph IR's small helpers."""

from farm.ir.graph import Graph, Node, TensorInfo


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
