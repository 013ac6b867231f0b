"""The runtime's parallel source build on real OpenCL (PoCL): helper processes, their protocol, their failures."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pyopencl as cl
import pytest

from farm.backends.opencl.builder import SourceJob, build_all, serve
from farm.backends.opencl.devices import opencl_devices
from farm.backends.opencl.loader import this_device
from farm.errors import BuildError

SCALE = (
    "__kernel void {name}(__global float* restrict out0, __global const float* restrict in0)\n"
    "{{ const long i = get_global_id(0); out0[i] = in0[i] * {factor}.0f; }}\n"
)


@pytest.fixture(scope="module")
def fingerprint() -> str:
    devices = opencl_devices()
    assert devices, "no OpenCL device: install pocl-opencl-icd (scripts/setup.sh does)"
    return devices[0]["fingerprint"]


def _job(factor: int, count: int = 8) -> SourceJob:
    return SourceJob(
        SCALE.format(name=f"k{factor}_0", factor=factor),
        f"kernel k{factor}",
        [[f"k{factor}_0", [count]]],
        [count * 4, count * 4],
    )


def _run(binary: bytes, factor: int) -> np.ndarray:
    """Load a binary on this host's device and run its launch on 0..7."""
    context, device, _ = this_device()
    program = cl.Program(context, [device], [binary]).build()
    queue = cl.CommandQueue(context)
    flags = cl.mem_flags
    values = np.arange(8, dtype=np.float32)
    source = cl.Buffer(context, flags.READ_ONLY | flags.COPY_HOST_PTR, hostbuf=values)
    out = cl.Buffer(context, flags.WRITE_ONLY, values.nbytes)
    cl.Kernel(program, f"k{factor}_0")(queue, (8,), None, out, source)
    result = np.empty_like(values)
    cl.enqueue_copy(queue, result, out)
    queue.finish()
    return result


def test_helpers_and_this_process_build_every_job_in_order(fingerprint):
    binaries = build_all([_job(factor) for factor in (2, 3, 5, 7)], fingerprint, processes=2)
    for factor, binary in zip((2, 3, 5, 7), binaries):
        np.testing.assert_array_equal(_run(binary, factor), np.arange(8) * factor)


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_helper_that_cannot_start_leaves_its_work_to_this_process(fingerprint, monkeypatch):
    """The helper exits at once (/bin/false): its feeding thread gives the job back without raising, even when
    closing the helper's stdin meets a broken pipe."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    binaries = build_all([_job(2), _job(3)], fingerprint, processes=2)
    np.testing.assert_array_equal(_run(binaries[1], 3), np.arange(8) * 3)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_kernel_that_does_not_compile_names_itself_and_carries_the_log(fingerprint, processes):
    broken = SourceJob(
        "__kernel void bad_0(__global float* out0) { out0[0] = undeclared; }", "kernel bad", [["bad_0", [1]]], [4]
    )
    with pytest.raises(BuildError, match=r"(?s)kernel bad failed to build.*undeclared"):
        build_all([broken, _job(2)], fingerprint, processes=processes)


def test_the_helper_protocol_answers_a_binary_or_an_error(fingerprint):
    requests = b"".join(
        json.dumps({"job": job.__dict__, "fingerprint": fingerprint}).encode() + b"\n"
        for job in (_job(2), SourceJob("nonsense", "kernel broken", [], []))
    )
    replies = io.BytesIO()
    serve(io.BytesIO(requests), replies)
    stream = io.BytesIO(replies.getvalue())
    size = json.loads(stream.readline())["size"]
    np.testing.assert_array_equal(_run(stream.read(size), 2), np.arange(8) * 2)
    assert "kernel broken failed to build" in json.loads(stream.readline())["error"]
