"""Running a CPU target of another architecture under qemu user-mode emulation, so that a cross-compiled library
is executed and checked, not only built (`farm run --target cpu:aarch64-linux-gnu` on an x86-64 host).

Each run is one emulated process: `qemu-<arch>-static -L <the target's libc folder> DRIVER`, where DRIVER is a
small program of the target's architecture (farm.backends.llvm.driver) that maps the artifact, loads the library
the runtime cache holds (checked as a native load checks it) and calls its entry once on an arena file that this
process maps too: the inputs are copied into it before the run and the outputs out of it after. Nothing is
serialised and no foreign Python runs; what a run costs beyond the emulated code is one qemu start (some 45 ms).
The driver is built once per architecture and kept in the runtime cache under a key of everything that makes its
bytes (its IR, the toolchain, the target it is compiled for, the C library it links with).
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from farm import defaults
from farm.atomic import write_atomically
from farm.backends.llvm.driver import (
    EXIT_STATUSES,
    HEADER_FIELDS,
    MAGIC,
    PAGE_BYTES,
    CrossLibc,
    build_driver,
    driver_ir,
)
from farm.backends.llvm.target import CpuTarget, parse_target
from farm.errors import EmulationError
from farm.runtime.cache import runtime_folder
from farm.runtime.host import Host, arch_of
from farm.runtime.manifest_types import CpuTargetEntry, Manifest
from farm.runtime.model import TensorSpec, check_feeds, tensor_slots

QEMU_PACKAGE = "qemu-user-static"
LINKER_PACKAGE = "lld"


@dataclass(frozen=True)
class Emulator:
    """How this host runs one foreign architecture: qemu's user-mode emulator (Debian's qemu-user-static), the
    architecture's C library (libc6-<arch>-cross) and the target the driver is compiled for (the one `cpu:TRIPLE`
    names)."""

    arch: str
    qemu: str
    libc_package: str
    libc: CrossLibc
    triple: str

    def check_installed(self, what: str) -> str:
        """qemu's path, once qemu and the C library are there; else EmulationError naming the package to install
        (`what` names the target in the message)."""
        qemu = shutil.which(self.qemu)
        if qemu is None:
            raise EmulationError(
                f"{what} runs under qemu on this host, and {self.qemu} is not installed (not on "
                f"PATH): apt-get install {QEMU_PACKAGE}"
            )
        missing = [path for path in self.libc.files if not path.is_file()]
        if missing:
            raise EmulationError(
                f"{what} runs under qemu on this host, and the {self.arch} C library is not "
                f"installed (no {missing[0]}): apt-get install {self.libc_package}"
            )
        return qemu

    def driver(self, cache_dir: str | os.PathLike[str] | None) -> Path:
        """The driver executable in the runtime cache, built and written there (atomically, executable) first when
        it is not."""
        target = parse_target(f"cpu:{self.triple}")
        path = runtime_folder(cache_dir) / "drivers" / f"{self.arch}-{self._driver_key(target)}"
        if not path.is_file():
            if shutil.which("ld.lld") is None:
                raise EmulationError(
                    f"building the {self.arch} emulation driver needs ld.lld: apt-get install {LINKER_PACKAGE}"
                )
            write_atomically(path, build_driver(target, self.libc), mode=0o755)
        return path

    def _driver_key(self, target: CpuTarget) -> str:
        """16 hex digits over everything that makes the driver's bytes."""
        from farm.backends.llvm.toolchain import toolchain

        parts = [driver_ir(), toolchain().key, target.id, self.libc.loader, _digests(tuple(self.libc.files))]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _cross_libc(arch: str, loader: str) -> CrossLibc:
    return CrossLibc(Path(f"/usr/{arch}-linux-gnu/lib"), loader)


EMULATORS = {
    "aarch64": Emulator(
        "aarch64",
        "qemu-aarch64-static",
        "libc6-arm64-cross",
        _cross_libc("aarch64", "/lib/ld-linux-aarch64.so.1"),
        "aarch64-linux-gnu",
    ),
    "riscv64": Emulator(
        "riscv64",
        "qemu-riscv64-static",
        "libc6-riscv64-cross",
        _cross_libc("riscv64", "/lib/ld-linux-riscv64-lp64d.so.1"),
        "riscv64-linux-gnu",
    ),
}
"""The architectures farm runs under emulation (64-bit little-endian Linux with glibc, as Debian packages them)."""


@functools.cache
def _digests(files: tuple[Path, ...]) -> list[str]:
    """Each file's sha256, once per process (the C library's few MB)."""
    return [hashlib.sha256(path.read_bytes()).hexdigest() for path in files]


def emulator_for(target: CpuTargetEntry, host: Host, artifact: str) -> Emulator:
    """The installed emulator that runs `target` (a manifest's CPU target of another architecture than the host's);
    EmulationError naming what to install, or why no emulator fits."""
    triple = target.triple
    what = f"{artifact}: target {target.id!r} ({triple})"
    emulator = EMULATORS.get(arch_of(triple))
    parts = triple.split("-")
    if emulator is None or "linux" not in parts or not parts[-1].startswith("gnu"):
        raise EmulationError(
            f"{what} is not for this {host.arch} host, and farm emulates only Linux GNU targets "
            f"of {', '.join(EMULATORS)}"
        )
    emulator.check_installed(what)
    return emulator


class EmulatedModel:
    """A model whose CPU target is another architecture's, run under qemu: the runtime Model's interface for running
    (inputs, outputs, target, schedule, run); each run is one emulated process making one call of the entry
    (threads: 1). It can't be timed (sample_steps, time_steps): emulated time says nothing of the target's."""

    threads = 1

    def __init__(
        self,
        path: str,
        manifest: Manifest,
        target: CpuTargetEntry,
        library: Path,
        weights: Sequence[int],
        emulator: Emulator,
        driver: Path,
    ) -> None:
        """`library`: the target's library, checked, in the runtime cache; `weights`: each weight's offset in the
        artifact file (the target's manifest `weights`, in slot order), which the driver turns into addresses."""
        arena_bytes = manifest.memory_plan.arena_bytes
        self._inputs = tensor_slots(manifest.inputs)
        self._outputs = tensor_slots(manifest.outputs)
        self.inputs = [spec for spec, _ in self._inputs]
        self.outputs = [spec for spec, _ in self._outputs]
        self.path, self.target, self._target_id = path, target.json_object, target.id
        self.schedule = [step.json_object for step in manifest.schedule]
        self.emulator = emulator
        self._command = [
            emulator.check_installed(f"{path}: target {target.id!r}"),
            "-L",
            str(emulator.libc.folder.parent),
            str(driver),
        ]
        table = target.weights_offset
        header = _header([library, target.entry, os.path.abspath(path)], table, len(weights))
        self._file = tempfile.TemporaryFile(prefix="farm-arena-")
        self._file.truncate(len(header) + max(arena_bytes, table + 8 * len(weights), 1))
        image = np.frombuffer(mmap.mmap(self._file.fileno(), 0), dtype=np.uint8)
        image[: len(header)] = np.frombuffer(header, dtype=np.uint8)
        arena = image[len(header) :]
        self._table, self._weights = arena[table : table + 8 * len(weights)].view("<u8"), np.asarray(weights, "<u8")
        self._input_views = [(spec.name, _view(arena, spec, offset)) for spec, offset in self._inputs]
        self._output_views = [(spec.name, _view(arena, spec, offset)) for spec, offset in self._outputs]
        self._lock = threading.Lock()

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once in an emulated process; returns fresh arrays."""
        check_feeds(self.inputs, feeds)
        with self._lock:
            for name, view in self._input_views:
                np.copyto(view, feeds[name], casting="no")
            self._table[:] = self._weights  # the driver turned them into addresses in the last run's map
            self._emulate()
            return {name: view.copy() for name, view in self._output_views}

    def sample_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[list[float]]:
        raise EmulationError(
            f"{self.path}: target {self._target_id!r} runs under emulation here, whose timing "
            "says nothing of the target's"
        )

    time_steps = sample_steps

    def _emulate(self) -> None:
        """One emulated run of the driver on the arena file (its standard input); EmulationError naming the target
        and what happened when it fails."""
        what = f"{self.path}: target {self._target_id!r} under {self.emulator.qemu}"
        timeout = defaults.emulation_timeout()
        with subprocess.Popen(
            self._command, stdin=self._file, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_qemu_environment()
        ) as process:
            _no_core_files(process.pid)
            try:
                _, errors = process.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise EmulationError(
                    f"{what}: no result after {timeout:g} s (FARM_EMULATION_TIMEOUT); stopped"
                ) from None
        if process.returncode != 0:
            raise EmulationError(f"{what}: {_failure(process.returncode, errors)}")


def _view(arena: np.ndarray, spec: TensorSpec, offset: int) -> np.ndarray:
    return arena[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)


def _header(strings: Sequence[str | Path], table: int, weights: int) -> bytes:
    """The arena file's header (farm.backends.llvm.driver): its fields, then each string and a NUL, padded with NULs
    to whole pages (at least one NUL at its end)."""
    text = b"".join(os.fsencode(item) + b"\0" for item in strings)
    size = -(-(8 * len(HEADER_FIELDS) + len(text) + 1) // PAGE_BYTES) * PAGE_BYTES
    fields = {"magic": MAGIC, "arena_at": size, "table_offset": table, "weights": weights}
    head = np.asarray([fields[name] for name in HEADER_FIELDS], dtype="<u8").tobytes() + text
    return head + bytes(size - len(head))


SIGNAL_HINTS: dict[int, str] = {
    signal.SIGILL: " (an instruction qemu's CPU lacks, whose model QEMU_CPU chooses, or a trap)"
}
"""What a signal most likely means under emulation, where it says more than its name."""


def _qemu_environment() -> dict[str, str]:
    """The emulated process's environment: only the QEMU_* settings of this one (QEMU_CPU picks the emulated CPU),
    none of the host's LD_* variables, which would send the target's dynamic loader to the host's libraries."""
    return {name: value for name, value in os.environ.items() if name.startswith("QEMU_")}


def _no_core_files(pid: int) -> None:
    """No core file: qemu writes one into the working folder when the emulated code crashes and the limit allows."""
    try:
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    except (ProcessLookupError, PermissionError):
        pass


def _failure(status: int, errors: bytes) -> str:
    """Why the emulated run failed: the signal that ended it, or what the driver's exit status means; with the last
    line it wrote on stderr (dlerror's, qemu's), printable characters only."""
    if status < 0:
        reason = f"the emulated process was killed by {_signal_name(-status)}{SIGNAL_HINTS.get(-status, '')}"
    else:
        reason = EXIT_STATUSES.get(status, f"the emulated process exited with status {status}")
    lines = [line.strip() for line in errors.decode(errors="replace").splitlines() if line.strip()]
    detail = "".join(char if char.isprintable() else "?" for char in lines[-1][:300]) if lines else ""
    return f"{reason} ({detail})" if detail else reason


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
