"""Farm jobs: the orchestration steps that the Celery tasks in tasks/ run (records live in farm/distributed/board.py).

Nothing here imports Celery: each step gets a `dispatch(task_name, args)` callable to enqueue what follows, so the
logic stays plain Python and tasks/ stays thin. Big bytes go through the store; records and messages hold keys.

A job moves queued -> planning -> compiling -> linking -> done, or to failed or cancelled from any live state; with
`--tune`, planning first dispatches tuning tasks (state tuning) and the last of them plans the job again.
Progress is counted with Redis sets (one member per finished unit), so a task redelivered after its worker died
counts once, and exactly one task sees the last unit of a phase finish and dispatches the next phase.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm import defaults
from farm.artifact import artifact_bytes, manifest_of
from farm.backends.llvm.entry import compile_entry
from farm.backends.llvm.link import link_library
from farm.backends.llvm.target import CpuTarget
from farm.build.assembly import (
    CompileUnit,
    compile_unit,
    compile_units,
    complete_manifest,
    library_member,
    link_order,
    manifest_template,
    plan_model,
    schedule_for,
)
from farm.distributed.board import TERMINAL, JobBoard, JobState
from farm.errors import ArtifactError, BadInputError, FarmError
from farm.ir.specs import CODEGEN_VERSION, BlobSpec, KernelSpec, canonical_json
from farm.plan.planner import BuildPlan
from farm.store import CorruptEntryError, MissingEntryError, Store, StoreUnreachableError
from farm.tuning import variants as tuning

Dispatch = Callable[..., None]
"""dispatch(task_name, args, queue=None): enqueue a task (on its fixed queue unless one is given)."""


def unit_to_json(unit: CompileUnit) -> dict[str, Any]:
    return {"kind": unit.kind, "spec": unit.spec.to_json(), "target": unit.target.to_json()}


def unit_from_json(data: dict[str, Any]) -> CompileUnit:
    spec_type = KernelSpec if data["kind"] == "kernel" else BlobSpec
    return CompileUnit(data["kind"], spec_type.from_json(data["spec"]), CpuTarget.from_json(data["target"]))


class Farm:
    """What every step needs: the job board, the store and a way to enqueue the next tasks."""

    def __init__(self, board: JobBoard, store: Store, dispatch: Dispatch,
                 before_build: Callable[[str], None] = lambda unit_name: None,
                 live_queues: Callable[[], set[str]] = set) -> None:
        """`before_build(unit name)` runs just before a unit is built (the worker's fault-injection hook);
        `live_queues()` names the queues that live workers consume now (tuning is dispatched only to those)."""
        self.board, self.store, self.dispatch, self.before_build = board, store, dispatch, before_build
        self.live_queues = live_queues

    # -- plan ----------------------------------------------------------------------------------------------------

    def plan_job(self, job_id: str) -> None:
        """Plan the model, choose its variants (first dispatching its tuning, with --tune), put its blobs in the
        store, dispatch every unit the cache doesn't already hold."""
        record = self.board.get(job_id)
        if record is None or record["state"] in TERMINAL or self._reuse_artifact(job_id, record):
            return
        if not self.board.advance(job_id, JobState.PLANNING):
            return
        try:
            plan = self._plan(record)
        except BadInputError as error:
            self.board.fail(job_id, _submitted_path(str(error)), error.exit_status)
            return
        targets = [CpuTarget.from_json(t) for t in json.loads(record["targets"])]
        if self._dispatch_tuning(job_id, plan, targets, record):
            return
        plan = tuning.with_variants(self.store, plan, targets)
        units = compile_units(plan, targets)
        todo = [u for u in units if record.get("no_cache") == "True" or not self._cached(u)]
        if "total" in record:
            todo = [u for u in todo if not self.board.is_complete(job_id, "compile", u.name)]
        fingerprints = json.loads(record.get("opencl", "[]"))
        cl_todo = self._cl_todo(job_id, plan, fingerprints, record)
        counts = {"total": int(record.get("total", len(todo) + len(cl_todo))),
                  "kernels": sum(u.kind == "kernel" for u in units), "blobs": sum(u.kind == "blob" for u in units),
                  "targets_total": len(targets)}
        link_plan = self.store.put(self._link_plan(plan, targets, units, record, fingerprints))
        if not self.board.advance(job_id, JobState.COMPILING, plan_key=link_plan, **counts):
            return
        for name, spec, fp in cl_todo:
            self.dispatch("farm.compile_cl_kernel", [job_id, name, spec.op, fp, spec.to_json()], f"opencl.{fp}")
        self._dispatch_units(job_id, plan, todo)
        if fingerprints:
            for data in plan.blobs.values():
                self.store.put(memoryview(data).cast("B"))
        if not todo and not cl_todo:
            self._start_linking(job_id, targets)

    def _cl_todo(self, job_id: str, plan, fingerprints: list[str], record: dict[str, str]) -> list[tuple]:
        """(unit name, spec, fingerprint) of every OpenCL binary to build: not cached, not already finished."""
        from farm.backends.opencl.part import binary_member, opencl_kernels

        wanted = [(binary_member(fp, spec.symbol), spec, fp) for fp in fingerprints for spec in opencl_kernels(plan)]
        return [(name, spec, fp) for name, spec, fp in wanted
                if (record.get("no_cache") == "True" or not self._has_ref(cl_ref(spec, fp)))
                and not self.board.is_complete(job_id, "compile", name)]

    def _dispatch_units(self, job_id: str, plan, todo: list[CompileUnit]) -> None:
        """Kernels first, so that workers compile while this task is still putting weight bytes in the store;
        a blob's store key is the sha256 its spec already names."""
        for unit in sorted(todo, key=lambda u: u.kind != "kernel"):
            if unit.kind == "blob":
                self.store.put(memoryview(plan.blobs[unit.spec.data_sha256]).cast("B"))
            self.dispatch(*compile_task(job_id, unit))

    def _reuse_artifact(self, job_id: str, record: dict[str, str]) -> bool:
        """Finish at once when this farm already built the same model bytes for the same targets (unless --no-cache
        or --retune) with the variants the tuning database holds now, and --tune has nothing to time: the artifact
        is a pure function of them, so it is the cached one, byte for byte."""
        key = self.store.get_ref(artifact_ref(record))
        if record.get("no_cache") == "True" or key is None or _tuning_asked(record, "retune"):
            return False
        try:
            manifest = manifest_of(self.store.get(key))
        except (CorruptEntryError, MissingEntryError, ArtifactError):
            return False
        if not tuning.manifest_current(self.store, manifest) or (
                _tuning_asked(record, "tune") and self._tunable_on(tuning.untuned_targets(manifest))):
            return False
        self.board.advance(job_id, JobState.DONE, artifact_key=key, total=0, finished=time.time(), cached=True)
        return True

    # -- tune ----------------------------------------------------------------------------------------------------

    def _tunable_on(self, target_ids: set[str]) -> set[str]:
        """Those of `target_ids` whose tuning queue a live worker consumes (asks the workers only when needed)."""
        if not target_ids:
            return set()
        live = self.live_queues()
        return {target_id for target_id in target_ids if tuning.queue_name(target_id) in live}

    def _dispatch_tuning(self, job_id: str, plan: BuildPlan, targets: list[CpuTarget],
                         record: dict[str, str]) -> bool:
        """With --tune (or --retune), before anything compiles: dispatch a farm.tune_kernel to `tune.<cpu id>` for
        each tunable kernel the database lacks (every one with --retune) on a target whose queue a live worker
        consumes, and say in the job record which targets keep the default. True when tasks went out: the job
        waits in state tuning, and the last task plans it again."""
        if not (_tuning_asked(record, "tune") or _tuning_asked(record, "retune")):
            return False
        todo, note = self._tuning_units(job_id, plan, targets, record)
        if not todo:
            if note:
                self.board.update(job_id, tuning_note=note)
            return False
        names = (json.loads(record["tune_units"]) if "tune_units" in record
                 else [tuning.tune_name(spec, target.id) for spec, target in todo])
        if not self.board.advance(job_id, JobState.TUNING, tune_units=names, tuning_note=note):
            return True
        for spec, target in todo:
            self.dispatch("farm.tune_kernel", [job_id, tuning.tune_name(spec, target.id), spec.op, target.id,
                                               spec.to_json(), target.to_json()], tuning.queue_name(target.id))
        return True

    def _tuning_units(self, job_id: str, plan: BuildPlan, targets: list[CpuTarget],
                      record: dict[str, str]) -> tuple[list[tuple[KernelSpec, CpuTarget]], str]:
        """The (kernel, target) pairs to time, and the note on targets no live worker can time. A plan_job
        redelivered after it dispatched them gets the same units, less those finished."""
        if "tune_units" in record:
            names = set(json.loads(record["tune_units"]))
            return [(spec, target) for spec, target in tuning.missing(self.store, plan, targets, retune=True)
                    if (name := tuning.tune_name(spec, target.id)) in names
                    and not self.board.is_complete(job_id, "tune", name)], record.get("tuning_note", "")
        todo = tuning.missing(self.store, plan, targets, _tuning_asked(record, "retune"))
        served = self._tunable_on({target.id for _, target in todo})
        unserved = sorted({target.id for _, target in todo} - served)
        note = (f"no live worker consumes {', '.join(tuning.queue_name(t) for t in unserved)}: the default variant "
                "is used there" if unserved else "")
        return [(spec, target) for spec, target in todo if target.id in served], note

    def tune(self, job_id: str, name: str, spec_json: dict[str, Any], target_json: dict[str, Any]) -> None:
        """Time one kernel's variants on this worker and record the winner. Tuning never fails a job: a kernel
        whose timing fails, or whose worker dies on every delivery, keeps the default."""
        if self.board.is_over(job_id) or self.board.is_complete(job_id, "tune", name):
            return
        if self.board.count_delivery(job_id, f"tune:{name}") > defaults.max_deliveries():
            self.tune_done(job_id, name, "its worker died on every delivery")
            return
        self.before_build(name)
        spec, target = KernelSpec.from_json(spec_json), CpuTarget.from_json(target_json)
        try:
            tuning.record(self.store, spec, target, tuning.time_variants(spec_json, target_json))
        except StoreUnreachableError:
            raise
        except FarmError as error:
            self.tune_done(job_id, name, str(error))
            return
        self.tune_done(job_id, name)

    def tune_done(self, job_id: str, name: str, error: str = "") -> None:
        """Count a tuning unit finished (an error is noted in the job record; the kernel keeps the default); the
        last one plans the job again, which now finds every record it can."""
        if error:
            self.board.update(job_id, **{f"tune_error:{name}": f"{error} (the default variant is used)"})
        record = self.board.get(job_id) or {}
        finished = self.board.complete(job_id, "tune", name)
        if finished == len(json.loads(record.get("tune_units", "[]"))) and self.board.advance(
                job_id, JobState.PLANNING, tuned=True):
            self.dispatch("farm.plan_job", [job_id])

    def _plan(self, record: dict[str, str]):
        with tempfile.TemporaryDirectory(prefix="farm-job-") as folder:
            path = Path(folder) / f"{record['model_name']}.onnx"
            path.write_bytes(self.store.get(record["model_key"]))
            return plan_model(path)

    def _cached(self, unit: CompileUnit) -> bool:
        return self._has_ref(unit.cache_ref)

    def _has_ref(self, ref: str) -> bool:
        key = self.store.get_ref(ref)
        return key is not None and self.store.has(key)

    def _link_plan(self, plan, targets: list[CpuTarget], units: list[CompileUnit], record: dict[str, str],
                   fingerprints: list[str]) -> bytes:
        """What link and finish need, as JSON in the store: unit refs, schedules, link order, the manifest."""
        names = [u.name for u in units]
        return json.dumps({
            "manifest": manifest_template(plan, targets, record["model_name"], record["model_sha256"]),
            "units": {u.name: {**unit_to_json(u), "ref": u.cache_ref, "data_key": _data_key(u)} for u in units},
            "targets": [{"target": t.to_json(), "schedule": schedule_for(plan, t), "order": link_order(names, t)}
                        for t in targets],
            **({"opencl": _opencl_link_plan(plan, fingerprints)} if fingerprints else {}),
        }, sort_keys=True).encode()

    # -- compile -------------------------------------------------------------------------------------------------

    def compile(self, job_id: str, unit_json: dict[str, Any], data_key: str | None) -> None:
        """Build one unit into the store (its cache ref points at the object), then count it done."""
        unit = unit_from_json(unit_json)
        self._build_unit(job_id, unit.name, unit.kind, lambda: self._build_into_store(unit, data_key))

    def compile_cl(self, job_id: str, name: str, spec_json: dict[str, Any], device_fingerprint: str) -> None:
        """Build one kernel's program binary on this worker's device into the store, then count it done."""
        from farm.backends.opencl.kernel import compile_cl_kernel

        spec = KernelSpec.from_json(spec_json)

        def build() -> None:
            key = self.store.put(compile_cl_kernel(spec, device_fingerprint))
            self.store.set_ref(cl_ref(spec, device_fingerprint), key)

        self._build_unit(job_id, name, "OpenCL kernel", build)

    def _build_unit(self, job_id: str, name: str, kind: str, build: Callable[[], object]) -> None:
        if self.board.is_over(job_id) or self.board.is_complete(job_id, "compile", name):
            return
        if not self._below_delivery_cap(job_id, name):
            return
        self.before_build(name)
        try:
            build()
        except StoreUnreachableError:
            raise
        except FarmError as error:
            self.board.fail(job_id, f"{kind} {name} failed: {error}", error.exit_status, name)
            return
        record = self.board.get(job_id) or {}
        if self.board.complete(job_id, "compile", name) == int(record.get("total", -2)):
            self._start_linking(job_id, [CpuTarget.from_json(t) for t in json.loads(record["targets"])])

    def _below_delivery_cap(self, job_id: str, name: str) -> bool:
        deliveries, cap = self.board.count_delivery(job_id, name), defaults.max_deliveries()
        if deliveries <= cap:
            return True
        self.board.fail(job_id, f"{name} was started {cap} times and never finished (its worker died each time)",
                        unit=name)
        return False

    def _build_into_store(self, unit: CompileUnit, data_key: str | None) -> str:
        data = self.store.get(data_key) if data_key else None
        key = self.store.put(compile_unit(unit, data))
        self.store.set_ref(unit.cache_ref, key)
        return key

    def _start_linking(self, job_id: str, targets: list[CpuTarget]) -> None:
        """Link every CPU target; with none (an OpenCL-only job) go straight to finish."""
        if not self.board.advance(job_id, JobState.LINKING):
            return
        for target in targets:
            self.dispatch("farm.link", [job_id, target.id])
        if not targets:
            self.dispatch("farm.finish", [job_id])

    def _opencl_members(self, part: dict[str, Any]) -> dict[str, bytes]:
        """Sources (kept in the link plan), binaries (by their cache refs) and weights (by sha256) from the store."""
        members = {member: source.encode() for member, source in part["sources"].items()}
        members.update({member: self.store.get(self.store.get_ref(ref)) for member, ref in part["binaries"].items()})
        members.update({member: self.store.get(sha) for member, sha in part["weights"].items()})
        return members

    # -- link and finish -----------------------------------------------------------------------------------------

    def link(self, job_id: str, target_id: str) -> None:
        """Link one target's library from the store's objects (rebuilding any that are corrupt or gone)."""
        record = self.board.get(job_id)
        if record is None or record["state"] in TERMINAL:
            return
        link_plan = json.loads(self.store.get(record["plan_key"]))
        entry = next(t for t in link_plan["targets"] if t["target"]["id"] == target_id)
        target = CpuTarget.from_json(entry["target"])
        objects = [self._object(link_plan["units"][name]) for name in entry["order"]]
        try:
            library = link_library(objects + [compile_entry(entry["schedule"], target)], target)
        except FarmError as error:
            self.board.fail(job_id, str(error), error.exit_status, target_id)
            return
        self.board.update(job_id, **{f"library:{target_id}": self.store.put(library)})
        if self.board.complete(job_id, "link", target_id) == len(link_plan["targets"]):
            self.dispatch("farm.finish", [job_id])

    def _object(self, unit: dict[str, Any]) -> bytes:
        key = self.store.get_ref(unit["ref"])
        try:
            if key is None:
                raise MissingEntryError(unit["ref"], "cache ref")
            return self.store.get(key)
        except (CorruptEntryError, MissingEntryError):
            return self.store.get(self._build_into_store(unit_from_json(unit), unit.get("data_key")))

    def finish(self, job_id: str) -> None:
        """Write the artifact into the store and mark the job done (unless it was cancelled meanwhile)."""
        record = self.board.get(job_id)
        if record is None or record["state"] in TERMINAL:
            return
        link_plan = json.loads(self.store.get(record["plan_key"]))
        shas = {name: self.store.get_ref(unit["ref"]) for name, unit in link_plan["units"].items()}
        manifest = complete_manifest(link_plan["manifest"], shas)
        members = {library_member(CpuTarget.from_json(t["target"])): self.store.get(record[f"library:{t['target']['id']}"])
                   for t in link_plan["targets"]}
        if "opencl" in link_plan:
            manifest["opencl"] = link_plan["opencl"]["section"]
            members.update(self._opencl_members(link_plan["opencl"]))
        artifact_key = self.store.put(artifact_bytes(manifest, members))
        self.store.set_ref(artifact_ref(record), artifact_key)
        self.board.advance(job_id, JobState.DONE, artifact_key=artifact_key, finished=time.time())


def _opencl_link_plan(plan, fingerprints: list[str]) -> dict[str, Any]:
    """What finish needs for the artifact's OpenCL part: the section, sources, binary refs and weight keys."""
    from farm.backends.opencl.part import binary_member, opencl_kernels, opencl_layout

    section, sources = opencl_layout(plan, fingerprints)
    return {"section": section, "sources": {m: text.decode() for m, text in sources.items()},
            "binaries": {binary_member(fp, spec.symbol): cl_ref(spec, fp)
                         for fp in fingerprints for spec in opencl_kernels(plan)},
            "weights": {f"weights/{sha}.bin": sha for sha in plan.blobs}}


def cl_ref(spec: KernelSpec, device_fingerprint: str) -> str:
    """The cache ref of a kernel's program binary for one device."""
    return f"clkernel:{device_fingerprint}:{spec.key}"


def _tuning_asked(record: dict[str, str], flag: str) -> bool:
    """Whether the job asked for `flag` ("tune" or "retune") and its tuning phase hasn't run yet."""
    return record.get(flag) == "True" and record.get("tuned") != "True"


def _submitted_path(message: str) -> str:
    """A planning error names the model by its file name, not by the worker's temporary copy of it."""
    return re.sub(r"\S*farm-job-[^/\s]+/", "", message)


def artifact_ref(record: dict[str, str]) -> str:
    """The cache ref of a job's artifact: everything its bytes depend on (model, targets, farm's codegen)."""
    inputs = canonical_json([CODEGEN_VERSION, record["model_sha256"], record["model_name"], json.loads(record["targets"])])
    return f"artifact:{hashlib.sha256(inputs.encode()).hexdigest()}"


def _data_key(unit: CompileUnit) -> str | None:
    """The store key of a blob unit's weight bytes (their sha256, as the store is content-addressed)."""
    return unit.spec.data_sha256 if unit.kind == "blob" else None


def compile_task(job_id: str, unit: CompileUnit) -> tuple[str, list[Any]]:
    """The task name and arguments for one unit; the arguments name the job, unit, op and target for Flower."""
    if unit.kind == "kernel":
        return "farm.compile_cpu_kernel", [job_id, unit.name, unit.spec.op, unit.target.id, unit_to_json(unit)]
    return "farm.pack_blob", [job_id, unit.name, unit.target.id, unit_to_json(unit), _data_key(unit)]
