"""The manifest's schema as the runtime relies on it, checked before any library or program is loaded.

An artifact is code that the runtime hands an arena described by the manifest: an offset past the arena, a launch
past its kernel, a shape whose product overflows or a dtype numpy can't copy would make the native code or numpy
read and write out of bounds. `check_manifest` refuses each with one ArtifactError naming the field, so that a
damaged or hostile manifest (its sha256 recomputed) never reaches ctypes. Bounds are far above any real model's.
"""

from __future__ import annotations

import mmap
import re
from typing import Any

from farm.artifact import size_manifests
from farm.backends.llvm.elf import defined_symbols
from farm.backends.opencl.target import FINGERPRINT
from farm.defaults import MAX_TARGETS
from farm.errors import ArtifactError, BadInputError
from farm.ir.shapes import MAX_SIZES, PinnedShapes, sizes_from_json
from farm.runtime.manifest_types import POINTER_BYTES, CpuTargetEntry, Manifest

MAX_ARENA_BYTES = 1 << 36  # 64 GiB
MAX_TENSORS = 4096  # inputs or outputs
MAX_RANK = 16
MAX_DIMENSION = 1 << 31
MAX_LAUNCHES = 1 << 20
MAX_EXTENT = 1 << 40
MAX_WORK = 1 << 62
MAX_LIST = 1 << 22  # buffers, kernels, blobs, schedule steps
MAX_ARGUMENTS = 4096  # an OpenCL kernel's arguments: its outputs, inputs and scratch
MAX_REQUIRED_FEATURES = 1024  # a CPU target's `requires` (LLVM knows some 200-350 features per architecture)
DTYPE_BYTES = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
}
PLAIN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
FEATURES = re.compile(r"([+-][A-Za-z0-9_.-]+(,[+-][A-Za-z0-9_.-]+)*)?")
SHA256 = re.compile(r"[0-9a-f]{64}")
TENSOR_NAME_CHARS = 1024


class _Fields:
    """Reads fields of one manifest, raising ArtifactError '<artifact>: manifest <field> ...' for any misfit."""

    def __init__(self, path: str) -> None:
        self.path = path

    def refuse(self, field: str, why: str) -> ArtifactError:
        return ArtifactError(f"{self.path}: manifest {field} {why}; refused")

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.refuse(field, "is not an object")
        return value

    def items(self, value: Any, field: str, most: int = MAX_LIST, least: int = 0) -> list[Any]:
        if not isinstance(value, list) or not least <= len(value) <= most:
            raise self.refuse(field, f"is not a list of {least} to {most} entries")
        return value

    def integer(self, value: Any, field: str, least: int, most: int) -> int:
        if type(value) is not int or not least <= value <= most:
            raise self.refuse(field, f"is not an integer from {least} to {most}")
        return value

    def text(self, value: Any, field: str, pattern: re.Pattern[str]) -> str:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise self.refuse(field, f"is not a string matching {pattern.pattern}")
        return value


def check_sizes(path: str, manifest: dict[str, Any]) -> list[tuple[PinnedShapes, Manifest]]:
    """Each size of the artifact (farm.artifact.size_manifests) with its pins, every one checked (check_manifest):
    the manifest itself without pins when it has no `sizes`; else 1 to MAX_SIZES sizes of distinct pins."""
    if "sizes" not in manifest:
        return [({}, check_manifest(path, manifest))]
    fields = _Fields(path)
    entries = [
        fields.obj(size, f"sizes[{index}]")
        for index, size in enumerate(fields.items(manifest["sizes"], "sizes", MAX_SIZES, 1))
    ]
    try:
        pins = sizes_from_json([entry.get("shapes") for entry in entries])
    except BadInputError as error:
        raise fields.refuse("sizes", f"has malformed pins ({error})") from None
    checked = [check_manifest(path, size) for size in size_manifests(manifest)]
    if any(_targets_of(size) != _targets_of(checked[0]) for size in checked):
        raise fields.refuse("sizes", "do not all have the same targets")
    return list(zip(pins, checked))


def _targets_of(size: Manifest) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """What a size's manifest builds for: its targets' ids and its OpenCL device classes (None without a part)."""
    return tuple(target.id for target in size.targets), None if size.opencl is None else size.opencl.devices


def check_manifest(path: str, manifest: dict[str, Any]) -> Manifest:
    """Refuse a manifest the runtime can't use safely: every field it reads typed and bounded, every offset and
    size within the arena, every launch sane, every target well-formed and its library a listed member. What
    passes comes back as frozen values (farm.runtime.manifest_types), which the runtime reads instead."""
    fields = _Fields(path)
    fields.text(fields.obj(manifest.get("model"), "model").get("sha256"), "model.sha256", SHA256)
    arena = _check_memory_plan(fields, manifest.get("memory_plan"))
    for role in ("inputs", "outputs"):  # a name unique in its role: an output may be an input (ONNX allows it)
        names: set[str] = set()
        for index, entry in enumerate(fields.items(manifest.get(role), role, MAX_TENSORS)):
            _check_tensor(fields, entry, f"{role}[{index}]", arena, names)
    members = manifest.get("members", {})
    targets = fields.items(manifest.get("targets"), "targets", MAX_TARGETS)
    for index, target in enumerate(targets):
        _check_target(fields, target, f"targets[{index}]", members, arena)
    for key in ("kernels", "schedule"):
        for index, entry in enumerate(fields.items(manifest.get(key, []), key)):
            entry = fields.obj(entry, f"{key}[{index}]")
            fields.text(entry.get("kernel"), f"{key}[{index}].kernel", PLAIN)
            if key == "kernels":
                fields.text(entry.get("target"), f"kernels[{index}].target", PLAIN)
                fields.text(entry.get("symbol"), f"kernels[{index}].symbol", SYMBOL)
    for index, blob in enumerate(fields.items(manifest.get("blobs", []), "blobs")):
        _check_blob(fields, blob, f"blobs[{index}]")
    if "opencl" in manifest:
        _check_opencl(fields, manifest["opencl"], members)
    return Manifest.from_json(manifest)


def _check_blob(fields: _Fields, value: Any, field: str) -> None:
    """A weight blob: the sha256 of its bytes, how many bytes it has (bounded like the arena) and a symbol-like
    name."""
    blob = fields.obj(value, field)
    fields.text(blob.get("sha256"), f"{field}.sha256", SHA256)
    fields.integer(blob.get("bytes"), f"{field}.bytes", 0, MAX_ARENA_BYTES)
    fields.text(blob.get("symbol"), f"{field}.symbol", SYMBOL)


def _check_opencl(fields: _Fields, value: Any, members: dict[str, Any]) -> None:
    """The OpenCL part: the fingerprints of its device classes, bounded buffer sizes, members that are listed,
    kernels (_check_opencl_kernel) and a schedule of its own kernels."""
    part = fields.obj(value, "opencl")
    devices = fields.items(part.get("devices"), "opencl.devices", MAX_TARGETS)
    for index, device in enumerate(devices):
        fields.text(device, f"opencl.devices[{index}]", FINGERPRINT)
    buffers = fields.obj(part.get("buffers"), "opencl.buffers")
    for name, size in buffers.items():
        fields.integer(size, f"opencl.buffers[{name!r}]", 0, MAX_ARENA_BYTES)
    blobs = fields.obj(part.get("blobs", {}), "opencl.blobs")
    for sha, member in blobs.items():
        _member(fields, member, f"opencl.blobs[{sha!r}]", members)
    symbols = {
        _check_opencl_kernel(fields, kernel, f"opencl.kernels[{index}]", members, devices)
        for index, kernel in enumerate(fields.items(part.get("kernels"), "opencl.kernels"))
    }
    for index, step in enumerate(fields.items(part.get("schedule"), "opencl.schedule")):
        step = fields.obj(step, f"opencl.schedule[{index}]")
        if step.get("kernel") not in symbols:
            raise fields.refuse(f"opencl.schedule[{index}].kernel", "is not one of opencl.kernels")
        for number, arg in enumerate(fields.items(step.get("args"), f"opencl.schedule[{index}].args")):
            kind, _, name = arg.partition(":") if isinstance(arg, str) else ("", "", "")
            if not (name in blobs if kind == "blob" else name in buffers):
                raise fields.refuse(f"opencl.schedule[{index}].args[{number}]", "names no buffer or blob")


def _check_opencl_kernel(fields: _Fields, value: Any, field: str, members: dict[str, Any], devices: list[str]) -> str:
    """An OpenCL kernel's symbol, after checking its source and binaries are listed members (a binary for each of
    the part's `devices` among them), its launches have 1-3 bounded dimensions and its argument sizes are bounded
    like the arena."""
    kernel = fields.obj(value, field)
    symbol = fields.text(kernel.get("symbol"), f"{field}.symbol", SYMBOL)
    _member(fields, kernel.get("source"), f"{field}.source", members)
    binaries = fields.obj(kernel.get("binaries", {}), f"{field}.binaries")
    for device, member in binaries.items():
        _member(fields, member, f"{field}.binaries[{device!r}]", members)
    for index, device in enumerate(devices):
        if device not in binaries:
            raise fields.refuse(f"{field}.binaries", f"has no binary for opencl.devices[{index}] {device!r}")
    for number, launch in enumerate(fields.items(kernel.get("launches"), f"{field}.launches", MAX_LAUNCHES)):
        name, size = fields.items(launch, f"{field}.launches[{number}]", 2, 2)
        fields.text(name, f"{field}.launches[{number}] name", SYMBOL)
        for axis, extent in enumerate(fields.items(size, f"{field}.launches[{number}] size", 3, 1)):
            fields.integer(extent, f"{field}.launches[{number}] size[{axis}]", 1, MAX_DIMENSION)
    for number, size in enumerate(fields.items(kernel.get("arguments"), f"{field}.arguments", MAX_ARGUMENTS)):
        fields.integer(size, f"{field}.arguments[{number}]", 0, MAX_ARENA_BYTES)
    return symbol


def _member(fields: _Fields, value: Any, field: str, members: dict[str, Any]) -> None:
    if not isinstance(value, str) or value not in members:
        raise fields.refuse(field, "is not a member of the artifact")


def check_library(path: str, manifest: Manifest, target: CpuTargetEntry, library: bytes | mmap.mmap) -> None:
    """Cross-check a checked manifest's CPU target with its library (its bytes, or a memory map of the cached file,
    so that a load reads only the pages the symbol tables are on) before it is loaded: the library defines the
    target's entry points and every kernel the manifest gives the target, and the target's launches are as many
    as the schedule's kernels define (`<symbol>_<n>`). Another model's or target's library fails here."""
    fields = _Fields(path)
    try:
        names = defined_symbols(library)
    except ArtifactError as error:
        raise ArtifactError(f"{path}: target {target.id!r}: {error}; refused") from None
    field = f"target {target.id!r}"
    for key, entry in (
        ("entry", target.entry),
        ("launch_entry", target.launch_entry),
        ("work_entry", target.work_entry),
        ("serve_entry", target.serve_entry),
        ("post_entry", target.post_entry),
    ):
        if entry is not None and entry not in names:
            raise fields.refuse(f"{field} {key}", f"{entry!r} is not defined by its library")
    symbols = {entry.kernel: entry.symbol for entry in manifest.kernels if entry.target == target.id}
    launches = _launch_counts(names, set(symbols.values()))
    for kernel, symbol in sorted(symbols.items()):
        if symbol not in names:
            raise fields.refuse(
                f"{field} kernel {kernel}",
                f"symbol {symbol} is not defined by its library (another model's or target's library?)",
            )
    if target.launches is None:
        return
    total = 0
    for index, step in enumerate(manifest.schedule):
        if step.kernel not in symbols:
            raise fields.refuse(f"schedule[{index}].kernel", f"{step.kernel} is not a kernel of {field}")
        total += launches[symbols[step.kernel]]
    if total != len(target.launches):
        raise fields.refuse(
            f"{field} launches", f"number {len(target.launches)}, but its schedule's kernels define {total}"
        )


def _launch_counts(names: set[str], symbols: set[str]) -> dict[str, int]:
    """How many launch functions (`<symbol>_<n>`) each kernel symbol has among `names`."""
    counts = dict.fromkeys(symbols, 0)
    for name in names:
        symbol, _, number = name.rpartition("_")
        if symbol in counts and number.isdigit():
            counts[symbol] += 1
    return counts


def _check_memory_plan(fields: _Fields, value: Any) -> int:
    """The arena's size, after checking its alignment and every buffer lies within it."""
    plan = fields.obj(value, "memory_plan")
    arena = fields.integer(plan.get("arena_bytes"), "memory_plan.arena_bytes", 0, MAX_ARENA_BYTES)
    alignment = fields.integer(plan.get("alignment", 64), "memory_plan.alignment", 1, 4096)
    if alignment & (alignment - 1):
        raise fields.refuse("memory_plan.alignment", "is not a power of two")
    for index, buffer in enumerate(fields.items(plan.get("buffers", []), "memory_plan.buffers")):
        field = f"memory_plan.buffers[{index}]"
        buffer = fields.obj(buffer, field)
        offset = fields.integer(buffer.get("offset"), f"{field}.offset", 0, arena)
        fields.integer(buffer.get("bytes"), f"{field}.bytes", 0, arena - offset)
    return arena


def _check_tensor(fields: _Fields, value: Any, field: str, arena: int, names: set[str]) -> None:
    """An input or output: a unique name, a bounded shape, a dtype from DTYPE_BYTES and bytes within the arena; an
    input's pointer slot, where it has one (farm.plan.memory.INPUT_POINTERS), aligned and within the arena."""
    entry = fields.obj(value, field)
    name = entry.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= TENSOR_NAME_CHARS or "\0" in name:
        raise fields.refuse(f"{field}.name", "is not a non-empty string without NUL")
    if name in names:
        raise fields.refuse(f"{field}.name", f"{name!r} is not unique")
    names.add(name)
    shape = fields.items(entry.get("shape"), f"{field}.shape", MAX_RANK)
    elements = 1
    for axis, size in enumerate(shape):
        elements *= fields.integer(size, f"{field}.shape[{axis}]", 0, MAX_DIMENSION)
    dtype = entry.get("dtype")
    if dtype not in DTYPE_BYTES:
        raise fields.refuse(f"{field}.dtype", f"is not one of {', '.join(DTYPE_BYTES)}")
    offset = fields.integer(entry.get("offset"), f"{field}.offset", 0, arena)
    if offset + elements * DTYPE_BYTES[dtype] > arena:
        raise fields.refuse(field, f"({elements} x {dtype} at offset {offset}) does not fit the {arena}-byte arena")
    if "pointer" in entry:
        pointer = fields.integer(entry["pointer"], f"{field}.pointer", 0, arena - POINTER_BYTES)
        if pointer % POINTER_BYTES:
            raise fields.refuse(f"{field}.pointer", f"{pointer} is not a multiple of {POINTER_BYTES}")


def _check_target(fields: _Fields, value: Any, field: str, members: dict[str, Any], arena: int) -> None:
    """A target the runtime may choose: plain names (its `requires` too, every feature its code may use), a library and weights that are listed members, a weight table
    after the arena, symbol-like entries and sane launches. Targets of other kinds (opencl) need only a plain id
    and kind."""
    target = fields.obj(value, field)
    fields.text(target.get("id"), f"{field}.id", PLAIN)
    if fields.text(target.get("kind"), f"{field}.kind", PLAIN) != "cpu":
        return
    for key, pattern in (("triple", PLAIN), ("cpu", PLAIN), ("features", FEATURES)):
        fields.text(target.get(key), f"{field}.{key}", pattern)
    for index, name in enumerate(fields.items(target.get("requires"), f"{field}.requires", MAX_REQUIRED_FEATURES)):
        fields.text(name, f"{field}.requires[{index}]", PLAIN)
    library = target.get("library")
    if not isinstance(library, str) or library not in members:
        raise fields.refuse(f"{field}.library", "is not a member of the artifact")
    for key in ("entry", "launch_entry", "work_entry", "serve_entry", "post_entry"):
        if key in target or key == "entry":
            fields.text(target.get(key, "farm_run"), f"{field}.{key}", SYMBOL)
    if "launches" in target:
        for index, launch in enumerate(fields.items(target["launches"], f"{field}.launches", MAX_LAUNCHES)):
            _check_launch(fields, launch, f"{field}.launches[{index}]")
    _check_weights(fields, target, field, members, arena)


def _check_weights(fields: _Fields, target: dict[str, Any], field: str, members: dict[str, Any], arena: int) -> None:
    """The target's weights are listed members, and its weight table (8 bytes a weight) starts 8-byte aligned at or
    after the arena's end and is bounded like it."""
    weights = fields.items(target.get("weights", []), f"{field}.weights")
    for index, member in enumerate(weights):
        if not isinstance(member, str) or member not in members:
            raise fields.refuse(f"{field}.weights[{index}]", "is not a member of the artifact")
    offset = fields.integer(
        target.get("weights_offset", arena), f"{field}.weights_offset", arena, MAX_ARENA_BYTES - 8 * len(weights)
    )
    if offset % 8:
        raise fields.refuse(f"{field}.weights_offset", "is not a multiple of 8")


def _check_launch(fields: _Fields, value: Any, field: str) -> None:
    """[extent, grain, work]: 0 <= extent <= MAX_EXTENT, 1 <= grain <= MAX_EXTENT (a GEMM's grain, its tile rows
    or a block's vectors, may exceed a small extent), 0 <= work <= MAX_WORK."""
    launch = fields.items(value, field, 3, 3)
    fields.integer(launch[0], f"{field} extent", 0, MAX_EXTENT)
    fields.integer(launch[1], f"{field} grain", 1, MAX_EXTENT)
    fields.integer(launch[2], f"{field} work", 0, MAX_WORK)
