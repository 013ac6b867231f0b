"""What farm jobs pin in the store (farm/distributed/pins.py), and that the steps and the client pin and release it:
the steps run in-process (as in test_jobs.py) against a real redis-server that holds the board and the store."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import onnx
import pytest

from farm import defaults
from farm.backends.llvm.target import host_target
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.distributed import pins, recipes, redis_keys, task_messages
from farm.distributed.board import JobBoard
from farm.distributed.client import FarmClient
from farm.distributed.job_record import JobRecord, JobState
from farm.distributed.steps import Farm
from farm.errors import JobError
from farm.store import RedisStore, content_key
from farm.tools import examples
from farm.tuning.database import PIN_OWNER
from tests.services import RedisServer, redis_server_fixture  # noqa: F401
from tests.test_jobs import Tasks, create_job, run_tasks


@pytest.fixture(name="model_path", scope="module")
def model_path_fixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


@pytest.fixture(name="local_artifact", scope="module")
def local_artifact_fixture(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    with LocalExecutor(1) as executor:
        return Path(build_model(model_path, tmp_path_factory.mktemp("local"), executor=executor).artifact).read_bytes()


@pytest.fixture
def store(redis_server: RedisServer) -> RedisStore:
    return RedisStore(redis_server.url)


@pytest.fixture
def farm(redis_server: RedisServer, store: RedisStore) -> tuple[Farm, Tasks]:
    tasks = Tasks()
    return Farm(JobBoard(redis_server.url), store, tasks.dispatch), tasks


def pinned(store: RedisStore, job_id: str) -> set[str]:
    """The keys the job pins now (read from the store's pin set directly)."""
    owner = redis_keys.store_pin_owner(job_id)
    return {key.decode() for key in store.client.smembers(f"{store.prefix}pin:{owner}")}


def job_in_state(board: JobBoard, state: JobState) -> str:
    job_id = uuid.uuid4().hex[:16]
    board.create(job_id, JobRecord(JobState.QUEUED, "0" * 64, "m", "0" * 64, [host_target()]))
    if state != JobState.QUEUED:
        board.advance(job_id, state)
    return job_id


def test_release_ended_jobs_releases_failed_cancelled_and_expired_jobs_only(
    redis_server: RedisServer, store: RedisStore
) -> None:
    board = JobBoard(redis_server.url)
    jobs = {state: job_in_state(board, state) for state in JobState}
    expired = uuid.uuid4().hex[:16]  # pinned, but its record is gone
    for job_id in [*jobs.values(), expired]:
        pins.pin_for_job(store, job_id, [content_key(job_id.encode())])
    store.pin(PIN_OWNER, [content_key(b"a record")], ttl=None)

    released = pins.release_ended_jobs(board, store)
    assert sorted(released) == sorted([jobs[JobState.FAILED], jobs[JobState.CANCELLED], expired])
    kept = {redis_keys.job_of_pin_owner(owner) for owner in store.pin_owners()}
    assert kept == {jobs[state] for state in JobState if state not in (JobState.FAILED, JobState.CANCELLED)} | {None}

    board.raise_flag(jobs[JobState.DONE], redis_keys.downloaded_key)  # its artifact was downloaded
    board.raise_flag(jobs[JobState.COMPILING], redis_keys.downloaded_key)  # a flag on a live job changes nothing
    assert pins.release_ended_jobs(board, store) == [jobs[JobState.DONE]]


def test_job_pins_expire_with_the_job_record(store: RedisStore) -> None:
    job_id = uuid.uuid4().hex[:16]
    pins.pin_for_job(store, job_id, [content_key(b"x")])
    ttl = store.client.ttl(f"{store.prefix}pin:{redis_keys.store_pin_owner(job_id)}")
    assert defaults.JOB_TTL_SECONDS - 5 < ttl <= defaults.JOB_TTL_SECONDS


def test_a_job_pins_what_it_will_read_then_only_its_artifacts_recipe_and_members_until_downloaded(
    farm: tuple[Farm, Tasks], store: RedisStore, redis_server: RedisServer, model_path: Path, tmp_path: Path
) -> None:
    steps, tasks = farm
    job_id = create_job(steps.board, store, model_path)
    steps.plan_job(job_id)
    record = steps.board.get(job_id)
    plan_json = steps._link_plan(record)
    assert {record.model_key, record.link_plan_key} <= pinned(store, job_id)
    weights = {unit["spec"]["sha256"] for unit in plan_json["units"].values() if unit["kind"] == "blob"}
    assert weights and weights <= pinned(store, job_id)

    while tasks and tasks[0][0] != "farm.link":
        name, args = tasks.pop(0)
        steps.run(task_messages.decode(name, args))
    objects = {store.get_ref(unit["ref"]) for unit in plan_json["units"].values() if unit["kind"] != "blob"}
    packed = {store.get_ref(unit["ref"]) for unit in plan_json["units"].values() if unit["kind"] == "blob"}
    assert None not in objects | packed and objects <= pinned(store, job_id)
    assert not packed & pinned(store, job_id) and set(store.missing(packed)) == packed  # keys, never bytes

    run_tasks(steps, tasks)
    record = steps.board.get(job_id)
    recipe = recipes.read_recipe(store.get(record.artifact_key))
    members = set(recipe.keys.values())
    assert packed <= members and record.libraries[host_target().id] in members  # what the recipe names, unread
    entries = set(recipe.entries)  # the packed members' weights instead of them
    assert entries == members - packed | weights
    assert record.state == "done" and pinned(store, job_id) == {record.artifact_key, *entries}
    FarmClient(redis_server.url).download(job_id, tmp_path / "out")
    assert pinned(store, job_id) == {record.artifact_key, *entries}  # a submitter can't unpin: it raised the flag
    assert pins.release_ended_jobs(steps.board, store) == [job_id]
    assert pinned(store, job_id) == set() and store.pin_owners() == []


def test_a_job_finishes_under_a_cap_that_evicts_everything_it_doesnt_pin(
    farm: tuple[Farm, Tasks],
    store: RedisStore,
    redis_server: RedisServer,
    model_path: Path,
    local_artifact: bytes,
    tmp_path: Path,
) -> None:
    """Under a cap that holds the job's weights and nothing more, every entry no pin holds
    is evicted as soon as a put finds the store full: the job still builds the local artifact, since everything it
    reads again is pinned; once downloaded (and the cap lowered to a byte), the artifact goes too, and a second
    download says so. (A smaller cap is refused: by the client and the intake for the weights, by planning for
    those it folds.)"""
    steps, tasks = farm
    client = FarmClient(redis_server.url)
    job_id = client.submit(model_path, [host_target()])
    store.set_max_bytes(100_000)  # tiny_cnn: 93,000 bytes of weights (packed copies are not kept)
    steps.accept(job_id)  # pins the model before it admits it into the store
    run_tasks(steps, tasks)
    assert Path(client.download(job_id, tmp_path / "out")).read_bytes() == local_artifact
    pins.release_ended_jobs(steps.board, store)
    store.set_max_bytes(1)
    store.evict()
    assert store.stats().entries == 0
    with pytest.raises(JobError, match="no longer in the farm's store"):
        client.download(job_id, tmp_path / "again")


def test_a_cancelled_job_releases_its_pins_at_the_next_sweep(
    farm: tuple[Farm, Tasks], store: RedisStore, redis_server: RedisServer, model_path: Path
) -> None:
    steps, _ = farm
    client = FarmClient(redis_server.url)
    job_id = client.submit(model_path, [host_target()])
    steps.accept(job_id)
    assert pinned(store, job_id) == {content_key(model_path.read_bytes())}
    assert client.cancel(job_id)
    assert pins.release_ended_jobs(steps.board, store) == [job_id] and pinned(store, job_id) == set()


def test_a_failed_jobs_pins_are_released_when_the_next_job_is_planned(
    farm: tuple[Farm, Tasks], store: RedisStore, model_path: Path
) -> None:
    steps, tasks = farm
    failed = create_job(steps.board, store, model_path)
    pins.pin_for_job(store, failed, [content_key(b"whatever it had pinned")])
    steps.board.fail(failed, "a worker died on it")
    time.sleep(0.01)
    job_id = create_job(steps.board, store, model_path)
    steps.plan_job(job_id)
    assert pinned(store, failed) == set() and pinned(store, job_id)
