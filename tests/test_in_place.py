"""Copies in place (farm/plan/in_place.py): a Concat's inputs placed in their slices of its output, a reshape's output
on its input, the CPU kernel copying nothing, the OpenCL one copying as before, and every case that must keep its
copy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import OpCase, assert_matches_onnxruntime, check_case_on_opencl
from onnx import TensorProto, helper, numpy_helper

from farm.backends.llvm.target import host_target
from farm.build.assembly import plan_model
from farm.ir.graph import Graph, TensorInfo
from farm.ir.launching import work
from farm.ops.registry import lower_kernel
from farm.plan.in_place import RESHAPES
from farm.plan.memory import plan_memory

OPSET = [helper.make_opsetid("", 17)]


class _Model:
    """A float32 model built node by node: convs with random weights (seeded), any other node as given."""

    def __init__(self, channels: int = 16, size: int = 12, batch: int = 1) -> None:
        self.rng = np.random.default_rng(0)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, size, size])

    def conv(self, source: str, cin: int, cout: int, name: str, k: int = 1, relu: bool = True) -> str:
        weight = self.rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.2
        self.inits += [numpy_helper.from_array(weight, f"{name}_w")]
        out = f"{name}_c" if relu else name
        self.nodes.append(helper.make_node("Conv", [source, f"{name}_w"], [out], pads=[k // 2] * 4, name=name))
        if relu:
            self.nodes.append(helper.make_node("Relu", [out], [name]))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=output, **attrs))
        return output

    def save(self, path: Path, outputs: Sequence[str]) -> Path:
        graph = helper.make_graph(
            self.nodes,
            "concats",
            [self.x],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
            self.inits,
        )
        onnx.save(helper.make_model(graph, opset_imports=OPSET, ir_version=8), path)
        return path


def dense_block(path: Path) -> Path:
    """A fire module (two convs of one squeeze joined), then DenseNet's nesting (each Concat an input of the next),
    then a Concat of the block with a branch that reads a fire input again after its Concat."""
    m = _Model()
    squeeze = m.conv("x", 16, 16, "squeeze")
    fire = m.node("Concat", [m.conv(squeeze, 16, 32, "e1"), m.conv(squeeze, 16, 32, "e3", k=3)], "fire", axis=1)
    block = m.node("Concat", [fire, m.conv(fire, 64, 16, "d1", k=3)], "block1", axis=1)
    block = m.node("Concat", [block, m.conv(block, 80, 16, "d2", k=3)], "block2", axis=1)
    late = m.conv("e1", 32, 16, "late")
    m.node("Concat", [block, late], "joined", axis=1)
    m.node("Add", ["joined", "joined"], "y")
    return m.save(path, ["y"])


def _in_place(path: Path) -> dict[str, bool]:
    return {
        step.node: bool(step.spec.attrs.get("in_place")) for step in plan_model(path).steps if step.spec.op == "Concat"
    }


def _inside(memory, name: str) -> list[str]:
    """The buffers `name` lies inside, innermost first."""
    chain = []
    while name in memory.aliases:
        name = memory.aliases[name][0]
        chain.append(name)
    return chain


def assert_live_buffers_share_bytes_only_inside_one_another(plan) -> None:
    """Two buffers live at one step overlap only where one lies inside the other (a slice in its output)."""
    memory, steps = plan.memory, plan.steps
    spans: dict[str, list[int]] = {name: [-1, -1] for name in plan.graph.inputs}
    for index, step in enumerate(steps):
        for arg in step.args:
            if arg.kind == "arena":
                spans.setdefault(arg.name, [index, index])[1] = index
    for name in plan.graph.outputs:
        spans[name][1] = len(steps)
    names = sorted(spans)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            together = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            ra, rb = (memory.offsets[n] for n in (a, b))
            overlap = ra < rb + memory.sizes[b] and rb < ra + memory.sizes[a]
            if together and overlap:
                assert a in _inside(memory, b) or b in _inside(memory, a), (a, b)


def test_a_dense_block_places_every_input_in_its_concats_output(tmp_path: Path) -> None:
    """Each Concat runs in place; every input lies at its slice (nested Concats inside the outermost); buffers live
    together never share bytes otherwise (the block's bytes are held while any slice is still to be read: `late`
    reads e1 after the fire Concat)."""
    path = dense_block(tmp_path / "m.onnx")
    plan = plan_model(path)
    assert _in_place(path) == dict.fromkeys(["fire", "block1", "block2", "joined"], True)
    offsets, plane = plan.memory.offsets, 12 * 12 * 4
    expected = {"fire": 0, "block1": 0, "block2": 0, "e1": 0, "e3": 32 * plane, "d1": 64 * plane}
    expected |= {"d2": 80 * plane, "late": 96 * plane}
    assert {name: offsets[name] - offsets["joined"] for name in expected} == expected
    assert _inside(plan.memory, "e1") == ["fire", "block1", "block2", "joined"]
    assert_live_buffers_share_bytes_only_inside_one_another(plan)


def test_a_dense_block_matches_onnxruntime_on_a_cpu(tmp_path: Path) -> None:
    model = onnx.load(dense_block(tmp_path / "m.onnx"))
    assert_matches_onnxruntime(model, tmp_path, name="dense")


def test_a_dense_block_matches_onnxruntime_on_opencl(tmp_path: Path, fingerprint: str) -> None:
    """OpenCL keeps a buffer per value: its Concat kernels copy."""
    model = onnx.load(dense_block(tmp_path / "m.onnx"))
    check_case_on_opencl(OpCase("dense", model), fingerprint, tmp_path)


def test_the_cpu_kernel_of_a_concat_in_place_copies_nothing_and_the_opencl_one_copies(tmp_path: Path) -> None:
    plan = plan_model(dense_block(tmp_path / "m.onnx"))
    spec = next(step.spec for step in plan.steps if step.spec.op == "Concat")
    assert lower_kernel(plan.kernel_for(spec, host_target().id)).body == []
    assert work(lower_kernel(spec).body) > 0  # no CPU target: as OpenCL renders it


@pytest.mark.parametrize(
    "build, expected",
    [
        # a model input joined: the caller's feed has its own slot
        (lambda m: m.node("Concat", ["x", m.conv("x", 16, 16, "a")], "y", axis=1), False),
        # one value twice
        (lambda m: m.node("Concat", [m.conv("x", 16, 16, "a"), "a"], "y", axis=1), False),
        # a model output joined: its slot is the caller's
        (lambda m: m.node("Concat", [m.conv("x", 16, 16, "a"), m.conv("x", 16, 16, "y2")], "y", axis=1), False),
        # joined along the last axis: the inputs are no contiguous slices
        (lambda m: m.node("Concat", [m.conv("x", 16, 16, "a"), m.conv("x", 16, 16, "b")], "y", axis=3), False),
        # the joined output is the model's: still in place
        (lambda m: m.node("Concat", [m.conv("x", 16, 16, "a"), m.conv("x", 16, 16, "b")], "y", axis=1), True),
    ],
    ids=["model-input", "twice", "model-output-joined", "last-axis", "output-is-model-output"],
)
def test_which_concats_run_in_place(tmp_path: Path, build, expected: bool) -> None:
    m = _Model()
    build(m)
    outputs = ["y", "y2"] if any("y2" in node.output for node in m.nodes) else ["y"]
    path = m.save(tmp_path / "m.onnx", outputs)
    assert _in_place(path) == {"y": expected}
    assert_live_buffers_share_bytes_only_inside_one_another(plan_model(path))
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="case")


def test_a_batch_of_two_keeps_its_copy(tmp_path: Path) -> None:
    """Joined along channels with two images: each input is two runs of the output, not one slice."""
    m = _Model(batch=2)
    m.node("Concat", [m.conv("x", 16, 16, "a"), m.conv("x", 16, 16, "b")], "y", axis=1)
    path = m.save(tmp_path / "m.onnx", ["y"])
    assert _in_place(path) == {"y": False}
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="batch")


def test_an_input_of_two_concats_is_placed_in_the_first_only(tmp_path: Path) -> None:
    m = _Model()
    a, b = m.conv("x", 16, 16, "a"), m.conv("x", 16, 16, "b")
    m.node("Concat", [a, b], "first", axis=1)
    m.node("Concat", [b, m.conv("x", 16, 16, "c")], "second", axis=1)
    m.node("Add", ["first", "second"], "y")
    path = m.save(tmp_path / "m.onnx", ["y"])
    assert _in_place(path) == {"first": True, "second": False}
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="two")


def test_a_slice_off_a_cache_line_keeps_the_copy(tmp_path: Path) -> None:
    """3 channels of 5x5 floats end 300 bytes in: the next input would start off an ALIGNMENT boundary."""
    m = _Model(channels=3, size=5)
    m.node("Concat", [m.conv("x", 3, 3, "a"), m.conv("x", 3, 3, "b")], "y", axis=1)
    path = m.save(tmp_path / "m.onnx", ["y"])
    assert _in_place(path) == {"y": False}


@pytest.mark.parametrize("residual", ["joined", "a"])
def test_a_residual_written_over_by_a_conv_is_never_a_slice(tmp_path: Path, residual: str) -> None:
    """Conv(x) + r, where r dies there, writes over r's buffer (planner._residuals_in_place): a Concat whose output
    or input is such an r keeps its copy, since the conv changes those bytes while the others are live."""
    m = _Model()
    a, b = m.conv("x", 16, 16, "a"), m.conv("x", 16, 16, "b")
    m.node("Concat", [a, b], "joined", axis=1)
    channels = 32 if residual == "joined" else 16
    summed = m.node("Add", [m.conv("x", 16, channels, "c", k=3, relu=False), residual], "summed")
    total = m.node("ReduceSum", [m.node("Mul", [summed, summed], "squares")], "total", keepdims=1)
    if residual == "a":  # the Concat's output is read after the conv wrote over `a`
        total = m.node("Add", [total, m.node("ReduceSum", ["joined"], "joined_total", keepdims=1)], "both")
    m.node("Relu", [total], "y")
    path = m.save(tmp_path / "m.onnx", ["y"])
    steps = plan_model(path).steps
    assert [step.spec.attrs.get("residual") for step in steps if step.node == "c"] == ["in_place"]
    assert _in_place(path) == {"joined": False}
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="residual")


def test_plan_memory_places_a_slice_of_a_slice_inside_the_outermost() -> None:
    infos = {name: TensorInfo((16,)) for name in ("x", "a", "b", "y")}
    infos["inner"], infos["outer"] = TensorInfo((32,)), TensorInfo((48,))
    graph = Graph("g", 17, ["x"], ["y"], infos, {}, [])

    def step(*names: str):
        from types import SimpleNamespace

        return SimpleNamespace(spec=None, args=[SimpleNamespace(kind="arena", name=n) for n in names])

    steps = [step("a", "x"), step("b", "x"), step("inner", "a", "b"), step("outer", "inner", "x"), step("y", "a")]
    aliases = {"a": ("inner", 0), "b": ("inner", 64), "inner": ("outer", 64)}
    memory = plan_memory(graph, steps, aliases)
    outer = memory.offsets["outer"]
    assert [memory.offsets[n] - outer for n in ("inner", "a", "b")] == [64, 64, 128]
    assert memory.aliases == aliases
    y = (memory.offsets["y"], memory.offsets["y"] + memory.sizes["y"])
    assert y[1] <= outer or y[0] >= outer + memory.sizes["outer"]  # `a` is read at y's step: outer is still held


def _reshapes_in_place(path: Path) -> dict[str, bool]:
    plan = plan_model(path)
    return {step.node: bool(step.spec.attrs.get("in_place")) for step in plan.steps if step.spec.op in RESHAPES}


def attention_heads(path: Path, output_is_reshape: bool = False) -> Path:
    """A conv's output reshaped into heads, transposed, and back: Reshape -> Transpose -> Reshape -> Flatten
    (a chain on the Transpose's output), then a Reshape of the model input beside it."""
    m = _Model()
    shape = lambda name, dims: m.inits.append(numpy_helper.from_array(np.array(dims, np.int64), name)) or name  # noqa: E731
    heads = m.node("Reshape", [m.conv("x", 16, 16, "proj"), shape("s1", [1, 4, 4, 144])], "heads")
    turned = m.node("Transpose", [heads], "turned", perm=[0, 2, 1, 3])
    merged = m.node("Reshape", [turned, shape("s2", [1, 16, 12, 12])], "merged")
    flat = m.node("Flatten", [merged], "flat", axis=1)
    raw = m.node("Reshape", ["x", shape("s3", [1, 2304])], "raw")
    if output_is_reshape:
        m.node("Reshape", [m.node("Add", [flat, raw], "sum"), shape("s4", [1, 16, 144])], "y")
    else:
        m.node("Relu", [m.node("Add", [flat, raw], "sum")], "y")
    return m.save(path, ["y"])


def test_a_reshapes_output_lies_on_its_input(tmp_path: Path, fingerprint: str) -> None:
    """Every reshape runs in place: a chain (merged -> flat) on its first input, a model input's reshape on the
    model input's slot; the outputs match onnxruntime on a CPU and on OpenCL, which copies."""
    path = attention_heads(tmp_path / "m.onnx")
    assert _reshapes_in_place(path) == dict.fromkeys(["heads", "merged", "flat", "raw"], True)
    plan = plan_model(path)
    offsets = plan.memory.offsets
    assert offsets["heads"] == offsets["proj"] and offsets["flat"] == offsets["merged"] == offsets["turned"]
    assert offsets["raw"] == offsets["x"] and _inside(plan.memory, "flat") == ["merged", "turned"]
    assert_live_buffers_share_bytes_only_inside_one_another(plan)
    model = onnx.load(path)
    assert_matches_onnxruntime(model, tmp_path, name="heads")
    (tmp_path / "opencl").mkdir()
    check_case_on_opencl(OpCase("heads", model), fingerprint, tmp_path / "opencl")


def test_kernels_read_a_model_input_and_a_reshape_on_it_through_its_pointer_slot(tmp_path: Path) -> None:
    """In the entry's schedule, the conv reading the model input and the Add reading its reshape (placed on the
    input's bytes) take ["input", offset, the input's pointer slot, offset inside]: a feed is read in place."""
    from farm.backends.llvm.part import schedule_for
    from farm.backends.llvm.target import host_target

    plan = plan_model(attention_heads(tmp_path / "m.onnx"))
    calls = dict(zip((step.node for step in plan.steps), schedule_for(plan, host_target())))
    memory = plan.memory
    fed = ["input", memory.offsets["x"], memory.pointers["x"], 0]
    assert fed in calls["proj"]["args"] and fed in calls["sum"]["args"]
    assert all(arg[0] != "input" for arg in calls["merged"]["args"])


def test_a_reshape_into_the_model_output_keeps_its_copy(tmp_path: Path) -> None:
    path = attention_heads(tmp_path / "m.onnx", output_is_reshape=True)
    assert _reshapes_in_place(path)["y"] is False
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="out")


def test_a_reshape_joined_by_a_concat_keeps_its_copy(tmp_path: Path) -> None:
    """The Concat places the reshape's output in its own output first: that output can't also lie on the input."""
    m = _Model()
    shape = numpy_helper.from_array(np.array([1, 16, 12, 12], np.int64), "s")
    m.inits.append(shape)
    reshaped = m.node("Reshape", [m.conv("x", 16, 16, "a"), "s"], "reshaped")
    m.node("Relu", [m.node("Concat", [reshaped, m.conv("x", 16, 16, "b")], "joined", axis=1)], "y")
    path = m.save(tmp_path / "m.onnx", ["y"])
    assert _reshapes_in_place(path) == {"reshaped": False} and _in_place(path) == {"joined": True}
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="joined")


def test_a_reshape_of_a_residual_written_over_keeps_its_copy(tmp_path: Path) -> None:
    """r is reshaped, then dies at the conv that adds it (which writes over r's buffer), and the reshape's output is
    read after that conv: it must not lie on r."""
    m = _Model()
    m.inits.append(numpy_helper.from_array(np.array([1, 16, 12, 12], np.int64), "s"))
    r = m.conv("x", 16, 16, "r")
    reshaped = m.node("Reshape", [r, "s"], "reshaped")
    summed = m.node("Add", [m.conv("x", 16, 16, "c", k=3, relu=False), r], "summed")
    m.node("Mul", [summed, reshaped], "y")
    path = m.save(tmp_path / "m.onnx", ["y"])
    assert [s.spec.attrs.get("residual") for s in plan_model(path).steps if s.node == "c"] == ["in_place"]
    assert _reshapes_in_place(path) == {"reshaped": False}
    assert_matches_onnxruntime(onnx.load(path), tmp_path, name="residual")
