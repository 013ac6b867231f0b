"""The one assembly of a build, which the local build (farm.build.local) and the farm's steps
(farm.distributed.steps) both call, so that both give the same artifact by construction.

    plan_model -> [tuning picks variants] -> compile_units -> link_plan (JSON) -> units built (anywhere)
      -> link_library per CPU target -> artifact_contents -> the artifact's bytes

The link plan holds everything that linking and finishing need besides the built bytes: the manifest template,
each unit (with its cache ref and input key) and each backend's layout (farm.build.parts). Locally it stays in
memory; on the farm it is kept in the store and every step reads it by key.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from farm import __version__
from farm.artifact import FORMAT_VERSION, Member
from farm.backends.llvm.toolchain import toolchain
from farm.backends.registry import Target
from farm.build.parts import PARTS, BuiltUnits, link_target
from farm.build.units import CompileUnit
from farm.frontend.shapes import PinnedShapes, shapes_to_json
from farm.ir.specs import CODEGEN_VERSION, BlobSpec, canonical_json
from farm.plan.planner import BuildPlan


def plan_model(model_path: str | os.PathLike, shapes: PinnedShapes | None = None) -> BuildPlan:
    """Import (with the input dimensions `shapes` fixes: farm.frontend.shapes), optimise and validate the model,
    then plan it; raises before any compiling on bad input."""
    from farm.frontend.onnx_import import import_model, validate
    from farm.frontend.passes import optimize
    from farm.ops import SUPPORTED_OPS
    from farm.plan.planner import make_plan

    graph = optimize(import_model(model_path, shapes))
    validate(graph, SUPPORTED_OPS)
    return make_plan(graph)


def build_identity(model_sha256: str, model_name: str, targets: Sequence[Target],
                   shapes: PinnedShapes | None = None) -> str:
    """Everything an artifact's bytes depend on besides the tuning database: farm's codegen, this process's toolchain
    (LLVM and the linker), the model's bytes and name, the targets, the pinned shapes (none: the identity builds
    had before shapes could be pinned). It names a local build's job and the farm's artifact cache entry."""
    parts = [CODEGEN_VERSION, toolchain().key, model_sha256, model_name, [t.to_json() for t in targets]]
    text = canonical_json([*parts, shapes_to_json(shapes)] if shapes else parts)
    return hashlib.sha256(text.encode()).hexdigest()


def by_kind(targets: Sequence[Target]) -> dict[str, list[Target]]:
    """The targets of each backend part, every part listed (in PARTS order)."""
    return {kind: [t for t in targets if t.kind == kind] for kind in PARTS}


def compile_units(plan: BuildPlan, targets: Sequence[Target]) -> list[CompileUnit]:
    """Every unit the build needs, for every target (see farm.build.parts)."""
    return [unit for kind, chosen in by_kind(targets).items() for unit in PARTS[kind].units(plan, chosen)]


def link_plan(plan: BuildPlan, targets: Sequence[Target], model_name: str, model_sha256: str,
              units: Sequence[CompileUnit]) -> dict[str, Any]:
    """What linking and finishing need besides the built bytes, as JSON (see the module docstring)."""
    layouts = {kind: PARTS[kind].layout(plan, chosen, [u for u in units if u.target.kind == kind])
               for kind, chosen in by_kind(targets).items() if chosen or PARTS[kind].always}
    return {"manifest": manifest_template(plan, targets, model_name, model_sha256),
            "units": {unit.name: {**unit.to_json(), "ref": unit.cache_ref, "data_key": unit.data_key}
                      for unit in units},
            "layouts": layouts}


def manifest_template(plan: BuildPlan, targets: Sequence[Target], model_name: str,
                      model_sha256: str) -> dict[str, Any]:
    """Everything the runtime and later tools need to know about the artifact, in a deterministic form, except
    what only the built bytes tell (the objects' hashes)."""
    graph = plan.graph
    io = lambda name: {"name": name, "shape": list(graph.values[name].shape),  # noqa: E731
                       "dtype": graph.values[name].dtype, "offset": plan.memory.offsets[name]}
    manifest = {
        "format_version": FORMAT_VERSION,
        "farm_version": __version__,
        "toolchain": toolchain_versions(),
        "model": {"name": model_name, "sha256": model_sha256, "opset": graph.opset},
        "inputs": [io(name) for name in graph.inputs],
        "outputs": [io(name) for name in graph.outputs],
        "blobs": [{"sha256": sha, "bytes": int(data.nbytes), "symbol": BlobSpec(sha, data.nbytes, "").symbol}
                  for sha, data in sorted(plan.blobs.items())],
        "schedule": [{"node": step.node, "op": step.spec.op, "kernel": step.spec.key[:20],
                      "args": [f"{arg.kind}:{arg.name}" for arg in step.args]} for step in plan.steps],
        "memory_plan": plan.memory.to_json(),
    }
    for kind, chosen in by_kind(targets).items():
        if chosen or PARTS[kind].always:
            manifest.update(PARTS[kind].manifest_fields(plan, chosen))
    return manifest


def toolchain_versions() -> dict[str, str]:
    """The planning process's toolchain as the manifest records it for `farm inspect`: llvmlite's and LLVM's
    versions and the linker, not its label (which must change no byte). On a farm of mixed versions another
    worker may link; a label keeps such toolchains' caches apart."""
    found = toolchain()
    return {"llvmlite": found.llvmlite, "llvm": found.llvm, "linker": found.linker}


def libraries(plan_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The link plan's CPU libraries to link: target, schedule and link order each."""
    return plan_json["layouts"].get("cpu", {}).get("libraries", [])


def link_library(plan_json: dict[str, Any], target_id: str, built: BuiltUnits) -> bytes:
    """One CPU target's shared library from its built objects."""
    library = next(entry for entry in libraries(plan_json) if entry["target"]["id"] == target_id)
    return link_target(library, built.object_of)


def artifact_contents(plan_json: dict[str, Any], built: BuiltUnits) -> tuple[dict[str, Any], dict[str, Member]]:
    """The artifact's manifest and members, from the link plan and what was built."""
    manifest, members = dict(plan_json["manifest"]), {}
    for kind, layout in plan_json["layouts"].items():
        fields, part_members = PARTS[kind].assemble(layout, plan_json["manifest"], built)
        manifest.update(fields)
        members.update(part_members)
    return manifest, members



def unit_nodes(plan_json: dict[str, Any], unit: CompileUnit) -> list[str]:
    """The ONNX nodes a unit serves (from the link plan's manifest), so that an error can name them."""
    return PARTS[unit.target.kind].nodes_of(plan_json["manifest"], unit)


def manifest_names(manifest: dict[str, Any], model_sha256: str, model_name: str, targets: Sequence[Target]) -> bool:
    """Whether an artifact's manifest names this model (bytes and name) and exactly these targets. A cache ref is
    only a pointer: an artifact reused from the cache must say it was built from what was submitted."""
    model = manifest.get("model")
    return (isinstance(model, dict) and model.get("sha256") == model_sha256 and model.get("name") == model_name
            and all(PARTS[kind].names_targets(manifest, chosen) for kind, chosen in by_kind(targets).items()))
