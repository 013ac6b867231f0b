"""compile_cl_kernel on real OpenCL (PoCL): binaries that load and run right, errors that name kernel and device."""

from __future__ import annotations

import numpy as np
import pyopencl as cl
import pytest

from farm.backends.opencl.devices import opencl_devices
from farm.backends.opencl.kernel import (
    build_program,
    compile_cl_kernel,
    device_context,
    kernel_launches,
    kernel_source,
)
from farm.backends.opencl.render import launches
from farm.errors import BuildError
from farm.ir.graph import Activation, TensorInfo
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import lower_kernel


@pytest.fixture(scope="module")
def fingerprint() -> str:
    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    return devices[0]["fingerprint"]


def _relu_spec() -> KernelSpec:
    return KernelSpec(
        "Add",
        canonical_json({}),
        (TensorInfo((4, 8)), TensorInfo((8,))),
        (TensorInfo((4, 8)),),
        Activation("relu"),
        target_id="opencl",
    )


def test_a_binary_loads_and_computes_like_numpy(fingerprint):
    spec = _relu_spec()
    binary = compile_cl_kernel(spec, fingerprint)
    context, device = device_context(fingerprint)
    program = cl.Program(context, [device], [binary]).build()
    queue = cl.CommandQueue(context)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(8).astype(np.float32)
    flags = cl.mem_flags
    out = cl.Buffer(context, flags.WRITE_ONLY, x.nbytes)
    inputs = [cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=a) for a in (x, b)]
    for name, size in launches(spec.symbol, lower_kernel(spec)):
        getattr(program, name)(queue, size, None, out, *inputs)
    result = np.empty_like(x)
    cl.enqueue_copy(queue, result, out)
    np.testing.assert_allclose(result, np.maximum(x + b, 0), rtol=1e-6)


def test_source_names_the_kernel_symbol():
    spec = _relu_spec()
    assert f"__kernel void {spec.symbol}_0(" in kernel_source(spec)


def test_a_build_error_names_what_failed_and_the_device_and_carries_the_log(fingerprint):
    with pytest.raises(BuildError) as caught:
        build_program("__kernel void k() { no_such_function(); }", "kernel Broken farm_k_x", fingerprint)
    message = str(caught.value)
    assert "kernel Broken farm_k_x" in message and fingerprint in message and "no_such_function" in message


def test_an_unknown_fingerprint_is_a_build_error():
    with pytest.raises(BuildError, match="0000000000000000"):
        device_context("0000000000000000")


def test_kernels_over_odd_sized_bool_buffers_build(fingerprint):
    """The launches run once at build time on zeroed buffers: a 5-byte bool buffer must not break the fill."""
    info = TensorInfo((5,), "bool")
    spec = KernelSpec("Not", canonical_json({}), (info,), (info,), None, target_id="opencl")
    binary = compile_cl_kernel(spec, fingerprint)
    assert _run_binary(binary, spec, fingerprint, np.array([1, 0, 1, 1, 0], bool)).tolist() == [0, 1, 0, 0, 1]


def _run_binary(binary: bytes, spec: KernelSpec, fingerprint: str, data: np.ndarray) -> np.ndarray:
    """Load a program binary on its device and run the kernel's launches on `data`: the binary is this kernel."""
    context, device = device_context(fingerprint)
    program = cl.Program(context, [device], [binary]).build()
    queue = cl.CommandQueue(context)
    flags = cl.mem_flags
    source = cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=data)
    result = cl.Buffer(context, flags.READ_WRITE, data.nbytes)
    for name, size in kernel_launches(spec):
        cl.Kernel(program, name)(queue, tuple(size), None, result, source)
    out = np.empty_like(data)
    cl.enqueue_copy(queue, out, result)
    return out
