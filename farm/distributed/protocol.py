"""The farm's wire protocol, in one place: task names, queues, Redis key names, the job record and each task's
arguments, with their encodings. The client, the Celery app, the steps, the workers and the tests all use it;
nothing else knows a task name, a queue or how a field is written.

Everything here crosses a trust boundary (submitters are not trusted), so every decode validates what it reads and
raises BadInputError naming the field: a bad message fails its task, never reaches IR, paths or shell text.

Clients import this module too (keys, queues, the job record), on installs without numpy or llvmlite
(pip install farm): the compile units and kernel specs that only workers decode are imported by those decodes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from farm.backends.registry import Target, check_target_count, target_from_json
from farm.defaults import MAX_TARGETS
from farm.errors import BadInputError
from farm.ir.shapes import PinnedShapes, sizes_from_json, sizes_to_json
from farm.store.base import is_key

if TYPE_CHECKING:
    from farm.build.units import CompileUnit
    from farm.ir.specs import KernelSpec

# --- Redis keys --------------------------------------------------------------------------------------------------

WORKERS_KEY = "farm:workers"
"""A hash: worker name -> its advertised capabilities (`encode_capabilities`)."""
TEAM = re.compile(r"[a-z][a-z0-9-]{0,14}")
"""A team of submitters (its own Redis user, farm.distributed.acl): a letter, then up to 14 letters, digits or
dashes. At most 15 characters, so that `<team>.` always holds its dot within a job id's first 16 characters and
no team's id matches the pattern of the default submitters' ids (16 hex digits)."""
JOB_ID = re.compile(r"(?:[a-z][a-z0-9-]{0,14}\.)?[0-9a-f]{16}")
"""A job id: 16 hex digits (the start of its request's sha256), after `<team>.` when a team's user submitted it."""
HEX_ID_GLOB = "[0-9a-f]" * 16
"""The Redis glob of 16 hex digits: the default submitters' job ids, in the ACL's key patterns."""


def check_job_id(job_id: object) -> str:
    if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
        raise BadInputError(f"not a job id ([<team>.]<16 lowercase hex digits>): {str(job_id)[:80]!r}")
    return job_id


def check_team(team: object) -> str:
    if not isinstance(team, str) or not TEAM.fullmatch(team):
        raise BadInputError(f"not a team name (a letter, then at most 14 letters, digits or '-'): {str(team)[:80]!r}")
    return team


def team_of(job_id: str) -> str:
    """The team whose user submitted the job ("" for the default submitters' user): what its key names say, which
    Redis's ACL lets only that user write."""
    return job_id.rpartition(".")[0]


def team_job_ids(team: str) -> str:
    """The Redis glob of the team's job ids (the default submitters' when `team` is "")."""
    return f"{team}.{HEX_ID_GLOB}" if team else HEX_ID_GLOB


def job_key(job_id: str) -> str:
    """The job's record, a Redis hash."""
    return f"farm:job:{job_id}"


def phase_key(job_id: str, phase: str) -> str:
    """The set of units finished in one phase of the job ("compile", "link", "tune")."""
    return f"{job_key(job_id)}:{phase}"


def linking_claim_key(job_id: str) -> str:
    """Set by the step that starts the job's linking, so that no other starts it again."""
    return f"{job_key(job_id)}:linking-started"


def retune_grant_key(job_id: str) -> str:
    """Set by a client with the workers' (the operator's) credentials for a job submitted with --retune: a retune
    replaces tuning records every job uses, so a request asking for one without this grant is refused (submitters
    may read this key, not write it: farm.distributed.acl)."""
    return f"{job_key(job_id)}:retune-granted"


def deliveries_key(job_id: str, unit: str) -> str:
    """How many times one unit's task has started."""
    return f"{job_key(job_id)}:deliveries:{unit}"


RUNNING_KEY = "farm:running"
"""A hash: Celery task id -> the task running now and who runs it (`RunningTask`): what a dead worker's peers
dispatch again."""


def lease_key(worker: str) -> str:
    """A worker's liveness lease: a string holding its incarnation, which expires unless the worker renews it."""
    return f"farm:lease:{worker}"


def store_pin_owner(job_id: str) -> str:
    """The owner of a job's pins in the store (what the job needs, then its artifact until downloaded)."""
    return f"job:{check_job_id(job_id)}"


def job_of_pin_owner(owner: str) -> str | None:
    """The job id a store pin owner names, or None when the owner isn't a job (the tuning database, say)."""
    prefix, _, job_id = owner.partition(":")
    return job_id if prefix == "job" and JOB_ID.fullmatch(job_id) else None

def job_events_channel(job_id: str) -> str:
    """The pub/sub channel on which the board signals each state change and finished unit of the job; waiting
    clients block on it instead of polling the record."""
    return f"{job_key(job_id)}:events"


JOBS_KEY = "farm:jobs"
"""A sorted set: job id -> its creation time (Unix seconds), the index behind `farm jobs` (the default submitters';
each team has its own, jobs_key). Entries older than the job records' time to live are dropped whenever a job is
added. Submitters write it, so every id read from it is checked and one with no request or record is skipped."""


def jobs_key(team: str) -> str:
    """The jobs index of a team's submitters (JOBS_KEY for the default submitters)."""
    return f"{JOBS_KEY}:{team}" if team else JOBS_KEY


def live_jobs_key(team: str) -> str:
    """A set, written by workers only: the team's jobs accepted and not known to have ended, which its quota
    (defaults.max_live_jobs) counts."""
    return f"farm:live:{team}" if team else "farm:live"

# Keys a submitter writes (farm.distributed.acl gives it these, the jobs index and the store's staging area and
# nothing else to write): its job's request and the flags it raises on its job. Workers read them as untrusted input.


def request_key(job_id: str) -> str:
    """The job as its submitter asked for it (a hash of REQUEST_FIELDS), which the worker that accepts the job
    turns into its record (job_key); until then clients show the request as a queued job."""
    return f"farm:request:{job_id}"


def cancel_key(job_id: str) -> str:
    """Raised by `farm cancel`: the job counts as cancelled from then on (farm.distributed.board)."""
    return f"{request_key(job_id)}:cancel"


SUBMITTED_KEY = "farm:submitted"
"""A list of job ids whose request is new: a submitter pushes its job's id, a worker's intake
(farm.distributed.intake) pops it and accepts the job. Submitters never write a Celery queue: a message there could
name any task, queue or routing it liked, an id here names nothing but a request."""
ADMIT_KEY = "farm:admit"
"""A list of `<upload token>:<blob key>`: a submitter streaming its weights into a farm with a file blob store
pushes each blob it staged, and a worker's intake admits it at once (reads it from staging, checks its sha256,
writes its file), so that Redis holds at most the client's window of staged bytes, not the whole model."""
UPLOAD_TOKEN = re.compile(r"(?:[a-z][a-z0-9-]{0,14}\.)?[0-9a-f]{32}")
"""A streamed upload's token: 32 hex digits, after `<team>.` for a team's upload (whose staging it names)."""


REPAIR_KEY = "farm:repair"
"""A list of store keys whose bytes a download found damaged (they don't hash to the key): a worker's intake reads
the entry, which drops it when it is damaged (farm.store.Store.get), so that the artifacts naming it are built again,
not reused (a reuse checks members' lengths, not their bytes: farm.store.Store.incomplete). Any submitter may push
any key: each is read at most once per REPAIR_SECONDS (repair_claim_key)."""
REPAIR_SECONDS = 600


def repair_claim_key(key: str) -> str:
    """Set (by a worker) while the entry `key` counts as checked."""
    return f"{REPAIR_KEY}:{key}"


def decode_repair(raw: object) -> str:
    """The store key of a submitter's repair entry; BadInputError when it is not one."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    if not is_key(text):
        raise BadInputError(f"not a store key (64 hex digits): {text[:120]!r}")
    return text


def encode_admission(token: str, key: str) -> str:
    return f"{token}:{key}"


def decode_admission(raw: object) -> tuple[str, str]:
    """(upload token, blob key) from a submitter's admission entry; BadInputError when it is not one."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    token, _, key = text.partition(":")
    if not UPLOAD_TOKEN.fullmatch(token) or not is_key(key):
        raise BadInputError(f"not an admission entry ([<team>.]<32 hex digits>:<64 hex digits>): {text[:120]!r}")
    return token, key


def upload_pin_owner(token: str) -> str:
    """The owner of the pins that keep an upload's admitted blobs until its job is accepted (and pins them)."""
    return f"upload:{token}"


def downloaded_key(job_id: str) -> str:
    """Raised by `farm download`: the job's artifact may leave the store once its pins are swept."""
    return f"{request_key(job_id)}:downloaded"


EXPIRY_SWEEP_KEY = "farm:expiry-sweep"
"""Claimed by the worker whose housekeeping gives a time to live to the submitter-written keys that lack one
(farm.store.expiry), at most once per EXPIRY_SWEEP_SECONDS across the farm."""
EXPIRY_SWEEP_SECONDS = 300
STAGING_SWEEP_KEY = "farm:staging-sweep"
"""Claimed by the worker whose housekeeping keeps each team's staged bytes under its quota (farm.store.Store
.trim_staging), at most once per STAGING_SWEEP_SECONDS across the farm."""
STAGING_SWEEP_SECONDS = 30


def staging_trimmed_key(team: str) -> str:
    """Set by a worker (for a day) when it dropped some of the team's staged uploads for its quota: what a job
    whose upload is then missing is told."""
    return f"farm:staging-trimmed:{team}" if team else "farm:staging-trimmed"


SUBMITTER_KEYS_TTL = {request_key("*"): "request, cancel and downloaded flags", JOBS_KEY: "the jobs index",
                      jobs_key("*"): "the teams' jobs indexes"}
"""The patterns of keys a submitter writes in the farm's Redis (its staged bytes are the store's), each of which
lives JOB_TTL_SECONDS at most: what the expiry sweep looks for."""


FIXED_KEY_TYPES = {SUBMITTED_KEY: "list", ADMIT_KEY: "list", REPAIR_KEY: "list", JOBS_KEY: "zset",
                   WORKERS_KEY: "hash", RUNNING_KEY: "hash"}
"""The farm's keys of fixed name and the Redis type each holds. While one holds another type, every call on it
fails (WRONGTYPE: every intake's pop, every `farm submit`), so workers delete such a key
(farm.distributed.board.JobBoard.drop_mistyped): nothing of value is lost, since the farm never put it there."""


def encode_capabilities(capabilities: dict[str, Any]) -> str:
    """A worker's advertisement: host, pid, CPU and OpenCL devices, as JSON."""
    return json.dumps(capabilities, sort_keys=True)


def decode_capabilities(text: str | None) -> dict[str, Any]:
    """An advertisement read back; {} when it is missing or not a JSON object (a worker that wrote garbage
    advertises nothing)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# --- queues ------------------------------------------------------------------------------------------------------

CONTROL_QUEUE = "control"
"""Planning and finishing jobs: any worker."""

LLVM_QUEUE = "llvm"
"""CPU kernels, weight blobs and links: any worker (LLVM cross-compiles)."""


def opencl_queue(fingerprint: str) -> str:
    """Program binaries for one OpenCL device class: only workers that own such a device."""
    return f"opencl.{fingerprint}"


def tune_queue(cpu_id: str) -> str:
    """Timing kernel variants for one CPU class: only workers on such a CPU."""
    return f"tune.{cpu_id}"


COMPILE_QUEUES: dict[str, Callable[[Any], str]] = {
    "cpu": lambda target: LLVM_QUEUE,
    "opencl": lambda target: opencl_queue(target.fingerprint),
}
"""Each backend's compile queue, by backend kind (farm.backends.registry)."""


def worker_queues(cpu_id: str, fingerprints: list[str]) -> list[str]:
    """The queues of a worker on a CPU of class `cpu_id` owning OpenCL devices with `fingerprints`."""
    return [CONTROL_QUEUE, LLVM_QUEUE, tune_queue(cpu_id)] + [opencl_queue(fp) for fp in fingerprints]


# --- tasks and their arguments -----------------------------------------------------------------------------------


class TaskName(str, Enum):
    PLAN_JOB = "farm.plan_job"
    TUNE_KERNEL = "farm.tune_kernel"
    COMPILE_CPU_KERNEL = "farm.compile_cpu_kernel"
    PACK_BLOB = "farm.pack_blob"
    COMPILE_CL_KERNEL = "farm.compile_cl_kernel"
    LINK = "farm.link"
    FINISH = "farm.finish"


COMPILE_TASKS = {"kernel": TaskName.COMPILE_CPU_KERNEL, "blob": TaskName.PACK_BLOB,
                 "clkernel": TaskName.COMPILE_CL_KERNEL}
"""The task of each compile unit kind (farm.build.units): a name each, so Flower tells them apart."""


@dataclass(frozen=True)
class Message:
    """One task to enqueue: its name, JSON arguments and queue."""

    task: str
    args: list[Any]
    queue: str


class TaskArgs:
    """A task's arguments: `encode` gives the positional JSON list Celery carries (readable in Flower: job, unit,
    op, target first), `decode` reads one back and validates it."""

    tasks: ClassVar[tuple[TaskName, ...]]
    job_id: str
    """Every task serves one job, named first (each subclass is a dataclass whose first field it is)."""

    def message(self) -> Message:
        return Message(self.task.value, self.encode(), self.queue)

    @property
    def task(self) -> TaskName:
        return self.tasks[0]

    @property
    def queue(self) -> str:
        return CONTROL_QUEUE

    def encode(self) -> list[Any]:
        return [self.job_id]

    @classmethod
    def decode(cls, args: list[Any]) -> TaskArgs:
        return cls(check_job_id(_arg(args, 0, 1)))


def _arg(args: Any, index: int, count: int) -> Any:
    if not isinstance(args, list) or len(args) != count:
        raise BadInputError(f"task arguments must be a list of {count}, got {str(args)[:200]!r}")
    return args[index]


@dataclass(frozen=True)
class PlanJob(TaskArgs):
    job_id: str
    tasks: ClassVar = (TaskName.PLAN_JOB,)


@dataclass(frozen=True)
class Finish(TaskArgs):
    job_id: str
    tasks: ClassVar = (TaskName.FINISH,)


@dataclass(frozen=True)
class Link(TaskArgs):
    """Link one library: `library` is its id in the job's link plan (assembly.libraries: the CPU target's id, with
    the size's index when the job builds several sizes)."""

    job_id: str
    library: str
    tasks: ClassVar = (TaskName.LINK,)

    @property
    def queue(self) -> str:
        return LLVM_QUEUE

    def encode(self) -> list[Any]:
        return [self.job_id, self.library]

    @classmethod
    def decode(cls, args: list[Any]) -> Link:
        library = _arg(args, 1, 2)
        if not isinstance(library, str) or not 0 < len(library) <= 256:
            raise BadInputError(f"farm.link: library must be a string of 1 to 256 characters, got {library!r:.200}")
        return cls(check_job_id(args[0]), library)


@dataclass(frozen=True)
class Compile(TaskArgs):
    """Build one unit: [job id, unit name, what (op or blob size), target id, unit JSON]."""

    job_id: str
    unit: CompileUnit
    tasks: ClassVar = tuple(COMPILE_TASKS.values())

    @property
    def task(self) -> TaskName:
        return COMPILE_TASKS[self.unit.kind]

    @property
    def queue(self) -> str:
        return COMPILE_QUEUES[self.unit.target.kind](self.unit.target)

    def encode(self) -> list[Any]:
        what = getattr(self.unit.spec, "op", None) or f"{self.unit.spec.nbytes} bytes"
        return [self.job_id, self.unit.name, what, self.unit.target.id, self.unit.to_json()]

    @classmethod
    def decode(cls, args: list[Any]) -> Compile:
        from farm.build.units import CompileUnit

        return cls(check_job_id(_arg(args, 0, 5)), CompileUnit.from_json(args[4]))


@dataclass(frozen=True)
class Tune(TaskArgs):
    """Time one kernel's variants: [job id, unit name, op, target id, spec JSON, target JSON]."""

    job_id: str
    name: str
    spec: KernelSpec
    target: Target
    tasks: ClassVar = (TaskName.TUNE_KERNEL,)

    @property
    def queue(self) -> str:
        return tune_queue(self.target.id)

    def encode(self) -> list[Any]:
        return [self.job_id, self.name, self.spec.op, self.target.id, self.spec.to_json(), self.target.to_json()]

    @classmethod
    def decode(cls, args: list[Any]) -> Tune:
        from farm.ir.specs import KernelSpec

        job_id, name = check_job_id(_arg(args, 0, 6)), args[1]
        if not isinstance(name, str):
            raise BadInputError(f"farm.tune_kernel: unit name must be a string, got {name!r}")
        try:
            spec = KernelSpec.from_json(args[4])
        except (KeyError, TypeError, ValueError) as error:
            raise BadInputError(f"farm.tune_kernel: malformed kernel spec: {error!r}") from None
        return cls(job_id, name, spec, target_from_json(args[5]))


TASK_ARGS: dict[str, type[TaskArgs]] = {task.value: args for args in (PlanJob, Tune, Compile, Link, Finish)
                                        for task in args.tasks}
FIXED_QUEUES = {TaskName.PLAN_JOB.value: CONTROL_QUEUE, TaskName.FINISH.value: CONTROL_QUEUE,
                TaskName.LINK.value: LLVM_QUEUE, TaskName.COMPILE_CPU_KERNEL.value: LLVM_QUEUE,
                TaskName.PACK_BLOB.value: LLVM_QUEUE}
"""Tasks whose queue never depends on their arguments: the Celery app's routes. farm.compile_cl_kernel goes to
its device's queue and farm.tune_kernel to its CPU class's."""


def decode(task: str, args: list[Any]) -> TaskArgs:
    """A task's typed arguments from its name and JSON list."""
    if task not in TASK_ARGS:
        raise BadInputError(f"unknown farm task {task!r}")
    return TASK_ARGS[task].decode(args)


# --- the job record ----------------------------------------------------------------------------------------------


class JobState(str, Enum):
    QUEUED = "queued"
    PLANNING = "planning"
    TUNING = "tuning"
    COMPILING = "compiling"
    LINKING = "linking"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class Codec:
    encode: Callable[[Any], str]
    decode: Callable[[str], Any]


def _json_list(text: str) -> list:
    value = json.loads(text)
    if not isinstance(value, list):
        raise ValueError("not a list")
    return value


def _string_list(text: str) -> list[str]:
    value = _json_list(text)
    if not all(isinstance(item, str) for item in value):
        raise ValueError("not a list of strings")
    return value


def _key(text: str) -> str:
    if not is_key(text):
        raise ValueError(f"{text[:80]!r} is not a store key")
    return text


def check_model_name(name: str) -> str:
    """A model's name (its file's stem) names files on workers and in artifacts: no folders, no dot names."""
    if not isinstance(name, str) or not 0 < len(name) <= 200 or "/" in name or "\\" in name or "\0" in name \
            or name in (".", ".."):
        raise BadInputError(f"model name {str(name)[:80]!r} can't name a file (no '/', at most 200 characters)")
    return name


STR = Codec(str, str)
KEY = Codec(_key, _key)
NAME = Codec(check_model_name, check_model_name)
BOOL = Codec(lambda value: str(bool(value)), lambda text: text == "True")
INT = Codec(lambda value: str(int(value)), int)
FLOAT = Codec(lambda value: repr(float(value)), float)
STATE = Codec(lambda state: JobState(state).value, JobState)
def _targets(text: str) -> list[Target]:
    """Targets read back: at most MAX_TARGETS (a request naming more is refused before they are all parsed)."""
    return check_target_count([target_from_json(data) for data in _json_list(text)[:MAX_TARGETS + 1]])


TARGETS = Codec(lambda targets: json.dumps([t.to_json() for t in targets]), _targets)
STRINGS = Codec(json.dumps, _string_list)
SIZES = Codec(lambda sizes: json.dumps(sizes_to_json(sizes)),
              lambda text: sizes_from_json(value) if (value := _json_list(text)) else [])

MAP_FIELDS = {"tune_errors": "tune_error:", "libraries": "library:", "lost_workers": "lost_worker:"}
"""Record fields that are maps, kept as one hash field per entry (`<prefix><key>`), so that concurrent steps
add entries without overwriting each other."""
MAX_HOLDER_CHARS = 512
"""The longest holder (`<worker name>#<incarnation>`) a record names: a host name (253) with room to spare."""


def _lost_worker(holder: str, text: str) -> tuple[str, int]:
    """A `lost_workers` entry: the holder whose lease lapsed (RunningTask.holder) and how many of the job's tasks it
    held, all dispatched again. Clients print the name (escaped), so its form and length are checked, and the count
    is a positive number."""
    worker, _, incarnation = holder.rpartition("#")
    if not worker or not incarnation or len(holder) > MAX_HOLDER_CHARS:
        raise ValueError(f"{holder[:80]!r} is not a worker's name#incarnation")
    tasks = int(text)
    if tasks < 1:
        raise ValueError(f"{tasks} tasks")
    return holder, tasks


MAP_ENTRIES: dict[str, Callable[[str, str], tuple[str, Any]]] = {"lost_workers": _lost_worker}
"""How a map field's entries are checked when a record is read (key, text -> key, value); the others' entries stay
strings (a tuning error's text; a library's store key, which the store checks when it reads it)."""


@dataclass(frozen=True)
class JobRecord:
    """A farm job as the board keeps it (one Redis hash per job); see `encode_fields` for the wire form."""

    state: JobState
    model_key: str
    model_name: str
    model_sha256: str
    targets: list[Target]
    no_cache: bool = False
    tune: bool = False
    retune: bool = False
    sizes: list[PinnedShapes] = field(default_factory=list)
    """The sizes of dynamic input dimensions the submitter pinned, one artifact holding them all (`--shape`,
    farm.ir.shapes.parse_sizes); none for a static model."""
    submitted_from: str = ""
    created: float = 0.0
    updated: float = 0.0
    finished: float | None = None
    total: int | None = None
    kernels: int = 0
    blobs: int = 0
    targets_total: int = 0
    link_plan_key: str | None = None
    artifact_key: str | None = None
    cached: bool = False
    error: str = ""
    exit_status: int | None = None
    failed_unit: str = ""
    tuning_note: str = ""
    tune_units: list[str] | None = None
    tuned: bool = False
    tune_errors: dict[str, str] = field(default_factory=dict)
    libraries: dict[str, str] = field(default_factory=dict)
    lost_workers: dict[str, int] = field(default_factory=dict)
    """Workers lost while they ran the job's tasks (their holder, `<name>#<incarnation>`) -> how many of its tasks
    each held, which a peer's reaper dispatched again (farm.distributed.leases)."""

    @property
    def is_over(self) -> bool:
        return self.state in TERMINAL

    def tuning_asked(self, flag: str) -> bool:
        """Whether the job asked for `flag` ("tune" or "retune") and its tuning phase hasn't run yet."""
        return bool(getattr(self, flag)) and not self.tuned

    @classmethod
    def decode(cls, hash_fields: dict[str, str]) -> JobRecord:
        """A record from its Redis hash; BadInputError names the first field that doesn't parse."""
        values: dict[str, Any] = {name: {} for name in MAP_FIELDS}
        for name, text in hash_fields.items():
            mapped = next((m for m, prefix in MAP_FIELDS.items() if name.startswith(prefix)), None)
            if mapped:
                key, value = _map_entry(mapped, name[len(MAP_FIELDS[mapped]):], text)
                values[mapped][key] = value
            elif name in CODECS:
                try:
                    values[name] = CODECS[name].decode(text)
                except (ValueError, TypeError, KeyError) as error:
                    raise BadInputError(f"job record field {name!r} is malformed ({error})") from None
        missing = [f.name for f in fields(cls) if f.name not in values and f.default is MISSING
                   and f.default_factory is MISSING]
        if missing:
            raise BadInputError(f"job record lacks {', '.join(missing)}")
        return cls(**values)


def _map_entry(name: str, key: str, text: str) -> tuple[str, Any]:
    """One entry of the map field `name`, checked by its MAP_ENTRIES function if it has one."""
    try:
        return MAP_ENTRIES.get(name, lambda key, text: (key, text))(key, text)
    except ValueError as error:
        raise BadInputError(f"job record field {name!r} is malformed ({error})") from None


CODECS: dict[str, Codec] = {
    "state": STATE, "model_key": KEY, "model_name": NAME, "model_sha256": KEY, "targets": TARGETS,
    "no_cache": BOOL, "tune": BOOL, "retune": BOOL, "submitted_from": STR, "created": FLOAT, "updated": FLOAT,
    "finished": FLOAT, "total": INT, "kernels": INT, "blobs": INT, "targets_total": INT, "link_plan_key": KEY,
    "artifact_key": KEY, "cached": BOOL, "error": STR, "exit_status": INT, "failed_unit": STR, "tuning_note": STR,
    "tune_units": STRINGS, "tuned": BOOL, "sizes": SIZES,
}


REQUEST_FIELDS = ("model_key", "model_name", "model_sha256", "targets", "no_cache", "tune", "retune", "sizes", "submitted_from",
                  "created")
"""The record fields a submitter chooses; every other field (state, keys, counts, errors) is the farm's."""
NONCE = re.compile(r"[0-9a-f]{32}")


def encode_request(record: JobRecord, team: str = "") -> tuple[str, dict[str, str]]:
    """A new job's id and request (request_key): the submitter's fields of `record` and a random nonce. The id is
    the start of the request's sha256 (after `<team>.` for a team's user), so a request rewritten by another
    submitter no longer matches its job."""
    request = {**encode_fields(**{name: getattr(record, name) for name in REQUEST_FIELDS}),
               "nonce": secrets.token_hex(16)}
    digest = request_job_id(request)
    return (f"{check_team(team)}.{digest}" if team else digest), request


def request_job_id(request: dict[str, str]) -> str:
    """The job id a request stands for: the first 16 hex digits of the sha256 of its fields."""
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()[:16]


def decode_request(hash_fields: dict[str, str], job_id: str) -> JobRecord:
    """The queued record a request asks for. A request is a submitter's word: a field it may not set, a field
    missing or one that doesn't parse is refused (BadInputError naming it), so is a request that isn't the one
    its job id was made from. `model_key` is the split graph the submitter staged (farm.frontend.split), which
    the intake checks against its bytes; `model_sha256` is the submitter's word for its model file, which never
    reaches the farm (the build identity holds both: farm.distributed.steps.artifact_ref)."""
    allowed = (*REQUEST_FIELDS, "nonce")
    extra = sorted(set(hash_fields) - set(allowed))
    missing = [name for name in allowed if name not in hash_fields]
    if extra or missing:
        raise BadInputError(f"job request {'has fields it may not set: ' + ', '.join(extra) if extra else ''}"
                            f"{'; ' if extra and missing else ''}{'lacks ' + ', '.join(missing) if missing else ''}")
    if not NONCE.fullmatch(hash_fields["nonce"]) or request_job_id(hash_fields) != job_id.rpartition(".")[2]:
        raise BadInputError(f"job request of {job_id} is not the one its id was made from (rewritten)")
    values = {}
    for name in REQUEST_FIELDS:
        try:
            values[name] = CODECS[name].decode(hash_fields[name])
        except (ValueError, TypeError, KeyError) as error:
            raise BadInputError(f"job request field {name!r} is malformed ({error})") from None
    if not math.isfinite(values["created"]) or len(values["submitted_from"]) > 255:
        raise BadInputError("job request field 'created' or 'submitted_from' is out of range")
    return JobRecord(JobState.QUEUED, updated=values["created"], **values)


def encode_fields(**values: Any) -> dict[str, str]:
    """Record fields as Redis hash fields (strings); map fields become one hash field per entry."""
    encoded = {}
    for name, value in values.items():
        if name in MAP_FIELDS:
            encoded.update({f"{MAP_FIELDS[name]}{key}": str(item) for key, item in value.items()})
        elif name in CODECS:
            encoded[name] = CODECS[name].encode(value)
        else:
            raise ValueError(f"no job record field {name!r}")
    return encoded


def encode_record(record: JobRecord) -> dict[str, str]:
    """Every set field of a record (None fields are left out)."""
    return encode_fields(**{f.name: getattr(record, f.name) for f in fields(record)
                            if getattr(record, f.name) is not None})


# --- running tasks -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningTask:
    """A task a worker has started and not finished: `holder` is "<worker name>#<incarnation>" (its lease holds the
    incarnation), `message` the task to send again if the holder dies."""

    holder: str
    message: Message

    def encode(self) -> str:
        return json.dumps({"holder": self.holder, "task": self.message.task, "args": self.message.args,
                           "queue": self.message.queue}, sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> RunningTask:
        """A running task read back, re-validated: its message is rebuilt from its decoded arguments, so a forged
        entry can only ever resend a well-formed farm task."""
        try:
            data = json.loads(text)
            holder, task, args = data["holder"], data["task"], data["args"]
        except (ValueError, KeyError, TypeError) as error:
            raise BadInputError(f"malformed running-task entry: {error!r}") from None
        if not isinstance(holder, str) or "#" not in holder:
            raise BadInputError(f"running-task entry with a malformed holder {str(holder)[:80]!r}")
        return cls(holder, decode(task, args).message())

    @property
    def worker(self) -> str:
        return self.holder.rpartition("#")[0]

    @property
    def job_id(self) -> str:
        """The job the task serves: every farm task's arguments name it first (checked by `decode`)."""
        return self.message.args[0]

    @property
    def incarnation(self) -> str:
        return self.holder.rpartition("#")[2]
