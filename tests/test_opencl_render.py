"""The OpenCL C renderer on real OpenCL (PoCL): the same op lowerings as the LLVM path, numerics against onnxruntime.

A missing OpenCL platform fails these tests (it is an install step: pocl-opencl-icd), it never skips them.
"""

from __future__ import annotations

import numpy as np
import onnx
import pyopencl as cl
import pytest
from onnx import TensorProto, helper, numpy_helper

from farm.backends.opencl.render import LAUNCH_BODIES, LAUNCH_SHAPES, launches, render_opencl
from farm.build.assembly import plan_model
from farm.errors import BuildError
from farm.ir import launching
from farm.ir import loopir as L
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import LOWERINGS, lower_kernel


@pytest.fixture(scope="module")
def context():
    platforms = cl.get_platforms()
    assert platforms, "no OpenCL platform: install pocl-opencl-icd (scripts/setup.sh does)"
    return cl.Context(platforms[0].get_devices()[:1])


def _model(op, inputs, initializers=(), opset=17, **attrs):
    node = helper.make_node(op, [n for n, _ in inputs] + [i.name for i in initializers], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _weight(name, *shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


CASES = {
    "relu": _model("Relu", [("x", [2, 3, 5])]),
    "sigmoid": _model("Sigmoid", [("x", [4, 7])]),
    "add_broadcast": _model("Add", [("x", [2, 3, 4]), ("z", [3, 1])]),
    "conv3x3": _model("Conv", [("x", [1, 4, 6, 6])], [_weight("w", 5, 4, 3, 3), _weight("b", 5)], pads=[1, 1, 1, 1]),
    "depthwise": _model("Conv", [("x", [1, 4, 6, 6])], [_weight("w", 4, 1, 3, 3)], group=4, strides=[2, 2]),
    "gemm": _model("Gemm", [("x", [3, 8])], [_weight("w", 6, 8), _weight("c", 6)], transB=1),
    "maxpool": _model("MaxPool", [("x", [1, 2, 7, 7])], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "softmax": _model("Softmax", [("x", [2, 9])]),
    "transpose": _model("Transpose", [("x", [2, 3, 4])], perm=[2, 0, 1]),
    "lrn": _model("LRN", [("x", [1, 6, 3, 3])], size=3),
}


def _run(context, spec, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Build the spec's kernel for the device and run it on `arrays` (its data inputs, in order)."""
    kernel = lower_kernel(spec)
    program = cl.Program(context, render_opencl("k", kernel)).build()
    queue = cl.CommandQueue(context)
    flags = cl.mem_flags
    outputs = [np.zeros(t.shape, np.float32) for t in spec.outputs]
    buffers = [cl.Buffer(context, flags.READ_WRITE, max(o.nbytes, 4)) for o in outputs]
    buffers += [
        cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)) for a in arrays
    ]
    scratch = LOWERINGS[spec.op].scratch_floats(spec)
    if scratch:
        buffers.append(cl.Buffer(context, flags.READ_WRITE, scratch * 4))
    for name, size in launches("k", kernel):
        getattr(program, name)(queue, size, None, *buffers)
    for output, buffer in zip(outputs, buffers):
        cl.enqueue_copy(queue, output, buffer)
    queue.finish()
    return outputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_match_onnxruntime_on_pocl(name, context, tmp_path):
    import onnxruntime

    path = tmp_path / f"{name}.onnx"
    onnx.save(CASES[name], path)
    plan = plan_model(path)
    feeds = {
        n: np.random.default_rng(1).standard_normal(plan.graph.values[n].shape).astype(np.float32)
        for n in plan.graph.inputs
    }
    (step,) = plan.steps
    arrays = [
        plan.blobs[a.name] if a.kind == "blob" else feeds[a.name]
        for a in step.args[1:]
        if not a.name.endswith("::scratch")
    ]
    (ours,) = _run(context, step.spec, arrays)
    (reference,) = onnxruntime.InferenceSession(str(path)).run(None, feeds)
    assert np.abs(ours - reference).max() <= 1e-4 * max(1.0, np.abs(reference).max())


@pytest.mark.parametrize("m, n", [(8, 16), (5, 12), (6, 7), (1, 1)])
def test_register_tiled_gemm_matches_numpy_with_offsets_and_leading_dimensions(context, m, n):
    k, lda, ldb, ldc, (a_at, b_at, c_at) = 9, 11, n + 3, n + 1, (3, 2, 1)
    rng = np.random.default_rng(m * n)
    a, b = (rng.standard_normal(size).astype(np.float32) for size in (a_at + m * lda, b_at + k * ldb))
    gemm = L.Gemm(
        "in0", L.const(a_at, L.I64), lda, "in1", L.const(b_at, L.I64), ldb, "out0", L.const(c_at, L.I64), ldc, m, n, k
    )
    kernel = L.LoopKernel([L.Param("out0", output=True), L.Param("in0"), L.Param("in1")], [gemm])
    program = cl.Program(context, render_opencl("k", kernel)).build()
    queue = cl.CommandQueue(context)
    flags = cl.mem_flags
    c = np.full(c_at + m * ldc, 7.0, np.float32)
    buffers = [cl.Buffer(context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=array) for array in (c, a, b)]
    for name, size in launches("k", kernel):
        getattr(program, name)(queue, size, None, *buffers)
    cl.enqueue_copy(queue, c, buffers[0])
    queue.finish()
    a_panel = a[a_at:].reshape(m, lda)[:, :k]
    b_panel = b[b_at:].reshape(k, ldb)[:, :n]
    written = c[c_at:].reshape(m, ldc)
    np.testing.assert_allclose(written[:, :n], a_panel @ b_panel, rtol=1e-5, atol=1e-5)
    assert (written[:, n:] == 7.0).all() and c[0] == 7.0


def test_parallel_loops_and_gemms_get_their_own_launches_and_the_rest_one_work_item():
    x, b = L.Var("i"), L.Var("b")
    store = L.Store("out0", x, L.const(1.0))
    parallel = L.LoopKernel([L.Param("out0", output=True)], [L.Loop(x, 10, [store], True)])
    serial = L.LoopKernel([L.Param("out0", output=True)], [L.Loop(x, 10, [store]), L.Loop(x, 3, [store])])
    gemm = L.Gemm("in0", L.const(0), 4, "in1", L.const(0), 5, "out0", L.const(0), 5, 3, 5, 4)
    batch_of_one = L.LoopKernel(
        [L.Param("out0", output=True), L.Param("in0"), L.Param("in1")],
        [L.Loop(b, 1, [gemm, L.Loop(x, 15, [store], True)])],
    )
    assert launches("k", parallel) == [("k_0", (10,))] and "get_global_id(0)" in render_opencl("k", parallel)
    assert launches("k", serial) == [("k_0", (1,))] and "get_global_id" not in render_opencl("k", serial)
    assert launches("k", batch_of_one) == [("k_0", (2, 1)), ("k_1", (15,))]
    assert "const long b = 0;" in render_opencl("k", batch_of_one)


def test_a_loop_over_an_empty_output_is_no_launch_and_no_function(context):
    """A Split with a zero-size part: a launch of 0 work-items is invalid OpenCL, so that part has none (and the
    source no __kernel for it); the launches left run on the device."""
    spec = KernelSpec(
        "Split",
        canonical_json({"axis": 1}),
        (TensorInfo((2, 5)),),
        (TensorInfo((2, 2)), TensorInfo((2, 0)), TensorInfo((2, 3))),
        None,
        "",
    )
    kernel = lower_kernel(spec)
    found = launches("k", kernel)
    assert [size for _, size in found] == [(2,), (2,)]
    source = render_opencl("k", kernel)
    assert source.count("__kernel") == 2
    program = cl.Program(context, source).build()
    queue = cl.CommandQueue(context)
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    buffers = [cl.Buffer(context, cl.mem_flags.READ_WRITE, size) for size in (16, 4, 24)]
    buffers.append(cl.Buffer(context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=x))
    for name, size in found:
        cl.Kernel(program, name)(queue, size, None, *buffers)
    first, last = np.empty((2, 2), np.float32), np.empty((2, 3), np.float32)
    cl.enqueue_copy(queue, first, buffers[0])
    cl.enqueue_copy(queue, last, buffers[2])
    np.testing.assert_array_equal(first, x[:, :2])
    np.testing.assert_array_equal(last, x[:, 2:])


def test_every_launch_kind_has_a_global_size_and_a_body():
    assert set(LAUNCH_SHAPES) == set(LAUNCH_BODIES) == set(launching.LaunchKind)


def test_float_constants_are_exact_and_special_values_spelled_out():
    from farm.backends.opencl.render import expr

    assert expr(L.const(0.1)) == f"({(0.1).hex()}f)"
    assert expr(L.const(float("inf"))) == "INFINITY" and expr(L.const(float("-inf"))) == "(-INFINITY)"
    assert expr(L.const(7)) == "7L"


def run_on_device(context, kernel: L.LoopKernel, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Render `kernel`, run its launches in order on `context`'s device over copies of `arrays`, read them back."""
    program = cl.Program(context, render_opencl("k", kernel)).build()
    queue = cl.CommandQueue(context)
    flags = cl.mem_flags
    buffers = [cl.Buffer(context, flags.READ_WRITE | flags.COPY_HOST_PTR, hostbuf=array) for array in arrays]
    for name, size in launches("k", kernel):
        getattr(program, name)(queue, size, None, *buffers)
    for array, buffer in zip(arrays, buffers):
        cl.enqueue_copy(queue, array, buffer)
    queue.finish()
    return arrays


def test_bool_and_int32_buffers_load_and_store_as_numpy_lays_them_out(context):
    from test_llvm_render import mask_and_narrow_arrays, mask_and_narrow_kernel

    arrays, expected = mask_and_narrow_arrays(37)
    for got, want in zip(run_on_device(context, mask_and_narrow_kernel(37), arrays), expected):
        np.testing.assert_array_equal(got, want)


def test_bit_operations_on_int64_and_narrow_buffers(context):
    """The loop IR's bit operations as the LLVM renderer's test runs them: a left shift of a negative value wraps
    (rendered through ulong), a right shift is arithmetic."""
    from test_llvm_render import bit_operations_arrays, bit_operations_kernel

    arrays, expected = bit_operations_arrays(70)
    for got, want in zip(run_on_device(context, bit_operations_kernel(70), arrays), expected):
        np.testing.assert_array_equal(got, want)


def test_bfloat16_buffers_round_to_nearest_even_and_widen_exactly(context):
    """As on the CPU: ushort buffers, bit manipulation through as_uint and as_float, a double rounded once."""
    from test_llvm_render import assert_same_bits, bfloat16_arrays, bfloat16_kernel

    arrays, expected = bfloat16_arrays(1001)
    for got, want in zip(run_on_device(context, bfloat16_kernel(1001), arrays), expected):
        assert_same_bits(got, want)


def test_an_implicit_gemm_is_refused_rather_than_read_as_a_matrix():
    window = L.ImplicitColumns(4, 8, 1, 64, 3, 3, 8, 1)
    gemm = L.Gemm("a", L.const(0), 0, "b", L.const(0), 9, "c", L.const(0), 16, 16, 4, 9, a_window=window)
    kernel = L.LoopKernel([L.Param("c", output=True), L.Param("a"), L.Param("b")], [gemm])
    with pytest.raises(BuildError, match="implicit GEMM"):
        render_opencl("k", kernel)
