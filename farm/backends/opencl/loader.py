"""Running an artifact's OpenCL part: programs from the local cache, else the shipped binary for this device's
fingerprint, else one source build of every missing kernel at once (in parallel, across processes:
farm.backends.opencl.builder), never a serial source build. It sits above the runtime's core, which finds it
by name (farm.runtime.loader_of): `LOADER`.

The cache holds binaries under <cache root>/opencl/<fingerprint>/<sha256 of the source>-<sha256 of the binary>.bin,
written atomically; a cached binary whose bytes don't match its name, or a binary the device rejects, falls back to
the source build with a warning (some drivers accept a damaged binary, so the hash is checked first). Buffers stay on the device between kernels; only inputs and outputs cross.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from farm import defaults
from farm.artifact import Artifact, open_artifact
from farm.atomic import write_atomically
from farm.backends.opencl.builder import SourceJob, build_all
from farm.backends.opencl.devices import BUILD_OPTIONS, device_info, fingerprint, opencl_platforms
from farm.errors import ArtifactError, BadInputError
from farm.runtime.manifest import check_manifest, check_sizes
from farm.runtime.manifest_types import Manifest, OpenClKernel
from farm.runtime.model import check_feeds, tensor_slots
from farm.runtime.sized import SizedModel


def this_device() -> tuple[Any, Any, str]:
    """(context, device, fingerprint) of this host's first OpenCL device."""
    import pyopencl as cl

    for platform in opencl_platforms():
        for device in platform.get_devices():
            return cl.Context([device]), device, fingerprint(device_info(platform, device))
    raise ArtifactError(
        "no OpenCL device on this host: its OpenCL loader finds no platform (install a driver, e.g. "
        "Debian's pocl-opencl-icd for the CPU) or run without --device opencl"
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ProgramLoader:
    """Finds a program for every kernel: cache, shipped binary, then a parallel source build of the rest
    (`build_processes` processes at most; default: every CPU this process may use)."""

    def __init__(
        self,
        artifact: Artifact,
        context: Any,
        device: Any,
        device_fingerprint: str,
        cache_dir: str | os.PathLike[str] | None,
        build_processes: int | None = None,
    ) -> None:
        self.artifact, self.context, self.device, self.fingerprint = artifact, context, device, device_fingerprint
        self.folder = Path(cache_dir if cache_dir is not None else defaults.cache_dir()) / "opencl" / device_fingerprint
        self.build_processes = build_processes
        self.source_builds = 0

    def load_all(self, kernels: list[OpenClKernel]) -> dict[str, Any]:
        sources = {k.symbol: self.artifact.read_member(k.source) for k in kernels}
        programs = {k.symbol: self._from_binaries(k, sources[k.symbol]) for k in kernels}
        missing = [k for k in kernels if programs[k.symbol] is None]
        jobs = [
            SourceJob(sources[k.symbol].decode(), f"kernel {k.symbol}", _launches_json(k), list(k.arguments))
            for k in missing
        ]
        for kernel, binary in zip(missing, build_all(jobs, self.fingerprint, self.build_processes)):
            write_atomically(self._cache_path(sources[kernel.symbol], binary), binary)
            programs[kernel.symbol] = self._program_from_binary(binary, f"kernel {kernel.symbol}", fallback=False)
        self.source_builds += len(missing)
        return programs

    def _cache_path(self, source: bytes, binary: bytes) -> Path:
        return self.folder / f"{_sha(source)}-{_sha(binary)}.bin"

    def _cached_binary(self, source: bytes) -> bytes | None:
        """The cached binary built from `source`, if one is there and intact (a damaged one is removed)."""
        for path in sorted(self.folder.glob(f"{_sha(source)}-*.bin")):
            binary = path.read_bytes()
            if path.name == self._cache_path(source, binary).name:
                return binary
            warnings.warn(f"cached binary {path} is damaged; removing it", stacklevel=3)
            path.unlink(missing_ok=True)
        return None

    def _from_binaries(self, kernel: OpenClKernel, source: bytes) -> Any | None:
        cached = self._cached_binary(source)
        if cached is not None:
            program = self._program_from_binary(cached, "cached binary")
            if program is not None:
                return program
        shipped = kernel.binaries.get(self.fingerprint)
        if shipped:
            binary = self.artifact.read_member(shipped)
            program = self._program_from_binary(binary, f"shipped binary {shipped}")
            if program is not None:
                write_atomically(self._cache_path(source, binary), binary)
                return program
        return None

    def _program_from_binary(self, binary: bytes, what: str, fallback: bool = True) -> Any | None:
        """The program, or None (with a warning) when the device rejects the binary and a source build can follow."""
        import pyopencl as cl

        try:
            return cl.Program(self.context, [self.device], [binary]).build(options=BUILD_OPTIONS.split())
        except (cl.Error, ValueError) as error:
            if not fallback:
                raise ArtifactError(f"{what}: {self.device.name} rejected the binary it just built ({error})") from None
            warnings.warn(f"{what} rejected by {self.device.name} ({error}); building from source", stacklevel=2)
            return None


class OpenCLModel:
    """A model whose kernels run on this host's OpenCL device. `run` is thread-safe (calls take turns)."""

    def __init__(
        self,
        artifact: Artifact,
        cache_dir: str | os.PathLike[str] | None = None,
        build_processes: int | None = None,
        manifest: Manifest | None = None,
        shared: SharedPrograms | None = None,
    ) -> None:
        """`manifest`: the size to run (default: the artifact's manifest, of one size, checked); `shared`: the
        device and the programs several sizes share (loaded at once: load_opencl_model)."""
        import pyopencl as cl

        manifest = manifest if manifest is not None else check_manifest(artifact.path, artifact.manifest)
        part = manifest.opencl
        if part is None:
            raise ArtifactError(f"{artifact.path}: the artifact has no OpenCL part (build with --target opencl)")
        if shared is None:
            shared = SharedPrograms(ProgramLoader(artifact, *this_device(), cache_dir, build_processes))
        self.loader, self.context, self.device = shared.loader, shared.loader.context, shared.loader.device
        self.fingerprint, programs = shared.loader.fingerprint, shared.programs
        programs.update(self.load_programs([k for k in part.kernels if k.symbol not in programs]))
        launches = {kernel.symbol: kernel.launches for kernel in part.kernels}
        self.queue = cl.CommandQueue(self.context)
        self._buffers = {
            name: cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(size, 4)) for name, size in part.buffers.items()
        }
        for sha, member in part.blobs.items():
            if sha not in shared.weights:
                shared.weights[sha] = self._upload(artifact.read_member(member))
            self._buffers[f"blob:{sha}"] = shared.weights[sha]
        self.schedule = [step.json_object for step in part.schedule]
        self.target = {"id": f"opencl-{self.fingerprint}", "kind": "opencl"}
        self._steps = [
            [
                (self._kernel(programs[step.kernel], launch.name, step.args), launch.size)
                for launch in launches[step.kernel]
            ]
            for step in part.schedule
        ]
        self.inputs = [spec for spec, _ in tensor_slots(manifest.inputs)]
        self.outputs = [spec for spec, _ in tensor_slots(manifest.outputs)]
        self._lock = threading.Lock()

    def load_programs(self, kernels: list[OpenClKernel]) -> dict[str, Any]:
        """A built program per kernel symbol (the loader's cache -> shipped binary -> parallel source build)."""
        return self.loader.load_all(kernels)

    @property
    def source_builds(self) -> int:
        """How many kernels this load had to build from source (0 when the cache or the artifact had them)."""
        return self.loader.source_builds

    def _upload(self, data: bytes) -> Any:
        import pyopencl as cl

        if not data:
            return cl.Buffer(self.context, cl.mem_flags.READ_ONLY, 4)
        flags = cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR
        return cl.Buffer(self.context, flags, hostbuf=np.frombuffer(data, np.uint8))

    def _kernel(self, program: Any, name: str, args: Sequence[str]) -> Any:
        """One launch's kernel object with its buffers bound once (a run only enqueues it)."""
        import pyopencl as cl

        kernel = cl.Kernel(program, name)
        for index, arg in enumerate(args):
            kernel.set_arg(index, self._buffer(arg))
        return kernel

    def _buffer(self, arg: str) -> Any:
        kind, _, name = arg.partition(":")
        return self._buffers[f"blob:{name}" if kind == "blob" else name]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import pyopencl as cl

        check_feeds(self.inputs, feeds)
        with self._lock:
            self._copy_in(feeds)
            for launches in self._steps:
                self._enqueue(launches)
            results = {spec.name: np.empty(spec.shape, spec.dtype) for spec in self.outputs}
            for spec in self.outputs:
                if spec.nbytes:  # a copy of no bytes is invalid OpenCL (CL_INVALID_VALUE); an empty result is made
                    cl.enqueue_copy(self.queue, results[spec.name], self._buffers[spec.name])
            self.queue.finish()
        return results

    def sample_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[list[float]]:
        """Seconds of each schedule step in each of `repeat` runs: its launches enqueued and finished on their own,
        on the real activations of `feeds` (what `farm bench --device opencl` times)."""
        check_feeds(self.inputs, feeds)
        timings: list[list[float]] = [[] for _ in self._steps]
        with self._lock:
            for _ in range(repeat):
                self._copy_in(feeds)
                self.queue.finish()
                for launches, samples in zip(self._steps, timings):
                    started = time.perf_counter()
                    self._enqueue(launches)
                    self.queue.finish()
                    samples.append(time.perf_counter() - started)
        return timings

    def _copy_in(self, feeds: Mapping[str, np.ndarray]) -> None:
        import pyopencl as cl

        for spec in self.inputs:
            if spec.nbytes:  # an empty input has nothing to copy (and a copy of no bytes is invalid OpenCL)
                cl.enqueue_copy(self.queue, self._buffers[spec.name], np.ascontiguousarray(feeds[spec.name]))

    def _enqueue(self, launches: list[tuple[Any, tuple[int, ...]]]) -> None:
        import pyopencl as cl

        for kernel, size in launches:
            cl.enqueue_nd_range_kernel(self.queue, kernel, size, None)


def _launches_json(kernel: OpenClKernel) -> list[list[Any]]:
    """The kernel's launches in their JSON form ([kernel function, global size]), as the source build reads them."""
    return [[launch.name, list(launch.size)] for launch in kernel.launches]


class SharedPrograms:
    """This host's device (through its ProgramLoader), a built program per kernel symbol and a device buffer per
    weight, shared by every size of an artifact (a kernel two sizes share is built or read once, a weight is on the
    device once)."""

    def __init__(self, loader: ProgramLoader) -> None:
        self.loader = loader
        self.programs: dict[str, Any] = {}
        self.weights: dict[str, Any] = {}

    def load(self, kernels: list[OpenClKernel]) -> None:
        """Programs for the kernels not loaded yet, all at once (cache -> shipped binary -> one parallel source
        build of the rest)."""
        todo = {kernel.symbol: kernel for kernel in kernels if kernel.symbol not in self.programs}
        self.programs.update(self.loader.load_all(list(todo.values())))


def load_opencl_model(
    path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None
) -> OpenCLModel | SizedModel:
    """The OpenCL backend's loader (see farm.runtime.load): an artifact of several sizes loads each size over the
    programs of all of them, built or read in one go."""
    artifact = open_artifact(path)
    sizes = check_sizes(artifact.path, artifact.manifest)
    if len(sizes) == 1:
        return OpenCLModel(artifact, cache_dir, manifest=sizes[0][1])
    parts = [size.opencl for _, size in sizes]
    if not all(parts):
        raise ArtifactError(f"{artifact.path}: the artifact has no OpenCL part (build with --target opencl)")
    shared = SharedPrograms(ProgramLoader(artifact, *this_device(), cache_dir))
    shared.load([kernel for part in parts if part is not None for kernel in part.kernels])
    return SizedModel(
        artifact.path, [(pins, OpenCLModel(artifact, cache_dir, manifest=size, shared=shared)) for pins, size in sizes]
    )


def load_on_this_device(
    path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None, threads: int, target: str | None
) -> OpenCLModel | SizedModel:
    """The OpenCL backend's loader (farm.runtime.Loader): the artifact's OpenCL part on this host's device, which
    takes no CPU target."""
    if target:
        raise BadInputError(
            f"a target ({target!r}) selects one of the artifact's CPU targets; the OpenCL part "
            "runs on this host's OpenCL device"
        )
    return load_opencl_model(path, cache_dir)


LOADER = load_on_this_device
