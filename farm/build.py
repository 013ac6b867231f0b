"""A whole build on this machine: import, optimise, plan, compile in the local executor, link, write the artifact."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm import __version__
from farm.artifact import FORMAT_VERSION, write_artifact
from farm.codegen.blobs import pack_blob
from farm.codegen.cpu import compile_cpu_kernel
from farm.codegen.entry import ENTRY_SYMBOL, compile_entry
from farm.codegen.link import link_library
from farm.codegen.targets import CpuTarget, host_target
from farm.executors import Job, LocalExecutor
from farm.frontend import import_model, validate
from farm.ops import SUPPORTED_OPS
from farm.passes import optimize
from farm.plan import Arg, BuildPlan, for_target, make_plan
from farm.specs import BlobSpec, canonical_json

ProgressCallback = Callable[[int, int], None]


@dataclass
class BuildResult:
    job_id: str
    artifact: str
    kernels: int
    blobs: int
    seconds: float
    targets: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": "done", "artifact": self.artifact, "kernels": self.kernels,
                "blobs": self.blobs, "seconds": round(self.seconds, 3), "targets": self.targets}


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
                executor: LocalExecutor | None = None, progress: ProgressCallback | None = None) -> BuildResult:
    """Build `<out_dir>/<model-stem>.farm`; the artifact appears only when every step succeeded."""
    started = time.perf_counter()
    targets = list(targets) or [host_target()]
    model_bytes = Path(model_path).read_bytes()
    plan = plan_model(model_path)
    kernel_jobs, blob_jobs = _compile_jobs(plan, targets)
    compiled = _run(executor, kernel_jobs + blob_jobs, progress)
    objects = dict(zip((job.name for job in kernel_jobs + blob_jobs), compiled))
    libraries = {t.id: link_library(_library_objects(plan, t, objects), t) for t in targets}
    manifest = build_manifest(plan, targets, model_path, hashlib.sha256(model_bytes).hexdigest(), objects)
    members = {f"targets/{t.id}/model.so": libraries[t.id] for t in targets}
    os.makedirs(out_dir, exist_ok=True)
    artifact = write_artifact(os.path.abspath(os.path.join(out_dir, f"{Path(model_path).stem}.farm")), manifest,
                              members)
    return BuildResult(job_id_for(manifest["model"]["sha256"], targets), artifact, len(kernel_jobs),
                       len(blob_jobs), time.perf_counter() - started, [t.id for t in targets])


def _compile_jobs(plan: BuildPlan, targets: Sequence[CpuTarget]) -> tuple[list[Job], list[Job]]:
    """One job per distinct kernel per target and one per distinct blob per target, named by symbol."""
    kernels = [Job(f"{t.id}/{spec.symbol}", compile_cpu_kernel, (spec, t))
               for t in targets for spec in (for_target(s, t.id) for s in plan.kernels().values())]
    blobs = [Job(f"{t.id}/{_blob_spec(sha, data.nbytes, t).symbol}", pack_blob,
                 (_blob_spec(sha, data.nbytes, t), t, memoryview(data).cast("B")), big_bytes=True)
             for t in targets for sha, data in plan.blobs.items()]
    return kernels, blobs


def _blob_spec(sha: str, nbytes: int, target: CpuTarget) -> BlobSpec:
    return BlobSpec(sha, nbytes, target.id)


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
    """The entry's call list for `target`: kernel symbols and arena offsets or blob symbols."""
    return [{"kernel": for_target(step.spec, target.id).symbol, "args": [_entry_arg(plan, arg, target)
                                                                         for arg in step.args]}
            for step in plan.steps]


def _entry_arg(plan: BuildPlan, arg: Arg, target: CpuTarget) -> list:
    if arg.kind == "arena":
        return ["arena", plan.memory.offsets[arg.name]]
    return ["blob", _blob_spec(arg.name, plan.blobs[arg.name].nbytes, target).symbol]


def _library_objects(plan: BuildPlan, target: CpuTarget, objects: dict[str, bytes]) -> list[bytes]:
    """The target's kernel and blob objects in name order, then its entry."""
    mine = [objects[name] for name in sorted(objects) if name.startswith(f"{target.id}/")]
    return mine + [compile_entry(schedule_for(plan, target), target)]


def build_manifest(plan: BuildPlan, targets: Sequence[CpuTarget], model_path: str | os.PathLike, model_sha256: str,
                   objects: dict[str, bytes]) -> dict[str, Any]:
    """Everything the runtime and later tools need to know about the artifact, in a deterministic form."""
    graph = plan.graph
    io = lambda name: {"name": name, "shape": list(graph.values[name].shape),  # noqa: E731
                       "dtype": graph.values[name].dtype, "offset": plan.memory.offsets[name]}
    return {
        "format_version": FORMAT_VERSION,
        "farm_version": __version__,
        "model": {"name": Path(model_path).stem, "sha256": model_sha256, "opset": graph.opset},
        "inputs": [io(name) for name in graph.inputs],
        "outputs": [io(name) for name in graph.outputs],
        "targets": [{**t.to_json(), "library": f"targets/{t.id}/model.so", "entry": ENTRY_SYMBOL} for t in targets],
        "kernels": _kernel_entries(plan, targets, objects),
        "blobs": [{"sha256": sha, "bytes": int(data.nbytes), "symbol": _blob_spec(sha, data.nbytes, targets[0]).symbol}
                  for sha, data in sorted(plan.blobs.items())],
        "schedule": [{"node": step.node, "op": step.spec.op, "kernel": step.spec.key[:20],
                      "args": [f"{arg.kind}:{arg.name}" for arg in step.args]} for step in plan.steps],
        "memory_plan": plan.memory.to_json(),
    }


def _kernel_entries(plan: BuildPlan, targets: Sequence[CpuTarget], objects: dict[str, bytes]) -> list[dict]:
    nodes: dict[str, list[str]] = {}
    for step in plan.steps:
        nodes.setdefault(step.spec.key, []).append(step.node)
    entries = []
    for key, spec in sorted(plan.kernels().items()):
        for target in targets:
            symbol = for_target(spec, target.id).symbol
            entries.append({"kernel": key[:20], "op": spec.op, "target": target.id, "symbol": symbol,
                            "spec": spec.to_json(), "nodes": nodes[key],
                            "object_sha256": hashlib.sha256(objects[f"{target.id}/{symbol}"]).hexdigest()})
    return entries
