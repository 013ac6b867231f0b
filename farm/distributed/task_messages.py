"""The farm's task messages, in one place: task names, queues, each task's arguments with their encoding, and the
running tasks a worker's peers dispatch again. The client, the Celery app, the steps, the workers and the tests all
use it; nothing else knows a task name, and the queues it routes to are the `control` queue and the ones each
backend names (farm.backends.base.Backend.compile_queue, queues_served).

Messages cross a trust boundary (a forged running-task entry, a redelivered message), so every decode validates what
it reads and raises BadInputError naming the field: a bad message fails its task, never reaches IR, paths or shell
text. The compile units and kernel specs that only workers decode are imported by those decodes, so clients import
this module on installs without numpy or llvmlite (pip install farm).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

from farm.backends.llvm.backend import LLVM_QUEUE, tune_queue
from farm.backends.registry import BACKENDS, Target, backend_of, target_from_json
from farm.distributed.redis_keys import check_job_id
from farm.errors import BadInputError
from farm.ir.unit_kinds import UnitKind

if TYPE_CHECKING:
    from farm.build.units import CompileUnit
    from farm.ir.specs import KernelSpec


# --- queues ------------------------------------------------------------------------------------------------------

CONTROL_QUEUE = "control"
"""Planning and finishing jobs: any worker."""


def compile_queue(target: Target) -> str:
    """The queue of a target's compile units: its backend names it (`llvm`, `opencl.<fingerprint>`)."""
    return backend_of(target).compile_queue(target)


def worker_queues(capabilities: dict[str, Any]) -> list[str]:
    """The queues of a worker with these capabilities: `control`, then each backend's queues for what the worker
    advertises of its kind (`llvm` and `tune.<cpu id>`, `opencl.<fingerprint>` per device)."""
    return [CONTROL_QUEUE] + [
        queue for kind, backend in BACKENDS.items() for queue in backend.queues_served(capabilities[kind])
    ]


# --- tasks and their arguments -----------------------------------------------------------------------------------


class TaskName(str, Enum):
    PLAN_JOB = "farm.plan_job"
    TUNE_KERNEL = "farm.tune_kernel"
    COMPILE_CPU_KERNEL = "farm.compile_cpu_kernel"
    PACK_BLOB = "farm.pack_blob"
    COMPILE_CL_KERNEL = "farm.compile_cl_kernel"
    LINK = "farm.link"
    FINISH = "farm.finish"


COMPILE_TASKS = {
    UnitKind.KERNEL: TaskName.COMPILE_CPU_KERNEL,
    UnitKind.BLOB: TaskName.PACK_BLOB,
    UnitKind.CL_KERNEL: TaskName.COMPILE_CL_KERNEL,
}
"""The task of each compile unit kind (farm.build.units): a name each, so Flower tells them apart."""


@dataclass(frozen=True)
class Message:
    """One task to enqueue: its name, JSON arguments and queue."""

    task: str
    args: list[Any]
    queue: str


@dataclass(frozen=True)
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
        return compile_queue(self.unit.target)

    def encode(self) -> list[Any]:
        from farm.ir.specs import BlobSpec

        spec = self.unit.spec
        what = f"{spec.nbytes} bytes" if isinstance(spec, BlobSpec) else spec.op
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


TASK_ARGS: dict[str, type[TaskArgs]] = {
    task.value: args for args in (PlanJob, Tune, Compile, Link, Finish) for task in args.tasks
}
FIXED_QUEUES = {
    TaskName.PLAN_JOB.value: CONTROL_QUEUE,
    TaskName.FINISH.value: CONTROL_QUEUE,
    TaskName.LINK.value: LLVM_QUEUE,
    TaskName.COMPILE_CPU_KERNEL.value: LLVM_QUEUE,
    TaskName.PACK_BLOB.value: LLVM_QUEUE,
}
"""Tasks whose queue never depends on their arguments: the Celery app's routes. farm.compile_cl_kernel goes to
its device's queue and farm.tune_kernel to its CPU class's."""


def decode(task: str, args: list[Any]) -> TaskArgs:
    """A task's typed arguments from its name and JSON list."""
    if task not in TASK_ARGS:
        raise BadInputError(f"unknown farm task {task!r}")
    return TASK_ARGS[task].decode(args)


# --- running tasks -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningTask:
    """A task a worker has started and not finished: `holder` is "<worker name>#<incarnation>" (its lease holds the
    incarnation), `message` the task to send again if the holder dies."""

    holder: str
    message: Message

    def encode(self) -> str:
        return json.dumps(
            {"holder": self.holder, "task": self.message.task, "args": self.message.args, "queue": self.message.queue},
            sort_keys=True,
        )

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
