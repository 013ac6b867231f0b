"""The planner: shared kernels for identical layers, deduplicated blobs, a memory plan that is safe and reuses."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.build.assembly import plan_model
from farm.plan.planner import ALIGNMENT, _first_gap, plan_memory


def _conv_chain(tmp_path, layers: int = 4, same_weights: bool = False):
    """x -> (Conv 3x3 + Relu) * layers, every layer the same shape."""
    rng = np.random.default_rng(0)
    shared = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        weight = shared if same_weights else rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes += [helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)], initializer=inits)
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return plan_model(path)


def test_identical_layers_share_one_kernel(tmp_path):
    plan = _conv_chain(tmp_path, layers=4)
    assert len(plan.steps) == 4
    assert len(plan.kernels()) == 1
    assert len(plan.blobs) == 4


def test_equal_weights_share_one_blob(tmp_path):
    assert len(_conv_chain(tmp_path, layers=3, same_weights=True).blobs) == 1


def test_scratch_buffer_for_im2col(tmp_path):
    plan = _conv_chain(tmp_path, layers=1)
    scratch = [arg.name for arg in plan.steps[0].args if arg.name.endswith("::scratch")]
    assert scratch and plan.memory.sizes[scratch[0]] >= 8 * 9 * 16 * 16 * 4


def _ranges_overlap(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_memory_plan_never_overlaps_live_buffers_and_reuses_dead_ones(tmp_path):
    plan = _conv_chain(tmp_path, layers=6)
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
        for b in names[i + 1:]:
            live_together = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            if live_together:
                ra = (memory.offsets[a], memory.offsets[a] + memory.sizes[a])
                rb = (memory.offsets[b], memory.offsets[b] + memory.sizes[b])
                assert not _ranges_overlap(ra, rb), (a, b)
    assert memory.arena_bytes < sum(memory.sizes.values())


def test_memory_plan_json_lists_every_buffer(tmp_path):
    plan = _conv_chain(tmp_path, layers=2)
    data = plan.memory.to_json()
    assert data["alignment"] == ALIGNMENT and data["arena_bytes"] == plan.memory.arena_bytes
    assert {b["name"] for b in data["buffers"]} == set(plan.memory.offsets)


@pytest.mark.parametrize("busy, size, expected", [([], 64, 0), ([(0, 64)], 64, 64), ([(64, 64)], 64, 0),
                                                  ([(0, 64), (192, 64)], 128, 64), ([(0, 64), (128, 64)], 128, 192)])
def test_first_gap(busy, size, expected):
    assert _first_gap(busy, size) == expected


def test_plan_memory_is_deterministic(tmp_path):
    plan = _conv_chain(tmp_path, layers=3)
    again = plan_memory(plan.graph, plan.steps)
    assert again.offsets == plan.memory.offsets and again.arena_bytes == plan.memory.arena_bytes
