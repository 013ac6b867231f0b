"""Farm jobs: the orchestration steps that the Celery tasks (farm.distributed.tasks) run; records live on the job
board (farm.distributed.board), messages and records are encoded by farm.distributed.task_messages and
farm.distributed.job_record.

Nothing here imports Celery: each step gets a `dispatch(message)` callable to enqueue what follows, so the logic
stays plain Python and the tasks stay thin. Big bytes go through the store; records and messages hold keys. A build
is assembled by farm.build.assembly, the same code as a local build, so both give the same artifact.

A job moves queued -> planning -> compiling -> linking -> done, or to failed or cancelled from any live state; with
`--tune`, planning first dispatches tuning tasks (state tuning) and the last of them plans the job again.
Progress is counted with Redis sets (one member per finished unit), so a task redelivered after its worker died
counts once, and exactly one task sees the last unit of a phase finish and dispatches the next phase.
"""

from __future__ import annotations

import json
import re
import resource
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from farm import defaults
from farm.artifact import Member
from farm.backends.llvm.link import check_no_startup_code
from farm.backends.llvm.part import entry_object, entry_ref
from farm.backends.llvm.target import CpuTarget
from farm.build import assembly
from farm.build.parts import BuiltUnits
from farm.build.units import CompileUnit, cache_at, cache_unit, cached_at, cached_unit, compile_unit
from farm.distributed import pins, recipes, redis_keys, task_messages, uploads
from farm.distributed.board import JobBoard
from farm.distributed.intake_steps import IntakeSteps, listed_blobs
from farm.distributed.job_record import JobRecord, JobState
from farm.distributed.task_messages import Compile, Finish, Link, Message, PlanJob, TaskArgs, Tune
from farm.errors import ArtifactError, BadInputError, ExitStatus, FarmError, JobFailed, UnreachableError
from farm.frontend.external import DEFERRED_MIN_BYTES, ExternalDataError, StoredBlobs
from farm.ir.graph import DeferredArray
from farm.ir.specs import BlobSpec
from farm.ir.unit_kinds import UnitKind
from farm.plan.planner import Blob, BuildPlan
from farm.store import CorruptEntryError, MissingEntryError, Store, content_key, refs
from farm.store.base import check_key
from farm.tuning import database
from farm.tuning import variants as tuning
from farm.tuning.harness import time_variants

Dispatch = Callable[[Message], None]
"""dispatch(message): enqueue one task."""


def artifact_ref(record: JobRecord) -> str:
    """The cache ref of a job's artifact: its build identity (model, name, targets, pinned shapes, farm's
    codegen)."""
    return refs.artifact(
        assembly.build_identity(record.model_sha256, record.model_name, record.targets, record.sizes, record.model_key)
    )


class Farm(IntakeSteps):
    """What every step needs: the job board, the store and a way to enqueue the next tasks."""

    def __init__(
        self,
        board: JobBoard,
        store: Store,
        dispatch: Dispatch,
        before_build: Callable[[str], None] = lambda unit_name: None,
        live_queues: Callable[[], set[str]] = set,
    ) -> None:
        """`before_build(name)` runs just before a step does its work, named as its deliveries are counted (a
        unit's name, `plan`, `link:<library>`, `finish`: the worker's fault-injection hook);
        `live_queues()` names the queues that live workers consume now (tuning is dispatched only to those)."""
        self.board, self.store, self.dispatch, self.before_build = board, store, dispatch, before_build
        self.live_queues = live_queues

    def run(self, args: TaskArgs) -> str | None:
        """Run the step a task's arguments call for (what every Celery task does); a note when it was skipped. A step
        that runs out of memory (past the step memory limit, FARM_STEP_MEMORY_BYTES) fails its job at once, naming
        the limit: a task that raised is not delivered again."""
        try:
            return STEPS[type(args)](self, args)
        except MemoryError:
            pass  # leaving the handler frees what the step held, before the job is failed
        self._out_of_memory(args)
        return None

    def _out_of_memory(self, args: TaskArgs) -> None:
        """Fail the job of a step that ran out of memory, naming the step and the limit (exit 2: the model needs more
        than this farm gives a step); a tuning step leaves its kernel on the default (tuning never fails a build)."""
        why = f"needed more memory than {step_memory_limit()}"
        if isinstance(args, Tune):
            self.tune_done(args.job_id, args.name, f"timing its variants {why}")
            return
        what, unit = STEP_WORDS[type(args)](self, args)
        self._fail(args.job_id, f"{what} {why}", ExitStatus.BAD_INPUT, unit)

    def _start_step(self, job_id: str, name: str, what: str, unit: str = "") -> bool:
        """Count a delivery of the job's step `name` and run the fault-injection hook for it; past FARM_MAX_DELIVERIES,
        fail the job naming the step as `what` and return False. A step whose process dies on every delivery (a
        crash, or native code past the step memory limit) so ends its job in seconds: a plan killed by the OOM killer
        was delivered 77 times in 3.5 minutes."""
        cap = defaults.max_deliveries()
        if self.board.count_delivery(job_id, name) <= cap:
            self.before_build(name)
            return True
        self._fail(
            job_id,
            f"{what} was started {cap} times and never finished (its worker died each time: a crash, "
            f"or more memory than {step_memory_limit()})",
            unit=unit,
        )
        return False

    def _fail(self, job_id: str, error: str, status: ExitStatus = ExitStatus.BUILD_FAILED, unit: str = "") -> None:
        """Fail the job and raise JobFailed, unless the job had already ended (then this step failed nothing)."""
        if self.board.fail(job_id, error, status, unit):
            raise JobFailed(error, status)

    def _skipped(self, job_id: str) -> str | None:
        """The note a step leaves when it does nothing because its job has ended (None while it is live)."""
        record = self.board.get(job_id)
        if record is None:
            return f"skipped: job {job_id} is unknown (never submitted, or expired)"
        return f"skipped: job {job_id} is {record.state.value}" if record.is_over else None

    # -- plan ----------------------------------------------------------------------------------------------------

    def plan_job(self, job_id: str) -> str | None:
        """Plan the model, choose its variants (first dispatching its tuning, with --tune), put its blobs in the
        store, dispatch every unit the cache doesn't already hold."""
        record = self.board.get(job_id)
        if record is None or record.is_over:
            return self._skipped(job_id)
        if not self._start_step(job_id, "plan:tuned" if record.tuned else "plan", "planning"):
            return None
        if self._reuse_artifact(job_id, record) or not self._planning(job_id, record):
            return None
        pins.release_ended_jobs(self.board, self.store)
        try:
            plans = self._plans(job_id, record)
        except BadInputError as error:
            self._fail(job_id, _submitted_path(str(error)), error.exit_status)
            return None
        cpu_targets = [t for t in record.targets if t.kind == CpuTarget.kind]
        if self._dispatch_tuning(job_id, plans, cpu_targets, record):
            return None
        plans = [tuning.with_variants(self.store, plan, cpu_targets) for plan in plans]
        blobs = assembly.sized_blobs(plans)
        units = assembly.sized_units(plans, record.targets)
        refusal = uploads.over_the_cap(
            f"{record.model_name}.onnx",
            _pinned_bytes(blobs, units),
            self.store.max_bytes,
            "its weights and what the plan made of them need",
        )
        if refusal:
            self._fail(job_id, refusal, ExitStatus.BAD_INPUT)
            return None
        cached = {} if record.no_cache else self._pin_cached(job_id, units)
        todo = [u for u in units if u.name not in cached]
        if record.total is not None:
            todo = [u for u in todo if not self.board.is_complete(job_id, "compile", u.name)]
        pins.pin_for_job(self.store, job_id, [record.model_key, *blobs])
        counts = {"total": record.total if record.total is not None else len(todo), **assembly.unit_counts(units)}
        if not self._compiling(job_id, record, **counts):
            return None
        lacking = set(self.store.missing(blobs))  # weights folded, or staged and not read yet
        self._dispatch_units(job_id, blobs, todo, lacking)
        try:
            self._put_weights(blobs, lacking - {unit.data_key for unit in todo})
        except BadInputError as error:
            self._fail(job_id, _submitted_path(str(error)), error.exit_status)
            return None
        self._put_link_plan(job_id, record, plans, units, counts["total"])
        return None

    def _put_link_plan(
        self, job_id: str, record: JobRecord, plans: list[BuildPlan], units: list[CompileUnit], total: int
    ) -> None:
        """Make the link plan while the units compile (it lowers every kernel again: light DenseNet-121's 0.2-0.4 s
        held back its first unit) and compile each library's entry into the cache (a link that finds it skips
        0.05-0.25 s, serial after the last unit), put the plan and name it in the record; linking starts here when
        all `total` units finished meanwhile (or none was to be built), else at the last unit's compile, which finds
        the plan named."""
        plan_json = assembly.link_plan(
            plans, record.targets, record.model_name, record.model_sha256, units, record.sizes
        )
        libraries = assembly.libraries(plan_json)
        for library in libraries:
            try:
                self._entry(job_id, library)
            except UnreachableError:
                raise
            except FarmError as error:  # what its link would fail with (a CPU that LLVM doesn't know), said now
                self._fail(job_id, str(error), error.exit_status, library["id"])
                return
        plan_bytes = json.dumps(plan_json, sort_keys=True).encode()
        pins.pin_for_job(self.store, job_id, [content_key(plan_bytes)])
        self.board.update(job_id, link_plan_key=self.store.put(plan_bytes), targets_total=len(libraries))
        if self.board.finished(job_id, "compile") >= total:
            self._start_linking(job_id, plan_json)

    def _planning(self, job_id: str, record: JobRecord) -> bool:
        """Move the job to planning; False when it has ended. A plan_job run again after an earlier run took the job
        on (its worker died and a peer's reaper dispatched it again, farm.distributed.leases, or Redis redelivered
        it) leaves the job in tuning, compiling or linking: moved back to planning, it showed its waiting clients
        `compiling 40/40` (the count a phase that ends has reached) then planning, though units were still
        compiling."""
        if record.state in (JobState.TUNING, JobState.COMPILING, JobState.LINKING):
            return not self.board.is_over(job_id)
        return self.board.advance(job_id, JobState.PLANNING)

    def _compiling(self, job_id: str, record: JobRecord, **plan: Any) -> bool:
        """Move the job to compiling with its plan's fields; False when it has ended. A plan_job run again after an
        earlier run did so leaves the job where it is, compiling or (its last unit done meanwhile) linking, with the
        fields that run wrote."""
        if record.state in (JobState.COMPILING, JobState.LINKING):
            return not self.board.is_over(job_id)
        return self.board.advance(job_id, JobState.COMPILING, **plan)

    def _put_weights(self, blobs: dict[str, Blob], lacking: set[str]) -> None:
        """The weights the store lacks that no unit to build reads: they are artifact members, which the finish
        names from the store. One the plan folded is put; a submitted one that the plan never read (deferred) is
        read now, on WEIGHT_READERS threads, which admits it from staging once its bytes hash to its key (each
        pack unit admits its own weight so)."""
        unread = [blob for sha in sorted(lacking) if isinstance(blob := blobs[sha], DeferredArray)]
        for sha in sorted(lacking):
            folded = blobs[sha]
            if not isinstance(folded, DeferredArray):
                self.store.put(folded.data.cast("B"))
        with ThreadPoolExecutor(WEIGHT_READERS, thread_name_prefix="farm-weights") as readers:
            for loaded in readers.map(lambda blob: blob.load(), unread):
                del loaded

    def _dispatch_units(self, job_id: str, blobs: dict[str, Blob], todo: list[CompileUnit], lacking: set[str]) -> None:
        """Kernels first, so that workers compile while this task is still putting weight bytes in the store;
        a blob's store key is the sha256 its spec already names, and only a weight the plan folded is put, each
        once (a submitted one is the unit's to read, and so admit: Farm._unit_input)."""
        for unit in sorted(todo, key=lambda u: u.data_key is not None):
            folded = blobs.get(unit.data_key) if unit.data_key in lacking else None
            if folded is not None and not isinstance(folded, DeferredArray):
                self.store.put(folded.data.cast("B"))
                lacking.discard(unit.data_key)
            self.dispatch(Compile(job_id, unit).message())

    def _reuse_artifact(self, job_id: str, record: JobRecord) -> bool:
        """Finish at once when this farm already built the same model bytes for the same targets (unless --no-cache
        or --retune) with the variants the tuning database holds now, and --tune has nothing to time: the artifact
        is a pure function of them, so it is the cached one, byte for byte."""
        key = self.store.get_ref(artifact_ref(record))
        if record.no_cache or key is None or record.tuning_asked("retune"):
            return False
        pins.pin_for_job(self.store, job_id, [key])
        try:
            recipe = recipes.read_recipe(self.store.get(key))
        except (CorruptEntryError, MissingEntryError, ArtifactError):
            return False
        manifest, members = recipe.manifest, recipe.entries
        pins.pin_for_job(self.store, job_id, members)
        if not recipes.intact(self.store, members):
            return False  # a member was evicted or damaged (and deleted): build the artifact again
        if not assembly.manifest_names(manifest, record.model_sha256, record.model_name, record.targets):
            return False  # the ref points at another build's artifact: never ship it, build this one
        if not tuning.manifest_current(self.store, manifest) or (
            record.tuning_asked("tune") and self._tunable_on(tuning.untuned_targets(manifest))
        ):
            return False
        if self.board.advance(
            job_id, JobState.DONE, artifact_key=key, total=0, finished=time.time(), cached=True, **recipe.units
        ):
            pins.keep_only_artifact(self.store, job_id, [key, *members])
        return True

    def _plans(self, job_id: str, record: JobRecord) -> list[BuildPlan]:
        """A plan per size the job asks for (one for a static model), its weights read by their keys: the store's
        entries, or the submitter's staged uploads, admitted as they are read (farm.store.Store.take_staged). Big
        weights (DEFERRED_MIN_BYTES) are read only if a pass asks for their values (farm.ir.graph.Constants): a
        plan that never does (BERT-base's) moves none of their bytes, and each is read once, by the unit that
        packs it or by the admission after the plan (Farm._put_weights). The small ones are read ahead, in the
        graph's order, on WEIGHT_READERS threads (a read waits on Redis or hashes, both without the GIL). A weight
        that is neither in the store nor staged (by the job's team: farm.store.Store.for_team) fails the plan
        naming its initializer."""
        staging = self._staging(job_id)
        graph = self.store.get(record.model_key)
        listed = listed_blobs(graph)
        absent = set(self.store.missing(listed)) - set(staging.staged(listed))
        with (
            tempfile.TemporaryDirectory(prefix="farm-job-") as folder,
            ThreadPoolExecutor(WEIGHT_READERS, thread_name_prefix="farm-weights") as readers,
        ):
            path = Path(folder) / f"{record.model_name}.onnx"
            path.write_bytes(graph)
            ahead = {
                key: readers.submit(staging.take_staged, key)
                for key, length in listed.items()
                if length < DEFERRED_MIN_BYTES
            }

            def weight(key: str, name: str) -> bytes:
                """Read ahead, or now: a deferred weight whose values a pass (or the admission of the weights no
                unit reads, after the plan) asked for, or one the listing missed."""
                reading = ahead.get(key)
                return self._weight(key, name, reading.result() if reading else staging.take_staged(key))

            def present(key: str, name: str) -> bool:
                if key in absent:
                    raise _missing_weight(key, name)
                return True

            try:
                return assembly.plan_sizes(path, record.sizes, StoredBlobs(weight, present))
            finally:
                for reading in ahead.values():
                    reading.cancel()

    def _weight(self, key: str, name: str, data: bytes | None) -> bytes:
        """The bytes of the weight blob `key` that the submitter named for initializer `name` (None: not there)."""
        if data is None:
            raise _missing_weight(key, name)
        return data

    def _pin_cached(self, job_id: str, units: list[CompileUnit]) -> dict[str, str]:
        """The units whose objects the cache holds (name -> store key), each pinned for the job before its presence
        is checked (so none is evicted between the check and the link). A packed weight is kept as its key, not its
        bytes (farm.distributed.recipes): its ref is its cached output while the weight it is made from is there."""
        refs = {unit.name: (unit, self.store.get_ref(unit.cache_ref)) for unit in units}
        keys = {name: key for name, (_, key) in refs.items() if key is not None}
        held = {name: _held_entry(refs[name][0], key) for name, key in keys.items()}
        pins.pin_for_job(self.store, job_id, list(held.values()))
        absent = set(self.store.missing(held.values()))
        return {name: key for name, key in keys.items() if held[name] not in absent}

    # -- tune ----------------------------------------------------------------------------------------------------

    def _tunable_on(self, target_ids: set[str]) -> set[str]:
        """Those of `target_ids` whose tuning queue a live worker consumes (asks the workers only when needed)."""
        if not target_ids:
            return set()
        live = self.live_queues()
        return {target_id for target_id in target_ids if task_messages.tune_queue(target_id) in live}

    def _dispatch_tuning(
        self, job_id: str, plans: list[BuildPlan], targets: list[CpuTarget], record: JobRecord
    ) -> bool:
        """With --tune (or --retune), before anything compiles: dispatch a farm.tune_kernel to `tune.<cpu id>` for
        each tunable kernel the database lacks (every one with --retune) on a target whose queue a live worker
        consumes, and say in the job record which targets keep the default. True when tasks went out: the job
        waits in state tuning, and the last task plans it again."""
        if not (record.tuning_asked("tune") or record.tuning_asked("retune")):
            return False
        todo, note = self._tuning_units(job_id, plans, targets, record)
        if not todo:
            if note:
                self.board.update(job_id, tuning_note=note)
            return False
        names = record.tune_units or [tuning.tune_name(spec, target.id) for spec, target in todo]
        if not self.board.advance(job_id, JobState.TUNING, tune_units=names, tuning_note=note):
            return True
        for spec, target in todo:
            self.dispatch(Tune(job_id, tuning.tune_name(spec, target.id), spec, target).message())
        return True

    def _tuning_units(
        self, job_id: str, plans: list[BuildPlan], targets: list[CpuTarget], record: JobRecord
    ) -> tuple[list[tuple[Any, CpuTarget]], str]:
        """The (kernel, target) pairs to time, and the note on targets no live worker can time. A plan_job
        redelivered after it dispatched them gets the same units, less those finished."""
        if record.tune_units is not None:
            names = set(record.tune_units)
            return [
                (spec, target)
                for spec, target in self._untuned(plans, targets, retune=True)
                if (name := tuning.tune_name(spec, target.id)) in names
                and not self.board.is_complete(job_id, "tune", name)
            ], record.tuning_note
        todo = self._untuned(plans, targets, record.tuning_asked("retune"))
        served = self._tunable_on({target.id for _, target in todo})
        unserved = sorted({target.id for _, target in todo} - served)
        note = (
            f"no live worker consumes {', '.join(task_messages.tune_queue(t) for t in unserved)}: the default "
            "variant is used there"
            if unserved
            else ""
        )
        return [(spec, target) for spec, target in todo if target.id in served], note

    def _untuned(self, plans: list[BuildPlan], targets: list[CpuTarget], retune: bool) -> list[tuple[Any, CpuTarget]]:
        """The (kernel, target) pairs of every size's plan that tuning would time, each once."""
        todo = {
            tuning.tune_name(spec, target.id): (spec, target)
            for plan in plans
            for spec, target in tuning.missing(self.store, plan, targets, retune)
        }
        return list(todo.values())

    def tune(self, args: Tune) -> str | None:
        """Time one kernel's variants on this worker and record the winner. Tuning never fails a job: a kernel
        whose timing fails, or whose worker dies on every delivery, keeps the default."""
        job_id, name = args.job_id, args.name
        record = self.board.get(job_id)
        if record is None or record.is_over:
            return self._skipped(job_id)
        if self.board.is_complete(job_id, "tune", name):
            return None
        if self.board.count_delivery(job_id, f"tune:{name}") > defaults.max_deliveries():
            self.tune_done(job_id, name, "its worker died on every delivery")
            return None
        self.before_build(name)
        try:
            result = time_variants(args.spec.to_json(), args.target.to_json())
            assert isinstance(args.target, CpuTarget)  # time_variants read it as one (an OpenCL target has no triple)
            database.record(self.store, args.spec, args.target, result, replace=record.retune)
        except UnreachableError:
            raise
        except FarmError as error:
            self.tune_done(job_id, name, str(error))
            return None
        self.tune_done(job_id, name)
        return None

    def tune_done(self, job_id: str, name: str, error: str = "") -> None:
        """Count a tuning unit finished (an error is noted in the job record; the kernel keeps the default); the
        last one plans the job again, which now finds every record it can."""
        if error:
            self.board.update(job_id, tune_errors={name: f"{error} (the default variant is used)"})
        record = self.board.get(job_id)
        finished = self.board.complete(job_id, "tune", name)
        if (
            record is not None
            and finished == len(record.tune_units or [])
            and self.board.advance(job_id, JobState.PLANNING, tuned=True)
        ):
            self.dispatch(PlanJob(job_id).message())

    # -- compile -------------------------------------------------------------------------------------------------

    def compile(self, args: Compile) -> str | None:
        """Build one unit into the store (its cache ref points at the bytes), then count it done."""
        job_id, unit = args.job_id, args.unit
        if self.board.is_over(job_id):
            return self._skipped(job_id)
        if self.board.is_complete(job_id, "compile", unit.name):
            return None
        if not self._start_step(job_id, unit.name, self._describe(job_id, unit), unit.name):
            return None
        try:
            key, _ = self._build_into_store(job_id, unit)
        except UnreachableError:
            raise
        except FarmError as error:
            self._fail(job_id, f"{self._describe(job_id, unit)} failed: {error}", error.exit_status, unit.name)
            return None
        finished = self.board.complete(job_id, "compile", unit.name)
        record = self.board.get(job_id)  # read after the count: the plan may have named its link plan meanwhile
        if record is not None and finished == record.total and record.link_plan_key:  # else the plan links
            self._start_linking(job_id, self._link_plan(record))
        return None

    def _describe(self, job_id: str, unit: CompileUnit) -> str:
        """The unit as a user knows it: its kind, op and the ONNX nodes it serves, then its name."""
        record = self.board.get(job_id)
        nodes = assembly.unit_nodes(self._link_plan(record), unit) if record and record.link_plan_key else []
        shown = ", ".join(repr(node) for node in nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        what = f"{unit.label} {getattr(unit.spec, 'op', '')}".rstrip()
        return (
            f"{what} of node{'s' if len(nodes) > 1 else ''} {shown} ({unit.name})" if nodes else f"{what} {unit.name}"
        )

    def _build_into_store(self, job_id: str, unit: CompileUnit) -> tuple[str, bytes]:
        """Build a unit and keep its bytes in the compile cache (pinned for the job before they are put, by the
        key hashed once); their key and the bytes. A packed weight's ref names its key and no bytes are put: the
        artifact's writer makes it from the weight (farm.distributed.recipes.Derivation)."""
        built = compile_unit(unit, self._unit_input(job_id, unit))
        key = content_key(built)
        if recipes.Derivation.of(unit.spec, unit.target) is not None:
            self.store.set_ref(unit.cache_ref, key, anchor=unit.data_key)
            return key, built
        pins.pin_for_job(self.store, job_id, [key])
        cache_unit(self.store, unit, built, key)
        return key, built

    def _unit_input(self, job_id: str, unit: CompileUnit) -> bytes | None:
        """The weight a unit reads: the store's entry, or the job's submitter's staged bytes, admitted as they are
        read (the plan left them unread: it never looked at their values); MissingEntryError when neither holds
        them."""
        if unit.data_key is None:
            return None
        data = self._staging(job_id).take_staged(unit.data_key)
        if data is None:
            raise MissingEntryError(unit.data_key, "the farm's store (neither an entry nor a staged upload)")
        return data

    def _start_linking(self, job_id: str, plan_json: dict[str, Any]) -> None:
        """Link every CPU target; with none (an OpenCL-only job) go straight to finish. Once per job: the last unit's
        compile and the plan (or a plan delivered again) may both find every unit finished."""
        if not self.board.claim(redis_keys.linking_claim_key(job_id), defaults.JOB_TTL_SECONDS):
            return
        if not self.board.advance(job_id, JobState.LINKING):
            return
        libraries = assembly.libraries(plan_json)
        for library in libraries:
            self.dispatch(Link(job_id, library["id"]).message())
        if not libraries:
            self.dispatch(Finish(job_id).message())

    # -- link and finish -----------------------------------------------------------------------------------------

    def _link_plan(self, record: JobRecord) -> dict[str, Any]:
        return json.loads(self.store.get(check_key(record.link_plan_key)))

    def _built(self, plan_json: dict[str, Any], record: JobRecord, job_id: str) -> BuiltUnits:
        """What the units built, read from the store under this worker's own cache refs, which hold its toolchain (a
        corrupt or missing object is rebuilt, so a worker never links an object that another toolchain built)."""

        def unit(name: str) -> CompileUnit:
            return CompileUnit.from_json(plan_json["units"][name])

        return BuiltUnits(
            lambda name: self._object(job_id, unit(name)),
            lambda name: self.store.get_ref(unit(name).cache_ref),
            lambda library: self.store.get(record.libraries[library]),
            self.store.get,
            lambda library: self._entry(job_id, library),
        )

    def _entry(self, job_id: str, library: dict[str, Any]) -> bytes:
        """A library's entry object from the compile cache under this worker's toolchain (entry_ref), pinned for
        the job and checked as a cached object is; else compiled and cached (pinned for the job first)."""
        ref = entry_ref(library)
        key = self.store.get_ref(ref)
        if key is not None:
            pins.pin_for_job(self.store, job_id, [key])
        cached = cached_at(
            self.store, key, lambda data: check_no_startup_code(data, f"the cached entry of library {library['id']}")
        )
        if cached is not None:
            return cached
        built = entry_object(library)
        pins.pin_for_job(self.store, job_id, [content_key(built)])
        cache_at(self.store, ref, built)
        return built

    def link(self, args: Link) -> str | None:
        """Link one target's library from the store's objects (rebuilding any that are corrupt or gone)."""
        record = self.board.get(args.job_id)
        if record is None or record.is_over:
            return self._skipped(args.job_id)
        if not self._start_step(args.job_id, f"link:{args.library}", f"linking library {args.library}", args.library):
            return None
        plan_json = self._link_plan(record)
        try:
            library = assembly.link_library(plan_json, args.library, self._built(plan_json, record, args.job_id))
        except UnreachableError:
            raise
        except FarmError as error:
            self._fail(args.job_id, str(error), error.exit_status, args.library)
            return None
        pins.pin_for_job(self.store, args.job_id, [content_key(library)])
        self.board.update(args.job_id, libraries={args.library: self.store.put(library)})
        if self.board.complete(args.job_id, "link", args.library) == len(assembly.libraries(plan_json)):
            self.dispatch(Finish(args.job_id).message())
        return None

    def _stored(self, plan_json: dict[str, Any], record: JobRecord, job_id: str) -> BuiltUnits:
        """What the units built as the recipe names it: the weights (put by planning), by store key, unread (sizes
        from the link plan), and each packed weight as its key and how it is made (recipes.Derivation: the store
        holds the weight, not the packed copy). The rest is read and checked as `_built` reads it: libraries and
        OpenCL binaries (small)."""
        built = self._built(plan_json, record, job_id)
        weight_bytes = {
            blob["sha256"]: blob["bytes"]
            for size in assembly.size_plans(plan_json)
            for blob in size["manifest"]["blobs"]
        }

        def object_of(name: str) -> Member:
            unit = CompileUnit.from_json(plan_json["units"][name])
            derivation = recipes.Derivation.of(unit.spec, unit.target)
            if derivation is None:
                return built.object_of(name)
            key = self.store.get_ref(unit.cache_ref) or self._build_into_store(job_id, unit)[0]
            return recipes.derived(self.store, key, derivation.nbytes, derivation)

        return replace(
            built, object_of=object_of, blob_of=lambda sha: recipes.stored(self.store, sha, weight_bytes[sha])
        )

    def _object(self, job_id: str, unit: CompileUnit) -> bytes:
        """A unit's bytes from the cache; rebuilt when they are gone, corrupt, or can't be what its step makes (a
        cache ref pointed at an object with load-time code: refs are pointers, so the bytes are checked)."""
        cached = cached_unit(self.store, unit)
        return cached if cached is not None else self._build_into_store(job_id, unit)[1]

    def finish(self, args: Finish) -> str | None:
        """Put the artifact's recipe into the store (farm.distributed.recipes: its manifest, its members being
        store entries already) and mark the job done (unless it was cancelled meanwhile)."""
        record = self.board.get(args.job_id)
        if record is None or record.is_over:
            return self._skipped(args.job_id)
        if not self._start_step(args.job_id, "finish", "finishing the artifact"):
            return None
        plan_json = self._link_plan(record)
        manifest, members = assembly.artifact_contents(plan_json, self._stored(plan_json, record, args.job_id))
        artifact_key, member_keys = recipes.put_recipe(
            self.store,
            manifest,
            members,
            lambda keys: pins.pin_for_job(self.store, args.job_id, keys),
            {"kernels": record.kernels, "blobs": record.blobs},
        )
        self.store.set_ref(artifact_ref(record), artifact_key)
        if self.board.advance(args.job_id, JobState.DONE, artifact_key=artifact_key, finished=time.time()):
            pins.keep_only_artifact(self.store, args.job_id, [artifact_key, *member_keys])
        else:  # cancelled meanwhile
            pins.release_job(self.store, args.job_id)
        return None


STEPS: dict[type, Callable[[Farm, Any], str | None]] = {
    PlanJob: lambda farm, args: farm.plan_job(args.job_id),
    Tune: lambda farm, args: farm.tune(args),
    Compile: lambda farm, args: farm.compile(args),
    Link: lambda farm, args: farm.link(args),
    Finish: lambda farm, args: farm.finish(args),
}
"""The step each task runs, by the type of its arguments (farm.distributed.task_messages)."""

STEP_WORDS: dict[type, Callable[[Farm, Any], tuple[str, str]]] = {
    PlanJob: lambda farm, args: ("planning", ""),
    Compile: lambda farm, args: (farm._describe(args.job_id, args.unit), args.unit.name),
    Link: lambda farm, args: (f"linking library {args.library}", args.library),
    Finish: lambda farm, args: ("finishing the artifact", ""),
}
"""A step that fails its job as its error names it, and the unit it names (farm status's failed unit), by the type
of its arguments (tuning never fails a job)."""


def step_memory_limit() -> str:
    """The step memory limit this process runs under, as errors name it: farm.distributed.worker sets it as each pool
    process's RLIMIT_DATA (defaults.step_memory_bytes)."""
    limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
    if limit == resource.RLIM_INFINITY:
        return "the host gave it (FARM_STEP_MEMORY_BYTES set no limit here)"
    return f"the step memory limit FARM_STEP_MEMORY_BYTES={limit} ({limit / (1 << 30):.1f} GiB)"


def _pinned_bytes(blobs: dict[str, Blob], units: list[CompileUnit]) -> int:
    """What a planned job pins in the store for its weights: each distinct weight, and each packed copy the store
    keeps (a CPU's packed weights are made from their weights, not kept: farm.distributed.recipes)."""
    return sum(int(data.nbytes) for data in blobs.values()) + sum(
        unit.spec.nbytes
        for unit in units
        if unit.kind == UnitKind.BLOB
        and isinstance(unit.spec, BlobSpec)
        and recipes.Derivation.of(unit.spec, unit.target) is None
    )


def _held_entry(unit: CompileUnit, key: str) -> str:
    """The store entry a cached unit needs: its output's, or for a packed weight the weight it is made from."""
    derivation = recipes.Derivation.of(unit.spec, unit.target)
    return key if derivation is None else derivation.source


WEIGHT_READERS = 2
"""Threads a plan reads its weights on (Farm._plans): two keep one Redis reply and one hash in flight at a time."""


def _missing_weight(key: str, name: str) -> ExternalDataError:
    return ExternalDataError(
        f"initializer {name!r}: its bytes (blob {key}) are not on the farm: the upload expired "
        "before a worker took the job, was evicted or was damaged; submit the model again"
    )


def _submitted_path(message: str) -> str:
    """A planning error names the model by its file name, not by the worker's temporary copy of it."""
    return re.sub(r"\S*farm-job-[^/\s]+/", "", message)
