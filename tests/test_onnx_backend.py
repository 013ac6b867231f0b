"""farm.tools.onnx_backend: farm behind ONNX's Backend interface, driven by ONNX's own test runner too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.backend.test import BackendTest

from farm.errors import RunInputError, UnsupportedError
from farm.tools import onnx_backend
from farm.tools.onnx_backend import FarmBackend

# ONNX's runner (onnx.backend.test.BackendTest) loads these cases' files and checks farm's outputs itself.
RUNNER_CASES = [
    "test_relu_cpu",
    "test_add_bcast_cpu",
    "test_softmax_axis_1_cpu",
    "test_conv_with_strides_padding_cpu",
    "test_maxpool_2d_pads_cpu",
    "test_transpose_default_cpu",
]


def _add_model(opset: int = 17) -> onnx.ModelProto:
    node = helper.make_node("Add", ["a", "b"], ["y"])
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("a", "b", "y")]
    graph = helper.make_graph([node], "add", values[:2], values[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


@pytest.fixture(scope="module")
def runner_test_class() -> type:
    return BackendTest(FarmBackend, __name__).test_cases["OnnxBackendNodeModelTest"]


@pytest.mark.parametrize("name", RUNNER_CASES)
def test_onnxs_test_runner_drives_farm(runner_test_class: type, name: str) -> None:
    getattr(runner_test_class(name), name)()


@pytest.mark.parametrize("device", ["CPU", "OPENCL"])
def test_run_model_takes_inputs_in_order_or_by_name(device: str) -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    (by_order,) = FarmBackend.run_model(_add_model(), [a, b], device)
    (by_name,) = onnx_backend.prepare(_add_model(), device).run({"b": b, "a": a})
    np.testing.assert_array_equal(by_order, a + b)
    np.testing.assert_array_equal(by_name, a + b)


def test_devices() -> None:
    assert FarmBackend.supports_device("CPU") and FarmBackend.supports_device("OPENCL")
    assert not FarmBackend.supports_device("CUDA")
    with pytest.raises(ValueError, match="CPU or OPENCL, not 'CUDA:0'"):
        FarmBackend.prepare(_add_model(), "CUDA:0")


def test_wrong_input_count_names_the_inputs() -> None:
    with pytest.raises(RunInputError, match=r"takes 2 inputs \(a, b\), got 1"):
        FarmBackend.run_model(_add_model(), [np.zeros((2, 3), np.float32)])


def test_a_model_farm_cannot_build_raises_the_spines_error() -> None:
    with pytest.raises(UnsupportedError, match="opset 5"):  # Add changed at opset 6
        FarmBackend.prepare(_add_model(opset=5))
