"""`farm inspect`: what an artifact holds, read from its verified manifest without loading any code.

Users learn an artifact's inputs here instead of by provoking an error from `farm run`, and CI scripts read the
same facts with --json (`describe` is that object; `format_description` the text form).
"""

from __future__ import annotations

import os
from typing import Any

from farm.artifact import Artifact, signer, verify
from farm.cli.progress import escaped
from farm.ir.shapes import describe_size
from farm.runtime.manifest import check_sizes
from farm.runtime.manifest_types import CpuTargetEntry, Manifest, OpenClKernel, TargetEntry, TensorSlot

INSPECT_SCHEMA = 1
"""The version of `farm inspect --json`'s object: bumped when a key changes meaning or goes away."""


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The artifact at `path` as `farm inspect --json` prints it, after checking every member's sha256 and the
    manifest's schema (ArtifactError otherwise, as `farm run` would refuse it). `sizes` lists each size the
    artifact holds (its pins, inputs, outputs and steps; one without pins for a static model); `inputs`, `outputs`
    and `steps` are the first size's, counts of kernels and blobs are over all sizes, each counted once. A signature
    is checked against the key it names (ArtifactError "signature invalid" otherwise, exit 2 as `farm run --trust`
    refuses it): `signer` is that key, which `farm run --trust` or FARM_TRUSTED_KEYS must name for the artifact to
    run where signatures are required."""
    artifact = verify(path)
    key = signer(artifact)
    manifest = artifact.manifest
    sizes = check_sizes(artifact.path, manifest)
    size_manifests = [size for _, size in sizes]
    members = manifest["members"]
    blobs = {blob.sha256: blob.bytes for size in size_manifests for blob in size.blobs}
    return {
        "command": "inspect",
        "schema": INSPECT_SCHEMA,
        "artifact": os.path.abspath(artifact.path),
        "bytes": os.path.getsize(artifact.path),
        "model": manifest["model"],
        "farm_version": manifest.get("farm_version"),
        "format_version": manifest.get("format_version"),
        "toolchain": manifest.get("toolchain"),
        "signed": key is not None,
        "signer": key,
        "inputs": [_tensor(slot) for slot in size_manifests[0].inputs],
        "outputs": [_tensor(slot) for slot in size_manifests[0].outputs],
        "sizes": [
            {
                "shapes": {name: list(sizes) for name, sizes in pins.items()},
                "inputs": [_tensor(slot) for slot in size.inputs],
                "outputs": [_tensor(slot) for slot in size.outputs],
                "steps": len(size.schedule),
            }
            for pins, size in sizes
        ],
        "targets": _targets(artifact, size_manifests),
        "kernels": len({(e.kernel, e.target) for size in size_manifests for e in size.kernels}),
        "opencl_kernels": len({kernel.symbol for size in size_manifests for kernel in _opencl_kernels(size)}),
        "steps": len(size_manifests[0].schedule),
        "blobs": len(blobs),
        "blob_bytes": sum(blobs.values()),
        "members": len(members),
    }


def _tensor(slot: TensorSlot) -> dict[str, Any]:
    return {"name": slot.name, "dtype": slot.dtype, "shape": list(slot.shape)}


def _opencl_kernels(size: Manifest) -> tuple[OpenClKernel, ...]:
    return size.opencl.kernels if size.opencl is not None else ()


def _targets(artifact: Artifact, sizes: list[Manifest]) -> list[dict[str, Any]]:
    """Each CPU target with its libraries' bytes (one per size), then each OpenCL device class with its program
    binaries' bytes (each binary once)."""
    targets = [
        {
            "id": t.id,
            "kind": "cpu",
            "member_bytes": sum(artifact.member_size(_library(size.targets[index])) for size in sizes),
        }
        for index, t in enumerate(sizes[0].targets)
    ]
    first = sizes[0].opencl
    for fingerprint in first.devices if first is not None else ():
        binaries = {kernel.binaries[fingerprint] for size in sizes for kernel in _opencl_kernels(size)}
        targets.append(
            {
                "id": f"opencl:{fingerprint}",
                "kind": "opencl",
                "member_bytes": sum(artifact.member_size(name) for name in binaries),
            }
        )
    return targets


def _library(target: TargetEntry) -> str:
    """A CPU target's library member (KeyError for a target of another kind, which has none)."""
    if not isinstance(target, CpuTargetEntry):
        raise KeyError("library")
    return target.library


def format_description(description: dict[str, Any]) -> str:
    """The text `farm inspect` prints: one fact per line, tensors one per line. The manifest's strings are the
    artifact's word, so each is printed with its control characters escaped (farm.cli.progress.escaped)."""
    model, toolchain = description["model"], description["toolchain"]
    built = f"farm {_shown(description['farm_version'])} (artifact format {description['format_version']})"
    if isinstance(toolchain, dict):
        built += (
            f", llvmlite {_shown(toolchain.get('llvmlite'))}, LLVM {_shown(toolchain.get('llvm'))}, "
            f"{_shown(toolchain.get('linker'))}"
        )
    lines = [
        _shown(description["artifact"]),
        f"  model    {_shown(model.get('name'))} (ai.onnx opset {_shown(model.get('opset'))}, sha256 "
        f"{model['sha256'][:16]})",
        f"  built by {built}{_signature(description['signer'])}",
    ]
    for size in description["sizes"]:
        if len(description["sizes"]) > 1:
            pins = {name: tuple(sizes) for name, sizes in size["shapes"].items()}
            lines.append(f"  size     {_shown(describe_size(pins))} ({size['steps']} steps)")
        lines += _tensor_lines(size)
    for index, target in enumerate(description["targets"]):
        lines.append(f"  {'targets' if index == 0 else '':<8} {_shown(target['id'])} ({_size(target['member_bytes'])})")
    steps = f"; {description['steps']} steps" if len(description["sizes"]) == 1 else ""
    lines.append(f"  kernels  {description['kernels']} CPU, {description['opencl_kernels']} OpenCL{steps}")
    lines.append(
        f"  weights  {description['blobs']} blobs, {_size(description['blob_bytes'])}; the artifact "
        f"{_size(description['bytes'])}"
    )
    return "\n".join(lines)


def _tensor_lines(size: dict[str, Any]) -> list[str]:
    lines = []
    for role in ("inputs", "outputs"):
        for index, tensor in enumerate(size[role]):
            shape = "x".join(map(str, tensor["shape"])) or "scalar"
            lines.append(f"  {'' if index else role:<8} {_shown(tensor['name'])}: {tensor['dtype']} {shape}")
    return lines


def _signature(key: str | None) -> str:
    """`; signed by key <its first 16 hex digits>...` (the signature verified against it), or nothing."""
    return f"; signed by key {key[:16]}..." if key else ""


def _shown(value: Any) -> str:
    return escaped(str(value))


def _size(count: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
