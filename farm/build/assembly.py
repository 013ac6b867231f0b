"""The one assembly of a build, which the local build (farm.build.local) and the farm's steps
(farm.distributed.steps) both call, so that both give the same artifact by construction.

    plan_model -> [tuning picks variants] -> compile_units -> link_plan (JSON) -> units built (anywhere)
      -> link_library per CPU target -> artifact_contents -> the artifact's bytes

The link plan holds everything that linking and finishing need besides the built bytes: the manifest template,
each unit (with its cache ref and input key) and each backend's layout (farm.build.parts). Locally it stays in
memory; on the farm it is kept in the store and every step reads it by key.

A build of several sizes (`--shape batch=1,8,32`: farm.frontend.shapes) plans the model once per size; its units are
the union of the sizes' units (a kernel or packed weight that two sizes share is one unit), its link plan holds a
sub-plan per size under `sizes`, and each size gets its own library per CPU target (`sizes/<i>/targets/<id>/
model.so`). The artifact's manifest keeps the fields every size shares at the top (COMMON_FIELDS) and the rest of
each size's manifest, with its pins, in `sizes` (farm.artifact.size_manifests reads it back); weights are members
named by content, so all sizes map the same ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import Any

from farm import __version__
from farm.artifact import COMMON_FIELDS, FORMAT_VERSION, SIZED_FORMAT_VERSION, Member, size_manifests
from farm.backends.llvm.part import link_target
from farm.backends.llvm.toolchain import toolchain
from farm.backends.registry import Target
from farm.build.parts import BuiltUnits, parts
from farm.build.units import CompileUnit
from farm.errors import BadInputError, UnsupportedError
from farm.frontend.external import ExternalData
from farm.ir.shapes import PinnedShapes, describe_size, shapes_to_json, sizes_to_json
from farm.ir.specs import CODEGEN_VERSION, BlobSpec, canonical_json
from farm.ir.unit_kinds import UnitKind
from farm.plan.planner import BuildPlan


def plan_model(
    model_path: str | os.PathLike, shapes: PinnedShapes | None = None, external: ExternalData | None = None
) -> BuildPlan:
    """Import (with the input dimensions `shapes` fixes: farm.frontend.shapes; external data read through
    `external`, by default from the model's folder), optimise and validate the model, then plan it; raises before
    any compiling on bad input."""
    from farm.frontend.onnx_import import import_model
    from farm.frontend.passes import optimize
    from farm.frontend.validate import validate
    from farm.ops import SUPPORTED_OPS
    from farm.plan.planner import make_plan

    graph = optimize(import_model(model_path, shapes, external))
    validate(graph, SUPPORTED_OPS)
    return make_plan(graph)


def plan_sizes(
    model_path: str | os.PathLike, sizes: Sequence[PinnedShapes] = (), external: ExternalData | None = None
) -> list[BuildPlan]:
    """A plan per size (plan_model with each size's pins; one plan without sizes). With several sizes, a refusal
    says at which size, since another may plan."""
    if len(sizes) <= 1:
        return [plan_model(model_path, sizes[0] if sizes else None, external)]
    plans = []
    for pins in sizes:
        try:
            plans.append(plan_model(model_path, pins, external))
        except BadInputError as error:
            raise _at_size(error, pins) from None
    return plans


def _at_size(error: BadInputError, pins: PinnedShapes) -> BadInputError:
    """`error` saying at which size it happened (unless it names a --shape already)."""
    if "--shape" in str(error):
        return error
    if isinstance(error, UnsupportedError):
        return UnsupportedError(
            f"{error.reason} (at --shape {describe_size(pins)})",
            node=error.node,
            op=error.op,
            domain=error.domain,
            opset=error.opset,
        )
    return type(error)(f"{error} (at --shape {describe_size(pins)})")


def build_identity(
    model_sha256: str,
    model_name: str,
    targets: Sequence[Target],
    sizes: Sequence[PinnedShapes] = (),
    graph_key: str | None = None,
) -> str:
    """Everything an artifact's bytes depend on besides the tuning database: farm's codegen and artifact format, this
    process's toolchain (LLVM and the linker), the model's bytes and name, the targets, the pinned sizes (none, or
    one without pins: the identity builds had before shapes could be pinned; one: the identity of a single pinned
    size). It names a local build's job and the farm's artifact cache entry. `graph_key`: on the farm, the key of
    the split graph the workers built from (farm.frontend.split), when it differs from the model file's sha256;
    the farm can't check a submitter's `model_sha256` (the file never reaches it), so only what it checked, the
    graph and through it every weight's digest, may decide which cached artifact a job gets."""
    parts = [CODEGEN_VERSION, FORMAT_VERSION, toolchain().key, model_sha256, model_name, [t.to_json() for t in targets]]
    if graph_key and graph_key != model_sha256:
        parts.append({"graph": graph_key})
    pinned = [pins for pins in sizes if pins]
    if len(sizes) > 1:
        parts.append(sizes_to_json(sizes))
    elif pinned:
        parts.append(shapes_to_json(pinned[0]))
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def by_kind(targets: Sequence[Target]) -> dict[str, list[Target]]:
    """The targets of each backend part, every part listed (in the registry's order)."""
    return {kind: [t for t in targets if t.kind == kind] for kind in parts()}


def start_parts(targets: Sequence[Target]) -> None:
    """Let each backend part start, in the background, what it will ask of its targets only as the build finishes
    (Part.start), so that it runs while the build plans and compiles."""
    for kind, chosen in by_kind(targets).items():
        if chosen:
            parts()[kind].start(chosen)


def compile_units(plan: BuildPlan, targets: Sequence[Target]) -> list[CompileUnit]:
    """Every unit the build needs, for every target (see farm.build.parts)."""
    return [unit for kind, chosen in by_kind(targets).items() for unit in parts()[kind].units(plan, chosen)]


def sized_units(plans: Sequence[BuildPlan], targets: Sequence[Target]) -> list[CompileUnit]:
    """Every unit of every size's plan, each once (sizes share the kernels whose shapes don't change and their
    weights' packed copies)."""
    units: dict[str, CompileUnit] = {}
    for plan in plans:
        units.update((unit.name, unit) for unit in compile_units(plan, targets) if unit.name not in units)
    return list(units.values())


def unit_counts(units: Sequence[CompileUnit]) -> dict[str, int]:
    """{"kernels": code units (CPU objects, one per part of a kernel in parts, and OpenCL binaries), "blobs": packed
    weights}: what a build reports,
    locally and on the farm, in the same terms (farm.cli.schemas.BUILD_KEYS)."""
    return {
        "kernels": sum(unit.kind != UnitKind.BLOB for unit in units),
        "blobs": sum(unit.kind == UnitKind.BLOB for unit in units),
    }


def sized_blobs(plans: Sequence[BuildPlan]) -> dict[str, Any]:
    """Every size's weights by sha256 (sizes share the model's weights; folding may add a size's own)."""
    return {sha: data for plan in plans for sha, data in plan.blobs.items()}


def link_plan(
    plans: Sequence[BuildPlan],
    targets: Sequence[Target],
    model_name: str,
    model_sha256: str,
    units: Sequence[CompileUnit],
    sizes: Sequence[PinnedShapes] = (),
) -> dict[str, Any]:
    """What linking and finishing need besides the built bytes, as JSON (see the module docstring): one plan's, or
    with several sizes every unit once and a sub-plan per size (its pins, manifest template and layouts)."""
    unit_json = {unit.name: {**unit.to_json(), "ref": unit.cache_ref, "data_key": unit.data_key} for unit in units}
    if len(plans) == 1:
        return {**_size_link_plan(plans[0], targets, model_name, model_sha256, units), "units": unit_json}
    by_name = {unit.name: unit for unit in units}
    return {
        "units": unit_json,
        "sizes": [
            {
                "shapes": shapes_to_json(pins),
                **_size_link_plan(
                    plan,
                    targets,
                    model_name,
                    model_sha256,
                    [by_name[unit.name] for unit in compile_units(plan, targets)],
                ),
            }
            for pins, plan in zip(sizes, plans, strict=True)
        ],
    }


def _size_link_plan(
    plan: BuildPlan, targets: Sequence[Target], model_name: str, model_sha256: str, units: Sequence[CompileUnit]
) -> dict[str, Any]:
    layouts = {
        kind: parts()[kind].layout(plan, chosen, [u for u in units if u.target.kind == kind])
        for kind, chosen in by_kind(targets).items()
        if chosen or parts()[kind].always
    }
    return {"manifest": manifest_template(plan, targets, model_name, model_sha256), "layouts": layouts}


def size_plans(plan_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The link plan of each size (the plan itself when it has one size): its manifest template and layouts."""
    return plan_json.get("sizes", [plan_json])


def manifest_template(plan: BuildPlan, targets: Sequence[Target], model_name: str, model_sha256: str) -> dict[str, Any]:
    """Everything the runtime and later tools need to know about the artifact, in a deterministic form, except
    what only the built bytes tell (the objects' hashes)."""
    graph = plan.graph

    def io(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "shape": list(graph.values[name].shape),
            "dtype": graph.values[name].dtype,
            "offset": plan.memory.offsets[name],
        }

    manifest = {
        "format_version": FORMAT_VERSION,
        "farm_version": __version__,
        "toolchain": toolchain_versions(),
        "model": {"name": model_name, "sha256": model_sha256, "opset": graph.opset},
        "inputs": [
            {**io(name), **({"pointer": plan.memory.pointers[name]} if name in plan.memory.pointers else {})}
            for name in graph.inputs
        ],
        "outputs": [io(name) for name in graph.outputs],
        "blobs": [
            {"sha256": sha, "bytes": int(data.nbytes), "symbol": BlobSpec(sha, data.nbytes, "").symbol}
            for sha, data in sorted(plan.blobs.items())
        ],
        "schedule": [
            {
                "node": step.node,
                "op": step.spec.op,
                "kernel": step.spec.key[:20],
                "args": [f"{arg.kind}:{arg.name}" for arg in step.args],
            }
            for step in plan.steps
        ],
        "memory_plan": plan.memory.to_json(),
    }
    for kind, chosen in by_kind(targets).items():
        if chosen or parts()[kind].always:
            manifest.update(parts()[kind].manifest_fields(plan, chosen))
    return manifest


def toolchain_versions() -> dict[str, str]:
    """The planning process's toolchain as the manifest records it for `farm inspect`: llvmlite's and LLVM's
    versions and the linker, not its label (which must change no byte). On a farm of mixed versions another
    worker may link; a label keeps such toolchains' caches apart."""
    found = toolchain()
    return {"llvmlite": found.llvmlite, "llvm": found.llvm, "linker": found.linker}


def libraries(plan_json: dict[str, Any]) -> list[dict[str, Any]]:
    """The link plan's CPU libraries to link, one per size and CPU target: its `id` (the target's id, with one
    size; `<target id>.size<i>` with several), target, schedule and link order each."""
    sub_plans = size_plans(plan_json)
    return [
        {**library, "id": library_id(library["target"]["id"], index, len(sub_plans))}
        for index, sub_plan in enumerate(sub_plans)
        for library in sub_plan["layouts"].get("cpu", {}).get("libraries", [])
    ]


def library_id(target_id: str, size: int, sizes: int) -> str:
    """How a build names one size's library for a CPU target (a farm link task's argument, a record's key)."""
    return target_id if sizes == 1 else f"{target_id}.size{size}"


def link_library(plan_json: dict[str, Any], library: str, built: BuiltUnits) -> bytes:
    """The shared library `library` (a libraries() id) from its built objects; BuildError when the plan has none
    of that id."""
    from farm.errors import BuildError

    found = next((entry for entry in libraries(plan_json) if entry["id"] == library), None)
    if found is None:
        raise BuildError(f"the link plan has no library {library[:200]!r}")
    return link_target(found, built.object_of, built.entry_of)


def artifact_contents(plan_json: dict[str, Any], built: BuiltUnits) -> tuple[dict[str, Any], dict[str, Member]]:
    """The artifact's manifest and members, from the link plan and what was built: one size's as its parts
    assemble them; several sizes' combined (the module docstring)."""
    if "sizes" not in plan_json:
        return _size_contents(plan_json, built)
    manifest: dict[str, Any] = {}
    members: dict[str, Member] = {}
    count = len(plan_json["sizes"])
    for index, sub_plan in enumerate(plan_json["sizes"]):

        def library_of(target_id: str, index: int = index) -> bytes:
            return built.library_of(library_id(target_id, index, count))

        size_built = dataclasses.replace(built, library_of=library_of)
        size_manifest, size_members = _size_contents(sub_plan, size_built)
        size_manifest["targets"] = [
            _moved_library(target, size_members, index) for target in size_manifest.get("targets", [])
        ]
        manifest.update({key: size_manifest[key] for key in COMMON_FIELDS if key in size_manifest})
        manifest.setdefault("sizes", []).append(
            {"shapes": sub_plan["shapes"], **{k: v for k, v in size_manifest.items() if k not in COMMON_FIELDS}}
        )
        members.update(size_members)
    return {**manifest, "format_version": SIZED_FORMAT_VERSION}, members


def _moved_library(target: dict[str, Any], members: dict[str, Member], size: int) -> dict[str, Any]:
    """A CPU target of size `size` with its library moved under sizes/<size>/ (in `members` too)."""
    moved = f"sizes/{size}/{target['library']}"
    members[moved] = members.pop(target["library"])
    return {**target, "library": moved}


def _size_contents(plan_json: dict[str, Any], built: BuiltUnits) -> tuple[dict[str, Any], dict[str, Member]]:
    manifest: dict[str, Any] = dict(plan_json["manifest"])
    members: dict[str, Member] = {}
    for kind, layout in plan_json["layouts"].items():
        fields, part_members = parts()[kind].assemble(layout, plan_json["manifest"], built)
        manifest.update(fields)
        members.update(part_members)
    return manifest, members


def unit_nodes(plan_json: dict[str, Any], unit: CompileUnit) -> list[str]:
    """The ONNX nodes a unit serves (from the link plan's manifests: the first size that has it), so that an
    error can name them."""
    for sub_plan in size_plans(plan_json):
        nodes = parts()[unit.target.kind].nodes_of(sub_plan["manifest"], unit)
        if nodes:
            return nodes
    return []


def manifest_names(manifest: dict[str, Any], model_sha256: str, model_name: str, targets: Sequence[Target]) -> bool:
    """Whether an artifact's manifest names this model (bytes and name) and exactly these targets in every size. A
    cache ref is only a pointer: an artifact reused from the cache must say it was built from what was submitted."""
    model = manifest.get("model")
    return (
        isinstance(model, dict)
        and model.get("sha256") == model_sha256
        and model.get("name") == model_name
        and all(
            parts()[kind].names_targets(size, chosen)
            for size in size_manifests(manifest)
            for kind, chosen in by_kind(targets).items()
        )
    )
