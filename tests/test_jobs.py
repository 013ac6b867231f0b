"""Farm jobs: the steps of farm/distributed/steps.py driven in-process against a real redis-server (the job board's
own tests are in test_board.py).

The Farm steps run here without Celery: `dispatch` appends (task name, args) to a list, and `run_tasks` plays the
part of the workers, decoding each task's arguments and running its step as farm/distributed/tasks.py does, in the
order the tasks were sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest

from farm import defaults
from farm.backends.llvm.part import entry_object, entry_ref
from farm.backends.llvm.target import host_target
from farm.build import assembly
from farm.build.assembly import compile_units, plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.units import CompileUnit, compile_unit
from farm.distributed import pins, recipes, redis_keys, task_messages
from farm.distributed.board import JobBoard
from farm.distributed.client import FarmClient
from farm.distributed.job_record import TERMINAL, JobRecord, JobState
from farm.distributed.steps import Farm, JobFailed, artifact_ref
from farm.distributed.task_messages import Compile, Message
from farm.errors import ExitStatus
from farm.store import FileStore, RedisStore, StoreUnreachableError
from farm.tools import examples
from tests.services import RedisServer, free_port, redis_server_fixture, redis_servers_fixture  # noqa: F401

COMPILE_TASKS = ("farm.compile_cpu_kernel", "farm.pack_blob")


# --- helpers -----------------------------------------------------------------------------------------------------


class Tasks(list):
    """The queue of dispatched tasks, as (task name, args); `dispatch` is the Farm's way of enqueuing, and `sent`
    counts every task ever dispatched."""

    sent = 0

    def dispatch(self, message: Message) -> None:
        self.append((message.task, json.loads(json.dumps(message.args))))  # as the real dispatcher sends JSON
        self.sent += 1


def run_task(farm: Farm, name: str, args: list[Any]) -> str | None:
    """Run one task the way farm/distributed/tasks.py does: decode its arguments and run its step. A step that
    fails its job raises JobFailed, which Celery records as the task's FAILURE: here it ends the task too."""
    with contextlib.suppress(JobFailed):
        return farm.run(task_messages.decode(name, args))
    return None


def run_tasks(farm: Farm, tasks: Tasks, before: Callable[[int, str], None] | None = None) -> list[str]:
    """Run dispatched tasks first in, first out until none remain; returns the names of those run, in order."""
    ran: list[str] = []
    while tasks:
        name, args = tasks.pop(0)
        if before is not None:
            before(len(ran), name)
        ran.append(name)
        run_task(farm, name, args)
    return ran


def create_job(board: JobBoard, store: FileStore, model: Path, no_cache: bool = False) -> str:
    """A job record as FarmClient.submit writes it (the model's bytes in the store, the record naming them)."""
    data = model.read_bytes()
    job_id = uuid.uuid4().hex[:16]
    board.create(
        job_id,
        JobRecord(
            JobState.QUEUED,
            store.put(data),
            model.stem,
            hashlib.sha256(data).hexdigest(),
            [host_target()],
            no_cache=no_cache,
        ),
    )
    return job_id


def run_job(farm: Farm, tasks: Tasks, job_id: str, **options: Any) -> list[str]:
    """Plan the job (as the queued farm.plan_job would) and run everything that follows."""
    tasks.append(("farm.plan_job", [job_id]))
    return run_tasks(farm, tasks, **options)


def forget_artifact(farm: Farm, job_id: str) -> None:
    """Drop the cached artifact of a finished job, so that the next job for the model plans and links again."""
    farm.store.delete_ref(artifact_ref(farm.board.get(job_id)))


def artifact_bytes(farm: Farm, job_id: str) -> bytes:
    """The artifact a download writes from the job's recipe (farm.distributed.recipes)."""
    record = farm.board.get(job_id)
    assert record is not None and record.state == "done", record
    with tempfile.TemporaryDirectory(prefix="farm-download-") as folder:
        recipe = recipes.read_recipe(farm.store.get(record.artifact_key))
        return Path(recipes.write_artifact_from(Path(folder) / "model.farm", recipe, farm.store.get)).read_bytes()


# --- fixtures ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


@pytest.fixture(scope="module")
def local_artifact(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The artifact of a local build of the same model: what every farm build must equal byte for byte."""
    with LocalExecutor(1) as executor:
        result = build_model(model_path, tmp_path_factory.mktemp("local"), executor=executor)
    return Path(result.artifact).read_bytes()


@pytest.fixture(scope="module")
def units(model_path: Path) -> list[CompileUnit]:
    return compile_units(plan_model(model_path), [host_target()])


@pytest.fixture
def board(redis_server: RedisServer) -> JobBoard:
    return JobBoard(redis_server.url)


@pytest.fixture
def tasks() -> Tasks:
    return Tasks()


@pytest.fixture
def farm(board: JobBoard, tmp_path: Path, tasks: Tasks) -> Farm:
    return Farm(board, FileStore(tmp_path / "store"), tasks.dispatch)


# --- units as JSON -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["kernel", "blob"])
def test_unit_json_round_trip(units: list[CompileUnit], kind: str) -> None:
    unit = next(u for u in units if u.kind == kind)
    data = json.loads(json.dumps(unit.to_json()))  # as a Celery JSON message carries it
    back = CompileUnit.from_json(data)
    assert back == unit
    assert back.name == unit.name and back.cache_ref == unit.cache_ref and back.spec.key == unit.spec.key
    assert type(back.spec) is type(unit.spec) and back.target == unit.target


def test_every_unit_round_trips_to_the_same_object(units: list[CompileUnit], model_path: Path) -> None:
    plan = plan_model(model_path)
    for unit in units:
        back = CompileUnit.from_json(json.loads(json.dumps(unit.to_json())))
        data = memoryview(plan.blobs[unit.spec.data_sha256]).cast("B") if unit.kind == "blob" else None
        if unit.kind == "kernel":  # a blob's object is the same by construction; a kernel's spec is rebuilt
            assert compile_unit(back, data) == compile_unit(unit, data)


def test_compile_task_arguments_name_the_job_unit_op_and_target(units: list[CompileUnit]) -> None:
    kernel = next(u for u in units if u.kind == "kernel")
    blob = next(u for u in units if u.kind == "blob")
    job_id = "0123456789abcdef"
    message = Compile(job_id, kernel).message()
    assert message.task == "farm.compile_cpu_kernel" and message.queue == "llvm"
    assert message.args[:4] == [job_id, kernel.name, kernel.spec.op, kernel.target.id]
    message = Compile(job_id, blob).message()
    assert message.task == "farm.pack_blob" and message.args[:4] == [
        job_id,
        blob.name,
        f"{blob.spec.nbytes} bytes",
        blob.target.id,
    ]
    assert task_messages.decode(message.task, message.args) == Compile(job_id, blob)
    assert blob.data_key == blob.spec.data_sha256  # the store is content-addressed: the weights' key is their sha256


# --- the Farm steps, in-process ----------------------------------------------------------------------------------


def test_a_job_builds_the_same_artifact_as_a_local_build(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, units: list[CompileUnit]
) -> None:
    job_id = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, job_id)

    compiles = [name for name in ran if name in COMPILE_TASKS]
    assert len(compiles) == len(units)
    assert ran.count("farm.compile_cpu_kernel") == sum(u.kind == "kernel" for u in units)
    assert ran[0] == "farm.plan_job" and ran[-2:] == ["farm.link", "farm.finish"]
    record = farm.board.get(job_id)
    assert record.state == "done" and record.total == len(units)
    assert record.kernels + record.blobs == len(units) and record.targets_total == 1
    assert farm.board.finished(job_id, "compile") == len(units)
    assert artifact_bytes(farm, job_id) == local_artifact


def test_a_second_job_for_the_same_model_compiles_nothing(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, units: list[CompileUnit]
) -> None:
    first = create_job(farm.board, farm.store, model_path)
    run_job(farm, tasks, first)

    second = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, second)
    assert ran == ["farm.plan_job"]  # the same model bytes and targets: the cached artifact, at once
    record = farm.board.get(second)
    assert record.total == 0 and record.cached
    assert artifact_bytes(farm, second) == local_artifact

    forget_artifact(farm, second)  # without the artifact, the objects are still cached: link, but compile nothing
    third = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, third)
    assert ran == ["farm.plan_job", "farm.link", "farm.finish"]
    record = farm.board.get(third)  # progress (done of total) is complete, however cached units are counted
    assert record.total == farm.board.finished(third, "compile")
    assert artifact_bytes(farm, third) == local_artifact

    uncached = create_job(farm.board, farm.store, model_path, no_cache=True)
    ran = run_job(farm, tasks, uncached)
    assert sum(name in COMPILE_TASKS for name in ran) == len(units)
    assert artifact_bytes(farm, uncached) == local_artifact


def test_a_truncated_model_fails_the_job_with_bad_input(
    farm: Farm, tasks: Tasks, model_path: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken_net.onnx"
    data = model_path.read_bytes()
    broken.write_bytes(data[: len(data) // 2])
    job_id = create_job(farm.board, farm.store, broken)
    ran = run_job(farm, tasks, job_id)

    assert ran == ["farm.plan_job"]  # nothing compiled
    record = farm.board.get(job_id)
    assert record.state == "failed" and record.exit_status == ExitStatus.BAD_INPUT
    assert "broken_net.onnx" in record.error
    assert record.artifact_key is None


def test_an_entry_the_link_plan_step_cannot_compile_fails_the_job_with_its_status(
    farm: Farm, tasks: Tasks, model_path: Path
) -> None:
    """A CPU that LLVM does not know: the plan's link plan step, compiling the entry, fails the job as the link
    would (bad input, exit status 2, naming the CPU), not as a crashed task."""
    from farm.backends.llvm.target import CpuTarget

    job_id = create_job(farm.board, farm.store, model_path)
    farm.board.update(job_id, targets=[CpuTarget(host_target().triple, "bogus-cpu")])
    run_task(farm, "farm.plan_job", [job_id])

    record = farm.board.get(job_id)
    assert record.state == "failed" and record.exit_status == ExitStatus.BAD_INPUT, record
    assert "'bogus-cpu' is not a recognized processor" in record.error


@pytest.mark.parametrize(
    "cancel_before", [0, 1, 6, 13, 14], ids=["plan", "first-compile", "mid-compile", "link", "finish"]
)
def test_a_cancel_between_steps_stops_the_job(
    farm: Farm, tasks: Tasks, model_path: Path, redis_server: RedisServer, units: list[CompileUnit], cancel_before: int
) -> None:
    """Tasks run in order: 0 plan_job, 1-12 the compiles, 13 link, 14 finish; the cancel comes before one of them."""
    assert len(units) == 12  # the indices above assume tiny_cnn's 9 kernel units (a conv in parts) and 3 packed
    # weights
    job_id = create_job(farm.board, farm.store, model_path)
    client = FarmClient(redis_server.url)
    sent_at_cancel: list[int] = []

    def cancel(index: int, name: str) -> None:
        if index == cancel_before:
            assert client.cancel(job_id) is True
            sent_at_cancel.append(tasks.sent)

    run_job(farm, tasks, job_id, before=cancel)
    assert sent_at_cancel == [tasks.sent], "the job ended before the cancel, or dispatched tasks after it"
    record = farm.board.get(job_id)
    assert record.state == "cancelled" and record.error == "cancelled by user"
    assert record.artifact_key is None


def test_a_cancel_stops_all_dispatching(farm: Farm, tasks: Tasks, model_path: Path) -> None:
    job_id = create_job(farm.board, farm.store, model_path)
    farm.plan_job(job_id)
    queued = list(tasks)
    assert len(queued) == 12
    assert farm.board.advance(job_id, JobState.CANCELLED, error="cancelled by user")
    tasks.clear()
    for name, args in queued:  # every queued compile still runs, as a worker would take it, and does nothing
        run_task(farm, name, args)
    assert tasks == []
    assert farm.board.finished(job_id, "compile") == 0
    assert farm.board.get(job_id).state == "cancelled"


class HookedStore(FileStore):
    """A real FileStore that calls `hook(method, argument)` first: lets a test act, as a second client would, at an
    exact point inside a step (there is no other way to interleave deterministically)."""

    def __init__(self, root: Path, hook: Callable[[str, str], None]) -> None:
        super().__init__(root)
        self.hook = hook

    def get(self, key: str) -> bytes:
        self.hook("get", key)
        return super().get(key)

    def set_ref(self, name: str, key: str, anchor: str | None = None) -> None:
        self.hook("set_ref", name)
        super().set_ref(name, key, anchor)


@pytest.mark.parametrize("during", ["planning", "last-compile", "link"])
def test_a_cancel_during_a_step_is_not_undone(
    board: JobBoard, tmp_path: Path, model_path: Path, units: list[CompileUnit], during: str
) -> None:
    """A user cancels while a worker is inside a step: the step must not move the job back to a live state.

    planning: the cancel lands while the model is being planned (after plan_job read the record);
    last-compile: it lands while the last unit compiles (after compile checked the job was live);
    link: it lands while a library links.
    """
    tasks = Tasks()
    state = {"job": "", "armed": True}
    last_ref = units[-1].cache_ref

    def hook(method: str, argument: str) -> None:
        if not state["armed"] or not state["job"]:
            return
        record = board.get(state["job"])
        hit = {
            "planning": method == "get" and argument == record.model_key,
            "last-compile": method == "set_ref" and argument == last_ref,
            "link": method == "get" and record.state == "linking" and argument == record.link_plan_key,
        }
        if hit[during]:
            state["armed"] = False
            assert board.advance(state["job"], JobState.CANCELLED, error="cancelled by user")

    store = HookedStore(tmp_path / "store", hook)
    farm = Farm(board, store, tasks.dispatch)
    state["job"] = create_job(board, store, model_path)
    run_job(farm, tasks, state["job"])

    assert not state["armed"], "the cancel never happened"
    record = board.get(state["job"])
    assert record.state == "cancelled", (
        f"a cancel during {during} was overwritten: the job went on to {record.state!r} "
        "(a step set the state without checking that the job is still live)"
    )
    assert record.artifact_key is None


def test_a_corrupt_cached_object_is_rebuilt_at_link(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, units: list[CompileUnit]
) -> None:
    first = create_job(farm.board, farm.store, model_path)
    run_job(farm, tasks, first)
    forget_artifact(farm, first)
    unit = next(u for u in units if u.kind == "kernel")
    key = farm.store.get_ref(unit.cache_ref)
    assert key is not None
    good = farm.store.get(key)
    farm.store.object_path(key).write_bytes(b"not the object: a disk fault" * 10)

    job_id = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, job_id)
    assert ran == ["farm.plan_job", "farm.link", "farm.finish"]  # the cheap check believed the cache
    assert artifact_bytes(farm, job_id) == local_artifact  # and link rebuilt the object
    assert farm.store.get(key) == good and farm.store.get_ref(unit.cache_ref) == key


def test_a_packed_weight_is_cached_as_its_key_while_the_weight_it_is_made_from_is_in_the_store(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, units: list[CompileUnit]
) -> None:
    """A packed weight's cache ref names bytes the store never holds (farm.distributed.recipes.Derivation): the
    next job takes it as built and packs nothing while its weight is there, and packs it again once it is not."""
    first = create_job(farm.board, farm.store, model_path)
    run_job(farm, tasks, first)
    forget_artifact(farm, first)
    unit = next(u for u in units if u.kind == "blob")
    key = farm.store.get_ref(unit.cache_ref)
    assert key is not None and not farm.store.has(key) and farm.store.has(unit.data_key)

    again = create_job(farm.board, farm.store, model_path)
    assert run_job(farm, tasks, again) == ["farm.plan_job", "farm.link", "farm.finish"]
    assert artifact_bytes(farm, again) == local_artifact
    forget_artifact(farm, again)
    farm.store.delete(unit.data_key)
    third = create_job(farm.board, farm.store, model_path)  # uploads the weight again
    assert "farm.pack_blob" in run_job(farm, tasks, third) and artifact_bytes(farm, third) == local_artifact


def test_a_missing_cached_object_is_compiled_again(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, units: list[CompileUnit]
) -> None:
    first = create_job(farm.board, farm.store, model_path)
    run_job(farm, tasks, first)
    forget_artifact(farm, first)
    unit = units[0]
    farm.store.delete(farm.store.get_ref(unit.cache_ref))

    job_id = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, job_id)
    assert [name for name in ran if name in COMPILE_TASKS] == ["farm.compile_cpu_kernel"]
    assert artifact_bytes(farm, job_id) == local_artifact


def _plan_and_take_first_compile(farm: Farm, tasks: Tasks, job_id: str) -> tuple[str, list[Any]]:
    farm.plan_job(job_id)
    return tasks.pop(0)


def test_a_unit_delivered_more_than_the_cap_fails_the_job(
    farm: Farm, tasks: Tasks, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FARM_MAX_DELIVERIES", raising=False)
    assert defaults.max_deliveries() == 3
    job_id = create_job(farm.board, farm.store, model_path)
    name, args = _plan_and_take_first_compile(farm, tasks, job_id)
    unit_name = args[1]
    for _ in range(3):  # three earlier deliveries, each lost with its worker
        farm.board.count_delivery(job_id, unit_name)

    with pytest.raises(JobFailed, match="started 3 times and never finished"):
        farm.run(task_messages.decode(name, args))
    record = farm.board.get(job_id)
    assert record.state == "failed" and record.failed_unit == unit_name
    assert unit_name in record.error and "3 times" in record.error
    unit = CompileUnit.from_json(args[4])
    assert f"kernel {unit.spec.op} of node" in record.error  # named as the user knows it: op and ONNX node
    assert record.exit_status == ExitStatus.BUILD_FAILED
    assert farm.store.get_ref(unit.cache_ref) is None  # it was not compiled

    assert run_task(farm, *tasks[0]) == f"skipped: job {job_id} is failed"  # Flower shows why it did nothing
    run_tasks(farm, tasks)  # the rest of the job's tasks do nothing
    assert farm.board.get(job_id).state == "failed" and farm.board.get(job_id).artifact_key is None


def test_the_last_delivery_below_the_cap_still_runs(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes
) -> None:
    job_id = create_job(farm.board, farm.store, model_path)
    name, args = _plan_and_take_first_compile(farm, tasks, job_id)
    for _ in range(defaults.max_deliveries() - 1):
        farm.board.count_delivery(job_id, args[1])
    tasks.insert(0, (name, args))
    run_tasks(farm, tasks)
    assert artifact_bytes(farm, job_id) == local_artifact


def test_a_failing_compile_fails_the_job_naming_the_unit(farm: Farm, tasks: Tasks, model_path: Path) -> None:
    job_id = create_job(farm.board, farm.store, model_path)
    farm.plan_job(job_id)
    victim = next(args for name, args in tasks if name == "farm.pack_blob")
    victim[4]["spec"]["bytes"] += 4  # the spec no longer matches its weights' bytes: pack_blob refuses them
    with pytest.raises(JobFailed) as failed:
        farm.run(task_messages.decode("farm.pack_blob", victim))
    assert failed.value.exit_status == ExitStatus.BUILD_FAILED and victim[1] in str(failed.value)

    record = farm.board.get(job_id)
    assert record.state == "failed" and record.failed_unit == victim[1]
    assert victim[1] in record.error and record.exit_status == ExitStatus.BUILD_FAILED


def test_every_task_delivered_twice_still_links_and_finishes_once(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes
) -> None:
    """Redis redelivers an unacknowledged task after its worker died: each step must count once."""
    job_id = create_job(farm.board, farm.store, model_path)
    farm.plan_job(job_id)
    ran: list[str] = []
    while tasks:
        name, args = tasks.pop(0)
        for _ in range(2):
            ran.append(name)
            run_task(farm, name, json.loads(json.dumps(args)))
    assert ran.count("farm.link") == 2 and ran.count("farm.finish") == 2  # each dispatched once, run twice
    assert artifact_bytes(farm, job_id) == local_artifact


def test_deliveries_of_a_unit_that_already_finished_dont_fail_the_job(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes
) -> None:
    """The cap is for a unit "started N times and never finished"; a unit that finished at its first delivery can
    still be run again by duplicate messages (a redelivered plan_job dispatches every uncached unit again, and each
    message can itself be redelivered when its worker dies before the ack). Those runs must not fail the job."""
    job_id = create_job(farm.board, farm.store, model_path)
    farm.plan_job(job_id)
    name, args = tasks.pop(0)
    for _ in range(defaults.max_deliveries() + 1):
        run_task(farm, name, args)
    record = farm.board.get(job_id)
    assert record.state == "compiling", (
        f"a unit that finished at its first run failed the job: {record.error!r} (compile counts a delivery "
        "before checking whether the unit is already in the job's :compile set)"
    )
    run_tasks(farm, tasks)
    assert artifact_bytes(farm, job_id) == local_artifact


@pytest.mark.parametrize("compiled_before", [0, 7, 10])
def test_a_redelivered_plan_job_still_finishes_the_job(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, compiled_before: int
) -> None:
    """plan_job's worker dies after dispatching (acks_late: Redis redelivers it) while other workers compile.

    The second plan_job sees some units cached and must not leave the job waiting for a count it can't reach.
    """
    job_id = create_job(farm.board, farm.store, model_path)
    farm.plan_job(job_id)
    for _ in range(compiled_before):
        run_task(farm, *tasks.pop(0))
    events = farm.board.redis.pubsub(ignore_subscribe_messages=True)
    events.subscribe(redis_keys.job_events_channel(job_id))
    assert events.get_message(timeout=5) is None  # the subscription's confirmation, taken
    farm.plan_job(job_id)  # the redelivery
    published = []
    while (message := events.get_message(timeout=0.5)) is not None:
        published.append(message["data"])
    events.close()
    assert not {"planning", "compiling"} & set(published), (
        f"the redelivered plan_job moved the job back ({published}): its waiting clients showed planning after "
        "the compile count"
    )
    run_tasks(farm, tasks)
    record = farm.board.get(job_id)
    assert record.state == "done", (
        f"after {compiled_before} of 10 units compiled, a second plan_job set total={record.total} and the "
        f"job stays {record.state!r}: the compile count (10 distinct units) never equals the new total"
    )
    assert artifact_bytes(farm, job_id) == local_artifact


def test_units_that_finish_before_the_link_plan_is_named_are_linked_once(
    board: JobBoard, tmp_path: Path, model_path: Path, local_artifact: bytes
) -> None:
    """The plan dispatches the units before it makes the link plan, so that they compile meanwhile. Here each unit
    runs the moment it is dispatched and finds no link plan named yet; the plan, once it has named it, finds every
    unit finished and starts linking itself. A plan delivered again after that starts nothing more."""
    tasks = Tasks()
    farm = Farm(board, FileStore(tmp_path / "store"), tasks.dispatch)

    def compile_at_once(message: Message) -> None:
        if message.task in COMPILE_TASKS:
            run_task(farm, message.task, json.loads(json.dumps(message.args)))
        else:
            tasks.dispatch(message)

    farm.dispatch = compile_at_once
    job_id = create_job(board, farm.store, model_path)
    farm.plan_job(job_id)
    assert [name for name, _ in tasks] == ["farm.link"] and board.get(job_id).state == "linking"
    farm.plan_job(job_id)  # redelivered: every unit is finished and linking has started
    assert [name for name, _ in tasks] == ["farm.link"]
    run_tasks(farm, tasks)
    assert artifact_bytes(farm, job_id) == local_artifact


@pytest.mark.parametrize("step", ["compile", "link"])
def test_a_store_outage_is_left_to_the_task_to_retry(
    redis_servers: Callable[..., RedisServer], model_path: Path, local_artifact: bytes, step: str
) -> None:
    """The store on its own server (FARM_STORE_URL) goes away mid-job: the step must raise StoreUnreachableError,
    which FarmTask retries ("retried while Redis is away"), not fail the job as if the unit's code were wrong."""
    board_server, store_server = redis_servers(), redis_servers()
    tasks = Tasks()
    farm = Farm(JobBoard(board_server.url), RedisStore(store_server.url), tasks.dispatch)
    job_id = create_job(farm.board, farm.store, model_path)
    farm.plan_job(job_id)
    if step == "link":
        while tasks[0][0] != "farm.link":
            run_task(farm, *tasks.pop(0))
    store_server.stop()
    with pytest.raises(StoreUnreachableError):
        run_task(farm, *tasks[0])
    record = farm.board.get(job_id)
    assert record.state not in TERMINAL, f"a store outage failed the job: {record.error}"

    store_server.start()  # the retry, once the store is back, finishes the job
    run_tasks(farm, tasks)
    assert artifact_bytes(farm, job_id) == local_artifact


def test_a_corrupt_cached_artifact_is_never_reused(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes
) -> None:
    first = create_job(farm.board, farm.store, model_path)
    run_job(farm, tasks, first)
    key = farm.board.get(first).artifact_key
    farm.store.object_path(key).write_bytes(local_artifact[:-10] + b"x" * 10)  # same size, other bytes

    second = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, second)
    assert ran == ["farm.plan_job", "farm.link", "farm.finish"]  # rebuilt from the cached objects
    assert artifact_bytes(farm, second) == local_artifact and farm.board.get(second).artifact_key == key


# --- toolchains --------------------------------------------------------------------------------------------------
# A process's toolchain is measured (farm/backends/llvm/toolchain.py); FARM_TOOLCHAIN_LABEL marks it, so two
# farms in this one process report different toolchains by running under different labels.


def test_farms_with_different_toolchains_never_share_an_object_or_an_artifact(
    board: JobBoard,
    tmp_path: Path,
    model_path: Path,
    local_artifact: bytes,
    units: list[CompileUnit],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = FileStore(tmp_path / "store")  # one store: only the refs keep the toolchains apart
    tasks_a, tasks_b = Tasks(), Tasks()
    farm_a, farm_b = Farm(board, store, tasks_a.dispatch), Farm(board, store, tasks_b.dispatch)

    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "toolchain-a")
    first = create_job(board, store, model_path)
    assert sum(name in COMPILE_TASKS for name in run_job(farm_a, tasks_a, first)) == len(units)
    refs_a, artifact_a = {unit.cache_ref for unit in units}, artifact_ref(board.get(first))

    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "toolchain-b")
    second = create_job(board, store, model_path)
    ran = run_job(farm_b, tasks_b, second)
    assert sum(name in COMPILE_TASKS for name in ran) == len(units)  # nothing of toolchain a was read
    refs_b, artifact_b = {unit.cache_ref for unit in units}, artifact_ref(board.get(second))
    assert refs_a.isdisjoint(refs_b) and artifact_a != artifact_b
    assert all(store.get_ref(ref) for ref in refs_a | refs_b | {artifact_a, artifact_b})
    assert not board.get(second).cached
    assert artifact_bytes(farm_a, first) == artifact_bytes(farm_b, second) == local_artifact  # same real LLVM

    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "toolchain-a")  # the same toolchain still shares everything
    third = create_job(board, store, model_path)
    assert run_job(farm_a, tasks_a, third) == ["farm.plan_job"] and board.get(third).cached
    assert artifact_bytes(farm_a, third) == local_artifact


def test_a_worker_links_only_objects_its_own_toolchain_built(
    farm: Farm,
    tasks: Tasks,
    model_path: Path,
    local_artifact: bytes,
    units: list[CompileUnit],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mixed farm: the job is planned and compiled by workers of toolchain a, linked and finished by one of
    toolchain b, which compiles the objects again rather than link a's."""
    cpu_units = [unit for unit in units if unit.kind in ("kernel", "blob")]
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "toolchain-a")
    job_id = create_job(farm.board, farm.store, model_path)

    def switch_at_link(index: int, name: str) -> None:
        if name == "farm.link":
            monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "toolchain-b")
            assert not any(farm.store.get_ref(unit.cache_ref) for unit in cpu_units)

    ran = run_job(farm, tasks, job_id, before=switch_at_link)
    assert ran[-2:] == ["farm.link", "farm.finish"]
    assert all(farm.store.get_ref(unit.cache_ref) for unit in cpu_units)  # built again, under b's refs
    libraries = assembly.libraries(json.loads(farm.store.get(farm.board.get(job_id).link_plan_key)))
    assert all(farm.store.get_ref(entry_ref(library)) for library in libraries)  # the entry too
    assert farm.store.get_ref(artifact_ref(farm.board.get(job_id)))
    assert artifact_bytes(farm, job_id) == local_artifact


def test_a_job_whose_entries_were_evicted_between_runs_rebuilds_them(
    board: JobBoard,
    tasks: Tasks,
    redis_server: RedisServer,
    model_path: Path,
    local_artifact: bytes,
    units: list[CompileUnit],
    tmp_path: Path,
) -> None:
    """Every kind of entry a job leaves (model, weights, link plan, objects, library, artifact) evicted, with the
    refs to them: the next job for the model is a cache miss throughout, and builds the same artifact."""
    store = RedisStore(redis_server.url)
    farm = Farm(board, store, tasks.dispatch)
    first = create_job(board, store, model_path)
    run_job(farm, tasks, first)
    FarmClient(redis_server.url).download(first, tmp_path)  # the artifact's pin goes at the sweep after the download
    pins.release_ended_jobs(board, store)
    store.set_max_bytes(1)
    store.evict()
    assert store.stats().entries == 0 and store.get_ref(artifact_ref(board.get(first))) is None
    assert [unit.name for unit in units if store.get_ref(unit.cache_ref) is not None] == []

    store.set_max_bytes(1 << 30)
    second = create_job(board, store, model_path)
    ran = run_job(farm, tasks, second)
    assert sum(name in COMPILE_TASKS for name in ran) == len(units)
    assert artifact_bytes(farm, second) == local_artifact


def test_the_link_plan_step_compiles_each_entry_and_the_link_takes_it(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's worker compiles each library's entry while the units compile and caches it under its entry ref;
    the link, serial after the last unit, takes it from the store instead of compiling it again."""
    from farm.distributed import steps

    compiled: list[str] = []

    def counted(library: dict[str, Any]) -> bytes:
        compiled.append(library["id"])
        return entry_object(library)

    monkeypatch.setattr(steps, "entry_object", counted)
    job_id = create_job(farm.board, farm.store, model_path)
    ran = run_job(farm, tasks, job_id)
    libraries = assembly.libraries(json.loads(farm.store.get(farm.board.get(job_id).link_plan_key)))
    assert compiled == [library["id"] for library in libraries] and ran.index("farm.link") > 0
    assert all(farm.store.get_ref(entry_ref(library)) for library in libraries)
    assert artifact_bytes(farm, job_id) == local_artifact


# --- refs are pointers: what they point at is checked -------------------------------------------------------------


def test_a_cache_ref_pointing_at_an_object_with_load_time_code_is_rebuilt(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, units: list[CompileUnit]
) -> None:
    """Someone who can write the store pointed a kernel's ref (or a library's entry ref) at an object with a
    constructor: the link checks the bytes, builds the kernel (the entry) again, and the artifact is the local
    build's."""
    from farm.backends.llvm.toolchain import Pipeline, compile_ir

    first = create_job(farm.board, farm.store, model_path)
    run_job(farm, tasks, first)
    forget_artifact(farm, first)
    ir = (
        'module asm ".section .init_array,\\22aw\\22"\nmodule asm ".quad farm_evil"\n'
        "define void @farm_evil() { ret void }\n"
    )
    evil = farm.store.put(compile_ir(ir, host_target(), "evil", Pipeline.NONE))
    victim = next(unit for unit in units if unit.kind == "kernel")
    farm.store.set_ref(victim.cache_ref, evil)
    for library in assembly.libraries(json.loads(farm.store.get(farm.board.get(first).link_plan_key))):
        farm.store.set_ref(entry_ref(library), evil)

    job_id = create_job(farm.board, farm.store, model_path)
    assert run_job(farm, tasks, job_id) == ["farm.plan_job", "farm.link", "farm.finish"]
    assert artifact_bytes(farm, job_id) == local_artifact


def test_a_cached_artifact_is_reused_only_when_it_names_the_submitted_model(
    farm: Farm, tasks: Tasks, model_path: Path, local_artifact: bytes, tmp_path: Path
) -> None:
    """The artifact ref of one model pointed at another model's artifact: the job builds its own."""
    other = tmp_path / "other.onnx"
    onnx.save(examples.small_cnn(), other)
    decoy = create_job(farm.board, farm.store, other)
    run_job(farm, tasks, decoy)
    first = create_job(farm.board, farm.store, model_path)
    farm.store.set_ref(artifact_ref(farm.board.get(first)), farm.board.get(decoy).artifact_key)

    ran = run_job(farm, tasks, first)
    assert ran[0] == "farm.plan_job" and "farm.finish" in ran and not farm.board.get(first).cached
    assert artifact_bytes(farm, first) == local_artifact
