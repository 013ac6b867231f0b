"""A whole build on this machine: import, optimise, plan, compile in the local executor, link, write the artifact."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm import __version__
from farm.artifact import FORMAT_VERSION, write_artifact
from farm.backends.llvm.blobs import pack_blob
from farm.backends.llvm.entry import ENTRY_SYMBOL, LAUNCH_SYMBOL, WORK_SYMBOL, compile_entry
from farm.backends.llvm.kernel import compile_cpu_kernel, cpu_launches, packed_params
from farm.backends.llvm.link import link_library
from farm.backends.llvm.target import CpuTarget, host_target
from farm.build.executor import Job, LocalExecutor
from farm.frontend.onnx_import import import_model, validate
from farm.frontend.passes import optimize
from farm.ir.specs import BlobSpec, KernelSpec, canonical_json
from farm.ops import SUPPORTED_OPS
from farm.plan.planner import BuildPlan, make_plan
from farm.store import FileStore, Store, default_store_root
from farm.tuning.variants import TuningReport, choose_variants, manifest_variant

ProgressCallback = Callable[[int, int], None]


@dataclass
class BuildResult:
    job_id: str
    artifact: str
    kernels: int
    blobs: int
    seconds: float
    targets: list[str] = field(default_factory=list)
    tuning: TuningReport | None = None
    """What `--tune` did (None when it wasn't asked for)."""

    def to_json(self) -> dict[str, Any]:
        data = {"job_id": self.job_id, "state": "done", "artifact": self.artifact, "kernels": self.kernels,
                "blobs": self.blobs, "seconds": round(self.seconds, 3), "targets": self.targets}
        return {**data, "tuning": self.tuning.to_json()} if self.tuning else data


def job_id_for(model_sha256: str, targets: Sequence[CpuTarget]) -> str:
    """The same model and options always name the same job."""
    text = canonical_json([__version__, model_sha256, [t.id for t in targets]])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plan_model(model_path: str | os.PathLike) -> BuildPlan:
    """Import, optimise and validate the model, then plan it; raises before any compiling on bad input."""
    graph = optimize(import_model(model_path))
    validate(graph, SUPPORTED_OPS)
    return make_plan(graph)


def build_model(model_path: str | os.PathLike, out_dir: str | os.PathLike, targets: Sequence[CpuTarget] = (),
                executor: LocalExecutor | None = None, progress: ProgressCallback | None = None,
                opencl: Sequence[str] = (), tune: bool = False, retune: bool = False, store: Store | None = None,
                tune_progress: ProgressCallback | None = None) -> BuildResult:
    """Build `<out_dir>/<model-stem>.farm`; the artifact appears only when every step succeeded.

    `opencl`: device fingerprints to build program binaries for. With neither CPU targets nor devices, the
    artifact is for this host's CPU. Every tunable kernel uses the variant the tuning database in `store` (default:
    the local store, farm.store.default_store_root) holds for its target; `tune` first times, on this host, the
    kernels it lacks for targets this host can run (`retune`: all of them), reporting each one to `tune_progress`.
    """
    started = time.perf_counter()
    targets = list(targets) or ([] if opencl else [host_target()])
    model_bytes = Path(model_path).read_bytes()
    plan = plan_model(model_path)
    plan, tuning = choose_variants(plan, targets, store or FileStore(default_store_root()), tune, retune, tune_progress)
    units = compile_units(plan, targets)
    compiled = _run(executor, [_local_job(unit, plan) for unit in units], progress)
    objects = {unit.name: data for unit, data in zip(units, compiled)}
    template = manifest_template(plan, targets, Path(model_path).stem, hashlib.sha256(model_bytes).hexdigest())
    manifest = complete_manifest(template, {name: hashlib.sha256(data).hexdigest() for name, data in objects.items()})
    members = {library_member(t): link_library(library_objects(plan, t, objects), t) for t in targets}
    if opencl:
        from farm.backends.opencl.part import opencl_part

        manifest["opencl"], opencl_members = opencl_part(plan, opencl, lambda jobs: _run(executor, jobs, None))
        members.update(opencl_members)
    os.makedirs(out_dir, exist_ok=True)
    artifact = write_artifact(os.path.abspath(os.path.join(out_dir, f"{Path(model_path).stem}.farm")), manifest,
                              members)
    kernels = sum(unit.kind == "kernel" for unit in units)
    return BuildResult(job_id_for(manifest["model"]["sha256"], targets), artifact, kernels, len(units) - kernels,
                       time.perf_counter() - started, [t.id for t in targets] + [f"opencl:{fp}" for fp in opencl],
                       tuning if tune or retune else None)


@dataclass(frozen=True)
class CompileUnit:
    """One object to build: a kernel or a blob for one target. `name` (target id / symbol) orders the link."""

    kind: str
    spec: KernelSpec | BlobSpec
    target: CpuTarget

    @property
    def name(self) -> str:
        return f"{self.target.id}/{self.spec.symbol}"

    @property
    def cache_ref(self) -> str:
        """The store ref under which the compiled object is cached (the spec's content key)."""
        return f"{self.kind}:{self.spec.key}"


def compile_units(plan: BuildPlan, targets: Sequence[CpuTarget]) -> list[CompileUnit]:
    """Every distinct kernel (with its variant for the target) and every distinct blob as the target's kernels
    read it (plain, or pre-packed for a Gemm), for every target: the build's compile work."""
    kernels = [CompileUnit("kernel", plan.kernel_for(spec, t.id), t) for t in targets for spec in plan.kernels().values()]
    blobs = [CompileUnit("blob", blob, t) for t in targets
             for blob in dict.fromkeys(blob for step in blob_args(plan, t) for blob in step.values())]
    return kernels + blobs


def compile_unit(unit: CompileUnit, blob_data: bytes | memoryview | None = None) -> bytes:
    """The object of one unit: the pure step both executors call."""
    if unit.kind == "kernel":
        return compile_cpu_kernel(unit.spec, unit.target)
    return pack_blob(unit.spec, unit.target, blob_data)


def _local_job(unit: CompileUnit, plan: BuildPlan) -> Job:
    if unit.kind == "kernel":
        return Job(unit.name, compile_cpu_kernel, (unit.spec, unit.target))
    data = memoryview(plan.blobs[unit.spec.data_sha256]).cast("B")
    return Job(unit.name, pack_blob, (unit.spec, unit.target, data), big_bytes=True)


def blob_args(plan: BuildPlan, target: CpuTarget) -> list[dict[int, BlobSpec]]:
    """Per step, the BlobSpec of each of its blob arguments on `target`, by argument index: pre-packed in panels
    where the step's kernel reads that parameter so (codegen.cpu.packed_params), else the plain bytes."""
    packing: dict[str, dict[int, tuple[int, int, int]]] = {}
    steps = []
    for step in plan.steps:
        spec = plan.kernel_for(step.spec, target.id)
        if spec.key not in packing:
            packing[spec.key] = packed_params(spec, target)
        steps.append({index: BlobSpec(arg.name, plan.blobs[arg.name].nbytes, target.id, packing[spec.key].get(index))
                      for index, arg in enumerate(step.args) if arg.kind == "blob"})
    return steps


def library_member(target: CpuTarget) -> str:
    return f"targets/{target.id}/model.so"


def _run(executor: LocalExecutor | None, jobs: list[Job], progress: ProgressCallback | None) -> list[bytes]:
    done = [0]

    def on_done(job: Job) -> None:
        done[0] += 1
        if progress:
            progress(done[0], len(jobs))

    if executor is not None:
        return executor.run(jobs, on_done)
    with LocalExecutor() as local:
        return local.run(jobs, on_done)


def schedule_for(plan: BuildPlan, target: CpuTarget) -> list[dict[str, Any]]:
    """The entry's call list for `target`: kernel symbols, arena offsets or blob symbols, and the kernel's launches
    ([extent, grain, work] each)."""
    launches, blobs = step_launches(plan, target), blob_args(plan, target)
    return [{"kernel": plan.kernel_for(step.spec, target.id).symbol,
             "args": [["blob", step_blobs[index].symbol] if arg.kind == "blob" else
                      ["arena", plan.memory.offsets[arg.name]] for index, arg in enumerate(step.args)],
             "launches": step_launch}
            for step, step_launch, step_blobs in zip(plan.steps, launches, blobs)]


def step_launches(plan: BuildPlan, target: CpuTarget) -> list[list[list[int]]]:
    """Each step's launches on `target` (each distinct kernel lowered once; a Gemm's grain is its variant's)."""
    by_key: dict[str, list[list[int]]] = {}
    for step in plan.steps:
        if step.spec.key not in by_key:
            by_key[step.spec.key] = cpu_launches(plan.kernel_for(step.spec, target.id), target)
    return [by_key[step.spec.key] for step in plan.steps]


def link_order(names: Sequence[str], target: CpuTarget) -> list[str]:
    """The target's unit names in the order their objects are linked (before the entry)."""
    return sorted(name for name in names if name.startswith(f"{target.id}/"))


def library_objects(plan: BuildPlan, target: CpuTarget, objects: Mapping[str, bytes]) -> list[bytes]:
    """The target's kernel and blob objects in link order, then its entry."""
    ordered = [objects[name] for name in link_order(list(objects), target)]
    return ordered + [compile_entry(schedule_for(plan, target), target)]


def complete_manifest(template: dict[str, Any], object_sha256: Mapping[str, str]) -> dict[str, Any]:
    """The manifest with each kernel's object sha256 filled in (by unit name: target id / symbol)."""
    kernels = [{**entry, "object_sha256": object_sha256[f"{entry['target']}/{entry['symbol']}"]}
               for entry in template["kernels"]]
    return {**template, "kernels": kernels}


def manifest_template(plan: BuildPlan, targets: Sequence[CpuTarget], model_name: str,
                      model_sha256: str) -> dict[str, Any]:
    """Everything the runtime and later tools need to know about the artifact, in a deterministic form, except
    the compiled objects' hashes (complete_manifest adds them once the objects exist)."""
    graph = plan.graph
    io = lambda name: {"name": name, "shape": list(graph.values[name].shape),  # noqa: E731
                       "dtype": graph.values[name].dtype, "offset": plan.memory.offsets[name]}
    return {
        "format_version": FORMAT_VERSION,
        "farm_version": __version__,
        "model": {"name": model_name, "sha256": model_sha256, "opset": graph.opset},
        "inputs": [io(name) for name in graph.inputs],
        "outputs": [io(name) for name in graph.outputs],
        "targets": [{**t.to_json(), "library": library_member(t), "entry": ENTRY_SYMBOL,
                     "launch_entry": LAUNCH_SYMBOL, "work_entry": WORK_SYMBOL,
                     "launches": [launch for step in step_launches(plan, t) for launch in step]} for t in targets],
        "kernels": _kernel_entries(plan, targets),
        "blobs": [{"sha256": sha, "bytes": int(data.nbytes), "symbol": BlobSpec(sha, data.nbytes, "").symbol}
                  for sha, data in sorted(plan.blobs.items())],
        "schedule": [{"node": step.node, "op": step.spec.op, "kernel": step.spec.key[:20],
                      "args": [f"{arg.kind}:{arg.name}" for arg in step.args]} for step in plan.steps],
        "memory_plan": plan.memory.to_json(),
    }


def _kernel_entries(plan: BuildPlan, targets: Sequence[CpuTarget]) -> list[dict]:
    nodes: dict[str, list[str]] = {}
    for step in plan.steps:
        nodes.setdefault(step.spec.key, []).append(step.node)
    entries = []
    for key, spec in sorted(plan.kernels().items()):
        for target in targets:
            symbol = plan.kernel_for(spec, target.id).symbol
            entries.append({"kernel": key[:20], "op": spec.op, "target": target.id, "symbol": symbol,
                            "spec": spec.to_json(), "nodes": nodes[key], "object_sha256": None,
                            **manifest_variant(plan, spec, target)})
    return entries
