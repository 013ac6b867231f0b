"""The farm client (farm/distributed/client.py) against a real redis-server with no workers: what submit, status,
cancel and download leave in Redis and raise. Jobs stay queued, since nothing consumes the `control` queue."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import onnx
import pytest

from farm.backends.llvm.target import host_target
from farm.distributed.client import FarmClient, raise_for_state
from farm.distributed.protocol import JobState
from farm.errors import BadInputError, BuildError, ExitStatus, JobError
from farm.store import RedisStore
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


def test_submit_stores_the_model_records_a_queued_job_and_queues_its_planning(
        client: FarmClient, redis_server: RedisServer, model_path: Path) -> None:
    job_id = client.submit(model_path, [host_target()])

    data = model_path.read_bytes()
    record = client.record(job_id)
    assert record.state == "queued" and record.model_name == "tiny_cnn"
    assert record.model_sha256 == hashlib.sha256(data).hexdigest() and record.no_cache is False
    assert record.targets == [host_target()]
    assert RedisStore(redis_server.url).get(record.model_key) == data  # the store is the broker's Redis

    raw = redis_server.client()
    assert raw.llen("control") == 1
    message = json.loads(raw.lindex("control", 0))
    assert message["content-type"] == "application/json"
    assert message["headers"]["task"] == "farm.plan_job"
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [job_id] and kwargs == {}

    status = client.status(job_id)
    assert status["state"] == "queued" and status["done"] == 0 and status["model"] == "tiny_cnn"
    assert "error" not in status and "artifact_key" not in status

    assert client.submit(model_path, [host_target()], no_cache=True) != job_id  # every submit is a new job
    assert raw.llen("control") == 2


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


def test_download_of_a_queued_job_says_there_is_no_artifact_yet(client: FarmClient, model_path: Path,
                                                                 tmp_path: Path) -> None:
    job_id = client.submit(model_path, [host_target()])
    with pytest.raises(JobError, match="no artifact yet"):
        client.download(job_id, tmp_path)


def test_download_of_a_done_job_writes_the_artifact(client: FarmClient, model_path: Path, tmp_path: Path) -> None:
    job_id = client.submit(model_path, [host_target()])
    key = client.store.put(b"artifact bytes")
    assert client.board.advance(job_id, JobState.DONE, artifact_key=key)
    path = client.download(job_id, tmp_path / "out")
    assert path == str(tmp_path / "out" / "tiny_cnn.farm")
    assert Path(path).read_bytes() == b"artifact bytes"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["tiny_cnn.farm"]  # no temporary file left


def test_a_failed_job_reports_its_error_and_exit_status(client: FarmClient, model_path: Path, tmp_path: Path) -> None:
    job_id = client.submit(model_path, [host_target()])
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
    assert raw.llen("control") == 0 and raw.keys("farm:job:*") == []
