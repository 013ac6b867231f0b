"""The CPU backend's part of a build: a kernel object per distinct kernel and, per weight that a target's kernels
read pre-packed in panels, the packed bytes; then per target an entry object (farm_run, farm_launch, farm_work,
farm_run_steps) and one shared library of code alone. Weights are members of the artifact (`weights/<sha256>.bin`
as the model has them, `targets/<id>/weights/<symbol>.bin` packed), which the runtime maps and hands to the entry
through a table of pointers after the arena (see `target_weights`); the manifest's `targets` and `kernels`.

It sits above the build's core (farm.build.units, farm.build.parts), which finds it by name: `PART`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from farm.artifact import Member
from farm.backends.llvm.target import CpuTarget
from farm.backends.llvm.toolchain import toolchain
from farm.build.parts import BuiltUnits, Part, weights_member
from farm.build.units import CompileUnit, Data, UnitKindTraits, compile_kernel
from farm.ir.specs import CODEGEN_VERSION, BlobSpec, KernelSpec, canonical_json
from farm.ir.unit_kinds import UnitKind
from farm.plan.memory import MemoryPlan
from farm.plan.planner import BuildPlan
from farm.store import refs


def _runs_nothing_at_load(data: bytes, what: str) -> None:
    from farm.backends.llvm.link import check_no_startup_code

    check_no_startup_code(data, what)


def _pack_weights(spec: BlobSpec, target: CpuTarget, data: Data) -> bytes:
    from farm.backends.llvm.blobs import pack_weights

    assert data is not None, "a blob unit's step is given the weights it packs"
    return pack_weights(spec, target, data)


UNIT_KINDS: dict[UnitKind, UnitKindTraits] = {
    UnitKind.KERNEL: UnitKindTraits(
        "kernel",
        KernelSpec,
        compile_kernel,
        lambda spec, target: refs.kernel(toolchain().compiler_key, spec.key),
        verify=_runs_nothing_at_load,
    ),
    UnitKind.BLOB: UnitKindTraits(
        "packed weight",
        BlobSpec,
        _pack_weights,
        lambda spec, target: refs.blob(toolchain().compiler_key, spec.key),
        big_bytes=True,
    ),
}


def entry_object(library: dict[str, Any]) -> bytes:
    """A CPU library's entry object (a libraries() entry's schedule compiled for its target): the pure step that
    makes it, wherever it is made (the farm's link plan step, a link that finds no cached copy, a local build)."""
    from farm.backends.llvm.entry import compile_entry

    return compile_entry(library["schedule"], _library_target(library), library["weights_offset"])


def _library_target(library: dict[str, Any]) -> CpuTarget:
    """The target of a libraries() entry: a CPU one, as CpuPart.layout writes every entry."""
    from farm.backends.registry import target_from_json

    target = target_from_json(library["target"])
    assert isinstance(target, CpuTarget), f"a CPU library's target is a CPU one, not {target.id}"
    return target


def entry_ref(library: dict[str, Any]) -> str:
    """The store ref of a library's entry object as this process's compiler builds it: everything entry_object
    reads (schedule, target, weight-table offset) and farm's codegen version, hashed, under the compiler key, as
    a unit's ref is (so a link never takes another toolchain's entry)."""
    inputs = canonical_json([CODEGEN_VERSION, library["target"], library["weights_offset"], library["schedule"]])
    return refs.entry(toolchain().compiler_key, hashlib.sha256(inputs.encode()).hexdigest())


def blob_args(plan: BuildPlan, target: CpuTarget) -> list[dict[int, BlobSpec]]:
    """Per step, the BlobSpec of each of its blob arguments on `target`, by argument index: pre-packed in panels
    where the step's kernel reads that parameter so (backends.llvm.kernel.packed_params), else the plain bytes."""
    from farm.backends.llvm.kernel import packed_params

    packing: dict[str, dict[int, tuple[int, ...]]] = {}
    steps = []
    for step in plan.steps:
        spec = plan.kernel_for(step.spec, target.id)
        if spec.key not in packing:
            packing[spec.key] = packed_params(spec, target)
        steps.append(
            {
                index: BlobSpec(arg.name, plan.blobs[arg.name].nbytes, target.id, packing[spec.key].get(index))
                for index, arg in enumerate(step.args)
                if arg.kind == "blob"
            }
        )
    return steps


def library_member(target_id: str) -> str:
    return f"targets/{target_id}/model.so"


def packed_weights_member(target_id: str, blob: BlobSpec) -> str:
    return f"targets/{target_id}/weights/{blob.symbol}.bin"


def weight_member(target_id: str, blob: BlobSpec) -> str:
    return weights_member(blob.data_sha256) if blob.panels is None else packed_weights_member(target_id, blob)


def target_weights(plan: BuildPlan, target: CpuTarget) -> list[BlobSpec]:
    """The distinct weights `target`'s kernels read, in slot order: slot i of the entry's weight table (after the
    arena, at weights_offset) points at the i-th one's bytes."""
    return list(dict.fromkeys(blob for step in blob_args(plan, target) for blob in step.values()))


WEIGHT_TABLE_ALIGNMENT = 64


def weights_offset(plan: BuildPlan) -> int:
    """Where in the runtime's arena the weight table starts: after everything the memory plan places."""
    return -(-plan.memory.arena_bytes // WEIGHT_TABLE_ALIGNMENT) * WEIGHT_TABLE_ALIGNMENT


def step_launches(plan: BuildPlan, target: CpuTarget) -> list[list[list[int]]]:
    """Each step's launches on `target` (each distinct kernel lowered once; a Gemm's grain is its variant's)."""
    from farm.backends.llvm.kernel import cpu_launches

    by_key: dict[str, list[list[int]]] = {}
    for step in plan.steps:
        if step.spec.key not in by_key:
            by_key[step.spec.key] = cpu_launches(plan.kernel_for(step.spec, target.id), target)
    return [by_key[step.spec.key] for step in plan.steps]


def schedule_for(plan: BuildPlan, target: CpuTarget) -> list[dict[str, Any]]:
    """The entry's call list for `target`: kernel symbols, arena offsets or weight slots (target_weights), and the
    kernel's launches ([extent, grain, work] each)."""
    launches, blobs = step_launches(plan, target), blob_args(plan, target)
    slots = {blob: slot for slot, blob in enumerate(target_weights(plan, target))}
    return [
        {
            "kernel": plan.kernel_for(step.spec, target.id).symbol,
            "args": [
                ["weight", slots[step_blobs[index]]] if arg.kind == "blob" else _arena_arg(plan.memory, arg.name)
                for index, arg in enumerate(step.args)
            ],
            "launches": step_launch,
        }
        for step, step_launch, step_blobs in zip(plan.steps, launches, blobs)
    ]


def _arena_arg(memory: MemoryPlan, name: str) -> list[int | str]:
    """An arena buffer's argument: ["arena", offset], or for a model input's bytes (the input, or a reshape placed on
    it) ["input", offset, the input's pointer slot, offset inside the input], which the entry reads from the feed in
    place when the runtime put its address in the slot."""
    within = memory.input_within(name)
    if within is None:
        return ["arena", memory.offsets[name]]
    model_input, inner = within
    return ["input", memory.offsets[name], memory.pointers[model_input], inner]


def kernel_units(spec: KernelSpec, target: CpuTarget) -> list[KernelSpec]:
    """The specs of a kernel's units on `target`: the kernel, or each part of its code (kernel_parts)."""
    from farm.backends.llvm.kernel import kernel_parts

    parts = kernel_parts(spec, target)
    return [spec] if parts == 1 else [dataclasses.replace(spec, part=(index, parts)) for index in range(parts)]


def link_order(units: Sequence[CompileUnit], target: CpuTarget) -> list[str]:
    """The names of the target's kernel units in the order their objects are linked (before the entry)."""
    return sorted(unit.name for unit in units if unit.kind == UnitKind.KERNEL and unit.target.id == target.id)


def link_target(
    library: dict[str, Any],
    object_of: Callable[[str], Member],
    entry_of: Callable[[dict[str, Any]], bytes] | None = None,
) -> bytes:
    """One CPU target's shared library: its kernels' objects in link order, then its entry (entry_of: from the
    schedule), then the functions LLVM's calls from kernels into a compiler runtime need
    (farm.backends.llvm.compiler_runtime)."""
    from farm.backends.llvm.compiler_runtime import runtime_object
    from farm.backends.llvm.link import link_library

    target = _library_target(library)
    objects = [_object_bytes(object_of(name)) for name in library["order"]]
    entry = (entry_of or entry_object)(library)
    return link_library([*objects, entry, runtime_object(target)], target)


def _object_bytes(data: Member) -> bytes:
    """A kernel unit's object, which is bytes (only blob units, packed weights, are made as they are written)."""
    assert isinstance(data, bytes), "a kernel unit's object is bytes"
    return data


class CpuPart(Part[CpuTarget]):
    kind = "cpu"
    always = True
    unit_kinds = UNIT_KINDS

    def start(self, targets: Sequence[CpuTarget]) -> None:
        """Each target's required features (its manifest's `requires`), probed while the build plans and compiles."""
        from farm.backends.llvm.features import probe_in_background

        for target in targets:
            probe_in_background(target)

    def units(self, plan: BuildPlan, targets: Sequence[CpuTarget]) -> list[CompileUnit]:
        """A kernel unit per distinct kernel, or per part of one whose code is split (kernel_parts), a blob unit
        per weight the target reads packed (plain weights are the model's bytes: nothing to build)."""
        kernels = [
            CompileUnit(UnitKind.KERNEL, part, t)
            for t in targets
            for spec in plan.kernels().values()
            for part in kernel_units(plan.kernel_for(spec, t.id), t)
        ]
        blobs = [
            CompileUnit(UnitKind.BLOB, blob, t)
            for t in targets
            for blob in target_weights(plan, t)
            if blob.panels is not None
        ]
        return kernels + blobs

    def layout(self, plan: BuildPlan, targets: Sequence[CpuTarget], units: Sequence[CompileUnit]) -> dict[str, Any]:
        return {
            "libraries": [
                {
                    "target": t.to_json(),
                    "schedule": schedule_for(plan, t),
                    "order": link_order(units, t),
                    "weights_offset": weights_offset(plan),
                }
                for t in targets
            ],
            "weights": {
                weight_member(t.id, blob): (
                    f"{t.id}/{blob.symbol}" if blob.panels is not None else None,
                    blob.data_sha256,
                )
                for t in targets
                for blob in target_weights(plan, t)
            },
        }

    def manifest_fields(self, plan: BuildPlan, targets: Sequence[CpuTarget]) -> dict[str, Any]:
        from farm.backends.llvm.entry import ENTRY_SYMBOL, LAUNCH_SYMBOL, WORK_SYMBOL, serving_entries
        from farm.backends.llvm.features import required_features

        return {
            "targets": [
                {
                    **t.to_json(),
                    "requires": required_features(t),
                    "library": library_member(t.id),
                    "entry": ENTRY_SYMBOL,
                    "launch_entry": LAUNCH_SYMBOL,
                    "work_entry": WORK_SYMBOL,
                    **serving_entries(t),
                    "launches": [launch for step in step_launches(plan, t) for launch in step],
                    "weights": [weight_member(t.id, blob) for blob in target_weights(plan, t)],
                    "weights_offset": weights_offset(plan),
                }
                for t in targets
            ],
            "kernels": _kernel_entries(plan, targets),
        }

    def assemble(
        self, layout: dict[str, Any], manifest: dict[str, Any], built: BuiltUnits
    ) -> tuple[dict[str, Any], dict[str, Member]]:
        ids = [library["target"]["id"] for library in layout["libraries"]]
        members: dict[str, Member] = {library_member(target_id): built.library_of(target_id) for target_id in ids}
        members.update(
            {
                member: built.object_of(unit) if unit else built.blob_of(sha)
                for member, (unit, sha) in layout.get("weights", {}).items()
            }
        )
        kernels = [
            {**entry, "object_sha256": built.sha256_of(f"{entry['target']}/{entry['symbol']}")}
            for entry in manifest["kernels"]
        ]
        return {"kernels": kernels}, members

    def names_targets(self, manifest: dict[str, Any], targets: Sequence[CpuTarget]) -> bool:
        listed = manifest.get("targets")
        return isinstance(listed, list) and [entry.get("id") for entry in listed if isinstance(entry, dict)] == [
            t.id for t in targets
        ]

    def nodes_of(self, manifest: dict[str, Any], unit: CompileUnit) -> list[str]:
        """A kernel's nodes, or the nodes that read a blob's weights."""
        if unit.data_key:
            return [step["node"] for step in manifest["schedule"] if f"blob:{unit.data_key}" in step["args"]]
        return next(
            (
                entry["nodes"]
                for entry in manifest["kernels"]
                if entry["symbol"] == unit.spec.symbol and entry["target"] == unit.target.id
            ),
            [],
        )


def _kernel_entries(plan: BuildPlan, targets: Sequence[CpuTarget]) -> list[dict]:
    from farm.tuning.variants import manifest_variant

    nodes: dict[str, list[str]] = {}
    for step in plan.steps:
        nodes.setdefault(step.spec.key, []).append(step.node)
    entries = []
    for key, spec in sorted(plan.kernels().items()):
        for target in targets:
            symbol = plan.kernel_for(spec, target.id).symbol
            entries.append(
                {
                    "kernel": key[:20],
                    "op": spec.op,
                    "target": target.id,
                    "symbol": symbol,
                    "spec": spec.to_json(),
                    "nodes": nodes[key],
                    "object_sha256": None,
                    **manifest_variant(plan, spec, target),
                }
            )
    return entries


PART = CpuPart()
