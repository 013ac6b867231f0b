"""The static memory plan (farm/plan/memory.py): safe (live buffers never overlap), reusing, aligned, deterministic."""

from types import SimpleNamespace

import pytest

from farm.ir.graph import Graph, TensorInfo
from farm.plan.memory import ALIGNMENT, INPUT_POINTERS, POINTER_BYTES, _first_gap, plan_memory
from tests.test_planner import conv_chain


def _ranges_overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_memory_plan_never_overlaps_live_buffers_and_reuses_dead_ones(tmp_path):
    plan = conv_chain(tmp_path, layers=6)
    memory = plan.memory
    spans = {}
    for index, step in enumerate(plan.steps):
        for arg in step.args:
            if arg.kind == "arena":
                spans.setdefault(arg.name, [index, index])[1] = index
    spans["x"][0] = -1
    spans[plan.graph.outputs[0]][1] = len(plan.steps)
    names = sorted(spans)
    for i, a in enumerate(names):
        assert memory.offsets[a] % ALIGNMENT == 0
        for b in names[i + 1 :]:
            live_together = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            if live_together:
                ra = (memory.offsets[a], memory.offsets[a] + memory.sizes[a])
                rb = (memory.offsets[b], memory.offsets[b] + memory.sizes[b])
                assert not _ranges_overlap(ra, rb), (a, b)
    assert memory.arena_bytes < sum(memory.sizes.values())


def test_the_inputs_pointer_slots_are_held_for_the_whole_run(tmp_path):
    """The model inputs' pointer slots (8 bytes each, in graph order) share their bytes with no other buffer: the
    runtime writes them before a run and every step may read them."""
    plan = conv_chain(tmp_path, layers=3)
    memory = plan.memory
    slots = memory.offsets[INPUT_POINTERS]
    assert memory.pointers == {"x": slots} and memory.sizes[INPUT_POINTERS] == ALIGNMENT >= POINTER_BYTES
    for name, offset in memory.offsets.items():
        if name != INPUT_POINTERS:
            assert not _ranges_overlap((slots, slots + POINTER_BYTES), (offset, offset + memory.sizes[name])), name
    assert memory.input_within("x") == ("x", 0) and memory.input_within(plan.graph.outputs[0]) is None


def test_an_input_that_is_also_an_output_has_no_pointer_slot(tmp_path):
    """A model output is read from its buffer after the run, so an input that is one is always copied there."""
    import onnx
    from onnx import TensorProto, helper

    from farm.build.assembly import plan_model

    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3]) for name in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", values[:1], [values[1], values[0]])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), tmp_path / "m.onnx")
    memory = plan_model(tmp_path / "m.onnx").memory
    assert memory.pointers == {} and memory.input_within("x") is None


def test_memory_plan_json_lists_every_buffer(tmp_path):
    plan = conv_chain(tmp_path, layers=2)
    data = plan.memory.to_json()
    assert data["alignment"] == ALIGNMENT and data["arena_bytes"] == plan.memory.arena_bytes
    assert {b["name"] for b in data["buffers"]} == set(plan.memory.offsets)


@pytest.mark.parametrize(
    "busy, size, expected",
    [
        ([], 64, 0),
        ([(0, 64)], 64, 64),
        ([(64, 64)], 64, 0),
        ([(0, 64), (192, 64)], 128, 64),
        ([(0, 64), (128, 64)], 128, 192),
    ],
)
def test_first_gap(busy, size, expected):
    assert _first_gap(busy, size) == expected


def test_plan_memory_is_deterministic(tmp_path):
    plan = conv_chain(tmp_path, layers=3)
    again = plan_memory(plan.graph, plan.steps)
    assert again.offsets == plan.memory.offsets and again.arena_bytes == plan.memory.arena_bytes


def test_an_empty_output_no_step_writes_gets_a_buffer_of_its_own():
    """A node that writes only empty tensors has no step (farm.plan.planner); its model output is still in the
    manifest, so it gets ALIGNMENT bytes, held from the end of the run like every output."""
    infos = {"x": TensorInfo((4,)), "y": TensorInfo((4,)), "z": TensorInfo((0, 4))}
    graph = Graph("g", 17, ["x"], ["y", "z"], infos, {}, [])
    step = SimpleNamespace(spec=None, args=[SimpleNamespace(kind="arena", name=n) for n in ("y", "x")])
    memory = plan_memory(graph, [step])
    assert memory.sizes["z"] == ALIGNMENT
    ranges = {name: (memory.offsets[name], memory.offsets[name] + memory.sizes[name]) for name in ("y", "z")}
    assert not _ranges_overlap(ranges["y"], ranges["z"])
