"""The farm client (farm/distributed/client.py) against a real redis-server with no workers: what submit, status,
cancel and download leave in Redis and raise. Jobs stay queued, since nothing consumes the `control` queue."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from farm import defaults
from farm.artifact import artifact_bytes
from farm.backends.llvm.target import host_target
from farm.backends.opencl.target import OpenClTarget
from farm.distributed import recipes, redis_keys, task_messages
from farm.distributed.client import ANY_WORKER, FarmClient, LivenessWatch, job_queues, raise_for_state
from farm.distributed.job_record import JobRecord, JobState
from farm.distributed.steps import Farm, JobFailed
from farm.distributed.task_messages import Message, PlanJob
from farm.errors import BadInputError, BuildError, ExitStatus, JobError, UnreachableError
from farm.frontend.split import split_model
from farm.ir.graph import DeferredArray
from farm.store import RedisStore, content_key
from farm.tools import examples
from tests.services import RedisServer, redis_server_fixture  # noqa: F401


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


@pytest.fixture
def client(redis_server: RedisServer) -> FarmClient:
    return FarmClient(redis_server.url)


@pytest.fixture
def dispatched() -> list[Message]:
    """The tasks that `accept` dispatched (nothing consumes them here)."""
    return []


@pytest.fixture
def accept(client: FarmClient, dispatched: list[Message]) -> Callable[[str], str]:
    """What a worker's intake does with a submitted id (farm.distributed.steps.Farm.accept), its dispatches kept."""
    return Farm(client.board, client.store, dispatched.append).accept


def test_submit_stages_the_model_and_writes_a_request_that_a_worker_accepts(
    client: FarmClient, redis_server: RedisServer, model_path: Path, accept, dispatched: list[Message]
) -> None:
    job_id = client.submit(model_path, [host_target()])

    data = model_path.read_bytes()
    record = client.record(job_id)
    assert record.state == "queued" and record.model_name == "tiny_cnn"
    assert record.model_sha256 == hashlib.sha256(data).hexdigest() and record.no_cache is False
    assert record.model_key == hashlib.sha256(split_model(model_path).graph).hexdigest()  # the graph, by digest
    assert record.targets == [host_target()]
    raw = redis_server.client()
    assert raw.lrange(redis_keys.SUBMITTED_KEY, 0, -1) == [job_id.encode()] and raw.llen("control") == 0
    assert not raw.exists(redis_keys.job_key(job_id)) and not client.store.has(record.model_key)  # staged only
    status = client.status(job_id)
    assert status["state"] == "queued" and status["done"] == 0 and status["model"] == "tiny_cnn"
    assert "error" not in status and "artifact_key" not in status

    assert accept(job_id) == f"job {job_id} accepted"
    assert client.board.get(job_id) == client.record(job_id) and client.record(job_id).updated >= record.created
    assert RedisStore(redis_server.url).get(record.model_key) == split_model(model_path).graph  # admitted into the
    # store, the broker's Redis
    assert not raw.exists(f"farm:store:staged:{record.model_key}")
    assert dispatched == [PlanJob(job_id).message()]
    assert accept(job_id) == f"job {job_id} was accepted already" and len(dispatched) == 1

    second = client.submit(model_path, [host_target()], no_cache=True)
    assert second != job_id and not raw.exists(f"farm:store:staged:{record.model_key}")  # the store has the model
    assert accept(second) == f"job {second} accepted" and client.record(second).no_cache


def test_a_job_whose_upload_is_gone_fails_at_acceptance_naming_it(
    client: FarmClient, redis_server: RedisServer, model_path: Path, accept
) -> None:
    job_id = client.submit(model_path, [host_target()])
    redis_server.client().delete(f"farm:store:staged:{client.record(job_id).model_key}")
    assert accept(job_id).startswith(f"job {job_id} failed: the model's upload")
    status = client.status(job_id)
    assert status["state"] == "failed" and status["exit_status"] == 2 and "submit the model again" in status["error"]


def test_status_of_an_unknown_job_is_a_job_error(client: FarmClient) -> None:
    with pytest.raises(JobError, match="unknown job 'feedbeef'") as caught:
        client.status("feedbeef")
    assert caught.value.exit_status == ExitStatus.CANCELLED_OR_UNKNOWN == 3
    with pytest.raises(JobError):
        client.cancel("feedbeef")
    with pytest.raises(JobError):
        client.download("feedbeef", "/nonexistent")


def test_cancel_a_queued_job(client: FarmClient, model_path: Path, tmp_path: Path) -> None:
    job_id = client.submit(model_path, [host_target()])
    assert client.cancel(job_id) is True
    status = client.status(job_id)
    assert status["state"] == "cancelled" and status["error"] == "cancelled by user"
    assert client.cancel(job_id) is False  # already ended
    assert client.wait(job_id, timeout=5)["state"] == "cancelled"  # an ended job needs no waiting

    with pytest.raises(JobError, match="cancelled") as caught:
        client.download(job_id, tmp_path / "out")
    assert caught.value.exit_status == 3
    assert not (tmp_path / "out").exists()


def test_wait_returns_the_last_status_at_its_timeout(client: FarmClient, model_path: Path) -> None:
    job_id = client.submit(model_path, [host_target()])
    seen: list[str] = []
    status = client.wait(job_id, timeout=0.3, on_progress=lambda s: seen.append(s["state"]))
    assert status["state"] == "queued" and seen and set(seen) == {"queued"}


def test_download_of_a_queued_job_says_there_is_no_artifact_yet(
    client: FarmClient, model_path: Path, tmp_path: Path
) -> None:
    job_id = client.submit(model_path, [host_target()])
    with pytest.raises(JobError, match="no artifact yet"):
        client.download(job_id, tmp_path)


def test_download_of_a_done_job_writes_the_artifact(
    client: FarmClient, model_path: Path, tmp_path: Path, accept
) -> None:
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    weights = client.store.put(b"weights " * 1000)
    members = {"weights/w.bin": recipes.stored(client.store, weights, 8000), "targets/x/model.so": b"code"}
    key, keys = recipes.put_recipe(client.store, {"model": {"name": "tiny_cnn"}}, members, lambda keys: None)
    assert keys == sorted([weights, content_key(b"code")])
    assert client.board.advance(job_id, JobState.DONE, artifact_key=key)
    path = client.download(job_id, tmp_path / "out")
    assert path == str(tmp_path / "out" / "tiny_cnn.farm")
    assert Path(path).read_bytes() == artifact_bytes(
        {"model": {"name": "tiny_cnn"}}, {"weights/w.bin": b"weights " * 1000, "targets/x/model.so": b"code"}
    )  # what a local build writes
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["tiny_cnn.farm"]  # no temporary file left
    assert client.board.flag_raised(job_id, redis_keys.downloaded_key)  # the next pin sweep releases its artifact


def test_download_of_an_artifact_whose_member_was_evicted_says_so_and_writes_nothing(
    client: FarmClient, model_path: Path, tmp_path: Path, accept
) -> None:
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    key, _ = recipes.put_recipe(client.store, {}, {"a.bin": b"kept", "b.bin": b"evicted"}, lambda keys: None)
    client.store.delete(content_key(b"evicted"))
    assert client.board.advance(job_id, JobState.DONE, artifact_key=key)
    with pytest.raises(JobError, match="no longer in the farm's store"):
        client.download(job_id, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # no partial artifact, no temporary file


def test_a_damaged_member_fails_the_download_and_is_dropped_by_a_worker_so_the_artifact_is_not_reused(
    client: FarmClient, model_path: Path, tmp_path: Path, accept, dispatched: list[Message]
) -> None:
    """A reuse checks members' lengths, not bytes (recipes.intact): a damaged member of the right length is found by
    the download's sha256 check, which hands it to the workers' intakes (redis_keys.REPAIR_KEY) to be dropped."""
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    key, members = recipes.put_recipe(client.store, {}, {"a.bin": b"kept", "b.bin": b"damaged"}, lambda keys: None)
    damaged = content_key(b"damaged")
    client.store.client.setrange(client.store.chunk_key(damaged, 0), 0, b"D")
    assert client.board.advance(job_id, JobState.DONE, artifact_key=key)
    assert recipes.intact(client.store, members)  # the same lengths: a reuse would ship it

    with pytest.raises(JobError, match=f"store entry {damaged} is damaged .* submit the model again"):
        client.download(job_id, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
    assert client.board.redis.lrange(redis_keys.REPAIR_KEY, 0, -1) == [damaged]

    farm = Farm(client.board, client.store, dispatched.append)
    assert farm.repair(damaged) == f"store entry {damaged} was damaged: dropped"
    assert not recipes.intact(client.store, members)  # the next submission builds it again
    assert farm.repair(damaged).endswith("was checked less than 600 s ago")  # pushes can't keep workers reading
    assert farm.repair(content_key(b"kept")) == f"store entry {content_key(b'kept')} is intact"


def test_a_failed_job_reports_its_error_and_exit_status(
    client: FarmClient, model_path: Path, tmp_path: Path, accept
) -> None:
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    client.board.fail(job_id, "can't read ONNX model tiny_cnn.onnx", ExitStatus.BAD_INPUT, "")
    status = client.status(job_id)
    assert status["state"] == "failed" and status["exit_status"] == 2
    assert status["error"] == "can't read ONNX model tiny_cnn.onnx"
    with pytest.raises(BadInputError, match="tiny_cnn.onnx"):
        client.download(job_id, tmp_path)


@pytest.mark.parametrize(("exit_status", "error"), [(2, BadInputError), (1, BuildError), (None, BuildError)])
def test_raise_for_state_maps_a_failure_to_its_error(exit_status: int | None, error: type) -> None:
    status = {"job_id": "j1", "state": "failed", "error": "kernel k failed: boom"}
    if exit_status is not None:
        status["exit_status"] = exit_status
    with pytest.raises(error, match="job j1 failed: kernel k failed: boom") as caught:
        raise_for_state(status)
    assert type(caught.value) is error
    assert caught.value.exit_status == (exit_status or 1)


def test_raise_for_state_leaves_live_and_done_jobs_alone_and_refuses_cancelled_ones() -> None:
    for state in ("queued", "planning", "compiling", "linking", "done"):
        raise_for_state({"job_id": "j", "state": state})
    with pytest.raises(JobError, match="job j was cancelled"):
        raise_for_state({"job_id": "j", "state": "cancelled"})


def test_submit_of_a_missing_file_is_bad_input(client: FarmClient, redis_server: RedisServer, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="missing.onnx") as caught:
        client.submit(tmp_path / "missing.onnx", [host_target()])
    assert caught.value.exit_status == 2
    with pytest.raises(BadInputError):
        client.submit(tmp_path, [host_target()])  # a folder is no model either
    raw = redis_server.client()
    assert raw.keys("farm:*") == []


def _record(targets: list, **fields: object) -> JobRecord:
    return JobRecord(JobState.QUEUED, "a" * 64, "m", "b" * 64, targets, **fields)


def test_a_jobs_queues_come_from_its_targets() -> None:
    cpu, device = host_target(), OpenClTarget("0123456789abcdef")
    assert job_queues(_record([cpu])) == {"control": ANY_WORKER, "llvm": ANY_WORKER}
    opencl_only = job_queues(_record([device]))
    assert list(opencl_only) == ["control", "opencl.0123456789abcdef"]
    assert "0123456789abcdef" in opencl_only["opencl.0123456789abcdef"]
    tuning = job_queues(_record([cpu, device], tune=True))
    assert set(tuning) == {"control", "llvm", "opencl.0123456789abcdef", f"tune.{cpu.id}"}
    assert "default variants" in tuning[f"tune.{cpu.id}"]
    assert f"tune.{cpu.id}" not in job_queues(_record([cpu], tune=True, tuned=True))  # its tuning has run


def test_jobs_lists_the_newest_first_and_skips_records_that_are_gone(
    client: FarmClient, redis_server: RedisServer, model_path: Path
) -> None:
    assert client.jobs() == []
    ids = [client.submit(model_path, [host_target()]) for _ in range(3)]
    client.cancel(ids[0])
    listed = client.jobs()
    assert [job["job_id"] for job in listed] == ids[::-1]
    assert [job["state"] for job in listed] == ["queued", "queued", "cancelled"]
    assert all(job["model"] == "tiny_cnn" and 0 <= job["age_s"] < 60 for job in listed)
    assert [job["job_id"] for job in client.jobs(limit=2)] == [ids[2], ids[1]]

    raw = redis_server.client()
    assert 0 < raw.ttl(redis_keys.JOBS_KEY) <= defaults.JOB_TTL_SECONDS
    raw.delete(redis_keys.request_key(ids[1]))  # a request gone before its index entry
    assert [job["job_id"] for job in client.jobs(limit=2)] == [ids[2], ids[0]]

    old = "0" * 16
    client.board.create(old, _record([host_target()], created=time.time() - defaults.JOB_TTL_SECONDS - 60))
    raw.zadd(redis_keys.JOBS_KEY, {old: time.time() - defaults.JOB_TTL_SECONDS - 60})
    assert old not in {job["job_id"] for job in client.jobs()}  # older than a record lives: not listed
    client.submit(model_path, [host_target()])
    assert raw.zscore(redis_keys.JOBS_KEY, old) is None  # and dropped from the index at the next submit

    raw.zadd(redis_keys.JOBS_KEY, {"../../etc": time.time()})
    unreadable = client.jobs(limit=1)[0]
    assert unreadable["state"] == "unreadable" and "not a job id" in unreadable["error"]


def test_wait_wakes_at_the_boards_notifications_not_at_its_poll(
    client: FarmClient, model_path: Path, accept, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FARM_WAIT_FALLBACK_SECONDS", "60")
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    board, key = client.board, client.store.put(b"artifact")

    def build() -> None:
        board.advance(job_id, JobState.PLANNING)
        time.sleep(0.3)
        board.advance(job_id, JobState.COMPILING, total=2)
        board.complete(job_id, "compile", "a")
        board.complete(job_id, "compile", "b")
        board.advance(job_id, JobState.LINKING)
        board.advance(job_id, JobState.DONE, artifact_key=key, finished=time.time())

    seen: list[tuple[str, int]] = []
    threading.Timer(0.5, build).start()
    started = time.monotonic()
    status = client.wait(job_id, on_progress=lambda s: seen.append((s["state"], s["done"])))
    assert status["state"] == "done" and time.monotonic() - started < 30  # the fallback poll would take 60 s
    assert seen[0] == ("queued", 0) and ("planning", 0) in seen and seen[-1] == ("done", 2)
    assert len(seen) <= 7  # one read per notification (or burst of them), no polling between


def test_wait_says_each_lost_worker_once_before_the_status_that_shows_it(
    client: FarmClient, model_path: Path, accept, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker lost while it ran the job's tasks is said once, when the reaper's note wakes the client (not at the
    fallback poll), with how many tasks went out again; the same name restarted and lost again is another loss."""
    monkeypatch.setenv("FARM_WAIT_FALLBACK_SECONDS", "60")
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    board = client.board

    def build() -> None:
        board.advance(job_id, JobState.COMPILING, total=2)
        board.lost_worker(job_id, "w2@host#i1", 3)
        time.sleep(0.3)
        board.complete(job_id, "compile", "a")
        time.sleep(0.3)
        board.lost_worker(job_id, "w2@host#i2", 1)
        time.sleep(0.3)
        board.fail(job_id, "boom")

    said: list[tuple] = []
    threading.Timer(0.3, build).start()
    started = time.monotonic()
    status = client.wait(
        job_id,
        on_progress=lambda s: said.append(("status", s["done"])),
        on_lost=lambda worker, tasks: said.append((worker, tasks)),
    )
    assert status["state"] == "failed" and time.monotonic() - started < 30
    losses = [index for index, entry in enumerate(said) if entry[0] != "status"]
    assert [said[index] for index in losses] == [("w2@host", 3), ("w2@host", 1)]
    assert all(said[index + 1][0] == "status" for index in losses)  # each said before the status read with it


def test_a_change_nobody_announced_is_seen_at_the_fallback_poll(
    client: FarmClient, model_path: Path, accept, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FARM_WAIT_FALLBACK_SECONDS", "0.5")
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    threading.Timer(0.3, lambda: redis_server.client().hset(redis_keys.job_key(job_id), "state", "cancelled")).start()
    assert client.wait(job_id, timeout=30)["state"] == "cancelled"


def test_an_idle_wait_reads_its_job_once_per_fallback_period(
    client: FarmClient, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FARM_WAIT_FALLBACK_SECONDS", "1")
    job_id = client.submit(model_path, [host_target()])
    reads: list[dict] = []
    client.wait(job_id, timeout=2.5, on_progress=reads.append)
    assert 3 <= len(reads) <= 5  # at 0, 1, 2 and 2.5 s (polling every POLL_SECONDS would be 50)


def test_wait_says_once_which_queues_have_no_live_worker(
    client: FarmClient, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(defaults, "LIVENESS_FIRST_CHECK_SECONDS", 0.1)
    monkeypatch.setattr(defaults, "LIVENESS_CHECK_SECONDS", 0.1)
    job_id = client.submit(model_path, [host_target()])
    assert client.unserved_queues(job_id) == {"control": ANY_WORKER, "llvm": ANY_WORKER}  # no worker runs here
    said: list[dict[str, str]] = []
    client.wait(job_id, timeout=3, on_unserved=said.append)
    assert said == [{"control": ANY_WORKER, "llvm": ANY_WORKER}]  # checked again and again, said once
    client.cancel(job_id)
    assert client.unserved_queues(job_id) == {}  # an ended job needs no worker


def test_liveness_checks_back_off_while_the_job_shows_no_change() -> None:
    answers = iter([{"control": "x"}, {"control": "x"}, {}, {"control": "x"}] + [{"control": "x"}] * 10)
    checks: list[float] = []
    said: list[dict[str, str]] = []
    now = 0.0

    def unserved() -> dict[str, str]:
        checks.append(now)
        return next(answers)

    watch = LivenessWatch(unserved, said.append)
    for now in (0, 1.9, 2, 6.9, 7, 16.9, 17):
        watch.saw({"state": "queued"}, now)
    assert checks == [2, 7, 17]  # LIVENESS_FIRST_CHECK_SECONDS after the start, then after pauses of 5 and 10 s
    assert said == [{"control": "x"}]  # the same queue again is not said again
    for now in (18, 22.9, 23):
        watch.saw({"state": "planning"}, now)  # a change: the pause is 5 s again
    assert checks == [2, 7, 17, 23]
    assert said == [{"control": "x"}, {"control": "x"}]  # served at 17, unserved again at 23: said again
    for now in range(24, 200):
        watch.saw({"state": "planning"}, now)
    assert checks[4:] == [28, 38, 58, 98, 158]  # doubling up to LIVENESS_CHECK_MAX_SECONDS
    assert defaults.LIVENESS_FIRST_CHECK_SECONDS == 2 and defaults.LIVENESS_CHECK_MAX_SECONDS == 60


def test_a_job_that_ends_at_once_is_never_held_up_by_a_liveness_check() -> None:
    checks: list[int] = []
    watch = LivenessWatch(lambda: checks.append(1) or {}, lambda queues: None)
    watch.saw({"state": "queued"}, 100.0)
    watch.saw({"state": "planning"}, 101.0)
    assert checks == [] and watch.next_check == 106.0


def test_a_redis_lost_mid_wait_names_the_job_to_resume(redis_server: RedisServer, model_path: Path) -> None:
    client = FarmClient(redis_server.url)
    job_id = client.submit(model_path, [host_target()])
    threading.Timer(1, redis_server.kill).start()
    started = time.monotonic()
    with pytest.raises(UnreachableError, match=f"'farm wait {job_id}' resumes") as caught:
        client.wait(job_id)
    assert caught.value.exit_status == 4 and time.monotonic() - started < 30


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute", ".."])
def test_a_forged_model_name_never_names_a_path_outside_the_download_folder(
    client: FarmClient, model_path: Path, tmp_path: Path, name: str, accept
) -> None:
    """A record forged in Redis (with a worker's password, or a bug) has its model name read as a file name only."""
    job_id = client.submit(model_path, [host_target()])
    accept(job_id)
    key = client.store.put(b"an artifact")
    assert client.board.advance(job_id, JobState.DONE, artifact_key=key)
    # as a forger with a worker's password would:
    client.board.redis.hset(redis_keys.job_key(job_id), "model_name", name)
    with pytest.raises(BadInputError, match="model name .* can't name a file"):
        client.download(job_id, tmp_path / "dl")
    assert not any(tmp_path.rglob("*.farm")) and not Path("/tmp/absolute.farm").exists()


def _linear(tmp: Path, name: str, producer: str, external: bool = False) -> Path:
    """y = x @ W with a 4 MB W; `producer` changes the graph's bytes and nothing else."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((1024, 1024)).astype(np.float32), "W")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "W"], ["y"])],
        "linear",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1024])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1024])],
        [weight],
    )
    model = onnx.helper.make_model(graph, producer_name=producer, opset_imports=[onnx.helper.make_opsetid("", 17)])
    path = tmp / f"{name}.onnx"
    if external:
        onnx.save(model, path, save_as_external_data=True, location=f"{name}.onnx.data", size_threshold=0)
    else:
        onnx.save(model, path)
    return path


def test_a_resubmit_with_a_changed_graph_and_the_same_weights_uploads_under_a_megabyte(
    client: FarmClient, redis_server: RedisServer, tmp_path: Path, accept
) -> None:
    """Weights go by digest: the store is asked which it lacks (one round trip) and only those are staged."""
    raw = redis_server.client()
    reports: list = []
    first = client.submit(_linear(tmp_path, "v1", "exporter 1"), [host_target()], on_upload=reports.append)
    assert reports[0].missing_blobs == reports[0].blobs == 1 and reports[-1].done
    assert reports[-1].sent_bytes == 4 << 20
    assert accept(first) == f"job {first} accepted"
    units: list[Message] = []
    farm = Farm(client.board, client.store, units.append)
    farm.plan_job(first)  # leaves W, which it never reads, to the unit that packs it, which admits it
    assert raw.keys("farm:store:staged:*")
    for message in units:
        farm.run(task_messages.decode(message.task, message.args))
    assert not raw.keys("farm:store:staged:*")
    received = raw.info("stats")["total_net_input_bytes"]
    reports.clear()
    second = client.submit(_linear(tmp_path, "v2", "exporter 2"), [host_target()], on_upload=reports.append)
    assert raw.info("stats")["total_net_input_bytes"] - received < 1 << 20
    assert reports[0].missing_blobs == 0 and reports[-1].sent_bytes == 0
    assert client.record(second).model_key != client.record(first).model_key


def test_a_model_with_external_data_is_submitted_with_it(client: FarmClient, tmp_path: Path, accept) -> None:
    """The graph alone used to reach the farm, whose import then blamed the user for a file it never got."""
    path = _linear(tmp_path, "dynamo", "torch", external=True)
    job_id = client.submit(path, [host_target()])
    assert accept(job_id) == f"job {job_id} accepted"
    plans = Farm(client.board, client.store, lambda message: None)._plans(job_id, client.board.get(job_id))
    weight = next(iter(plans[0].blobs.values()))  # deferred: the plan never asked for its values
    assert isinstance(weight, DeferredArray) and weight.load().tobytes() == (tmp_path / "dynamo.onnx.data").read_bytes()


def test_a_weight_whose_upload_is_gone_fails_the_plan_naming_its_initializer(
    client: FarmClient, redis_server: RedisServer, tmp_path: Path, accept
) -> None:
    """The plan reads the weights ahead on threads (Farm._plans); what one of them lacks is still said by name."""
    job_id = client.submit(_linear(tmp_path, "lost", "x", external=True), [host_target()])
    assert accept(job_id) == f"job {job_id} accepted"
    raw = redis_server.client()
    raw.delete(*raw.keys("farm:store:staged:*"))
    with pytest.raises(BadInputError, match="initializer 'W': its bytes .* are not on the farm.*submit the model"):
        Farm(client.board, client.store, lambda message: None)._plans(job_id, client.board.get(job_id))


def test_external_data_outside_the_models_folder_is_refused_before_any_upload(
    client: FarmClient, redis_server: RedisServer, tmp_path: Path
) -> None:
    path = _linear(tmp_path, "escape", "x", external=True)
    model = onnx.load(path, load_external_data=False)
    model.graph.initializer[0].external_data[0].value = "../elsewhere.data"
    onnx.save(model, path)
    with pytest.raises(BadInputError, match="'W'.*outside the model's folder"):
        client.submit(path, [host_target()])
    assert not redis_server.client().keys("farm:*")


def test_a_model_whose_weights_are_over_the_farms_cap_is_refused_before_any_upload(
    client: FarmClient, redis_server: RedisServer, tmp_path: Path, accept
) -> None:
    """The job would pin its weights over the cap for its whole life: refused up front naming the sizes, by the
    client and again by the intake (a client is not trusted to have checked)."""
    path = _linear(tmp_path, "big", "x")
    client.store.set_max_bytes(1 << 20)
    with pytest.raises(
        BadInputError,
        match=r"big.onnx: its weights are 4.0 MiB \(\d+ bytes\), over the farm's "
        r"store cap of 1.0 MiB \(1048576 bytes",
    ):
        client.submit(path, [host_target()])
    assert not redis_server.client().keys("farm:store:staged:*")
    client.store.set_max_bytes(8 << 20)
    job_id = client.submit(path, [host_target()])
    client.store.set_max_bytes(1 << 20)
    assert "over the farm's store cap" in accept(job_id)
    assert client.status(job_id)["state"] == "failed" and client.status(job_id)["exit_status"] == 2


def _both_ways(tmp: Path) -> Path:
    """y = x @ W + x @ W^T with a 4 MB W: the plan folds the transpose into a second 4 MB weight."""
    weight = numpy_helper.from_array(np.random.default_rng(4).standard_normal((1024, 1024)).astype(np.float32), "W")
    nodes = [
        onnx.helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
        onnx.helper.make_node("MatMul", ["x", "W"], ["a"]),
        onnx.helper.make_node("MatMul", ["x", "Wt"], ["b"]),
        onnx.helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "both",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1024])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1024])],
        [weight],
    )
    path = tmp / "folded.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), path)
    return path


def test_a_job_whose_folded_weights_would_take_it_over_the_cap_fails_at_planning_before_any_compile(
    client: FarmClient, tmp_path: Path, dispatched: list[Message]
) -> None:
    """The client and the intake know the weights; planning knows the weights it folds too (packed copies take no
    room: the store keeps none): over the cap, the job fails naming both sizes and nothing is dispatched."""
    farm = Farm(client.board, client.store, dispatched.append)
    client.store.set_max_bytes(6 << 20)
    job_id = client.submit(_both_ways(tmp_path), [host_target()])
    farm.accept(job_id)
    dispatched.clear()
    with pytest.raises(JobFailed, match=r"folded.onnx: its weights and what the plan made of them need 8.0 MiB"):
        farm.plan_job(job_id)
    status = client.status(job_id)
    assert status["state"] == "failed" and status["exit_status"] == 2 and dispatched == []
