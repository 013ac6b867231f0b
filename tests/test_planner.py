"""The planner (farm/plan/planner.py): shared kernels for identical layers, deduplicated blobs, scratch buffers."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from farm.build.assembly import plan_model


def conv_chain(tmp_path, layers: int = 4, same_weights: bool = False):
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
    plan = conv_chain(tmp_path, layers=4)
    assert len(plan.steps) == 4
    assert len(plan.kernels()) == 1
    assert len(plan.blobs) == 4


def test_equal_weights_share_one_blob(tmp_path):
    assert len(conv_chain(tmp_path, layers=3, same_weights=True).blobs) == 1


def test_scratch_buffer_for_im2col(tmp_path):
    plan = conv_chain(tmp_path, layers=1)
    scratch = [arg.name for arg in plan.steps[0].args if arg.name.endswith("::scratch")]
    assert scratch and plan.memory.sizes[scratch[0]] >= 8 * 9 * 16 * 16 * 4

