"""Flower against a real farm: a real `celery flower` process on the test broker, real workers, a real job.

Flower is started as README.md says (`celery -A tasks.app flower --conf=deploy/flowerconfig.py`, its login from
FLOWER_BASIC_AUTH and the broker from FARM_BROKER_URL, as the farm-flower user), before the job is submitted, since
Flower only sees the events sent after it connects. Its HTTP API is read with urllib (requests is not a dependency of farm) and polled, because
events reach Flower a moment after the job ends.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from farm.tools.examples import EXAMPLES
from tests.farm_services import Farm, farm_cli, farm_factory_fixture, packed_weight_symbol  # noqa: F401
from tests.services import free_port, redis_server_fixture  # noqa: F401

USER, PASSWORD = "farm", "secret"
START_TIMEOUT_S = 30.0
EVENTS_TIMEOUT_S = 30.0
JOB_TASKS = ("farm.plan_job", "farm.compile_cpu_kernel", "farm.pack_blob", "farm.link", "farm.finish")


class Flower:
    """One `celery -A tasks.app flower` process in its own process group, its log in a file."""

    def __init__(self, broker: str, folder: Path) -> None:
        self.port = free_port()
        self.log_path = folder / "flower.log"
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks.app",
            "flower",
            f"--port={self.port}",
            "--address=127.0.0.1",
            "--conf=deploy/flowerconfig.py",
        ]
        env = {**os.environ, "FARM_BROKER_URL": broker, "FLOWER_BASIC_AUTH": f"{USER}:{PASSWORD}"}
        repo = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH")]))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command,
                cwd=repo,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else "(no log)"

    def get(self, path: str, auth: bool = True, timeout: float = 10.0) -> tuple[int, Any]:
        """(HTTP status, decoded JSON body or None) of GET `path`, with basic auth unless told otherwise."""
        status, body = self.get_text(path, f"{USER}:{PASSWORD}" if auth else None, timeout)
        return status, json.loads(body) if body and status == 200 else None

    def get_text(self, path: str, login: str | None, timeout: float = 10.0) -> tuple[int, str]:
        """(HTTP status, body) of GET `path` with this basic-auth login (None: none)."""
        request = urllib.request.Request(self.base + path)
        if login is not None:
            request.add_header("Authorization", f"Basic {base64.b64encode(login.encode()).decode()}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")

    def wait_until_up(self) -> None:
        """Return once the HTTP API answers an authenticated request; fail with Flower's log otherwise."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"flower exited with {self.process.returncode} at start:\n{self.log()}")
            try:
                if self.get("/api/workers", timeout=2)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        pytest.fail(f"flower did not answer on port {self.port} within {START_TIMEOUT_S} s:\n{self.log()}")

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@pytest.fixture(name="flower_for")
def flower_for_fixture(tmp_path: Path) -> Iterator:
    """`flower_for(farm)`: a running Flower on the farm's broker, stopped (its log printed) after the test."""
    started: list[Flower] = []

    def start(farm: Farm) -> Flower:
        flower = Flower(farm.flower_url, tmp_path)
        started.append(flower)
        flower.wait_until_up()
        return flower

    yield start
    for flower in started:
        flower.stop()
        print(f"--- flower log\n{flower.log()}")  # shown by pytest only when the test failed


def poll(fetch, done, timeout: float = EVENTS_TIMEOUT_S):
    """Call fetch() until done(result) holds or `timeout` passes; returns the last result."""
    deadline = time.monotonic() + timeout
    while True:
        result = fetch()
        if done(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def job_tasks(flower: Flower, job_id: str) -> list[dict[str, Any]]:
    """Flower's tasks whose arguments name the job."""
    status, tasks = flower.get("/api/tasks?limit=1000")
    assert status == 200, f"GET /api/tasks answered {status}"
    return [task for task in (tasks or {}).values() if job_id in str(task.get("args"))]


def all_succeeded(tasks: list[dict[str, Any]], expected: int) -> bool:
    names = {task.get("name") for task in tasks}
    return len(tasks) >= expected and set(JOB_TASKS) <= names and all(task.get("state") == "SUCCESS" for task in tasks)


def test_flower_shows_workers_and_a_jobs_tasks(farm_factory, flower_for, tmp_path: Path) -> None:
    farm = farm_factory(workers=2)
    flower = flower_for(farm)
    model = tmp_path / "tiny_cnn.onnx"
    onnx.save(EXAMPLES["tiny_cnn"](), str(model))

    submitted = farm_cli(
        "submit", str(model), "--json", "-o", str(tmp_path / "out"), broker=farm.url, cwd=tmp_path, timeout=180
    )
    assert submitted.returncode == 0, f"{submitted.stdout}\n{submitted.stderr}\n{farm.logs()}"
    job = json.loads(submitted.stdout)
    assert job["state"] == "done"
    job_id = job["job_id"]
    # plan + one task per kernel and blob + one link (one target) + finish
    expected = 1 + job["compiled"] + 1 + 1

    names = [worker.name for worker in farm.workers]
    status, workers = poll(
        lambda: flower.get("/api/workers?refresh=true"),
        lambda answer: answer[0] == 200 and set(names) <= set(answer[1] or {}),
    )
    assert status == 200, f"GET /api/workers answered {status}"
    assert set(names) <= set(workers), f"flower lists workers {sorted(workers)}, expected {names}"
    for name in names:
        queues = {queue["name"] for queue in workers[name].get("active_queues") or []}
        assert {"control", "llvm"} <= queues, f"{name} consumes {queues}"

    tasks = poll(lambda: job_tasks(flower, job_id), lambda found: all_succeeded(found, expected))
    summary = "\n".join(f"{t.get('name')} {t.get('state')} {t.get('args')}" for t in tasks)
    assert all_succeeded(tasks, expected), (
        f"job {job_id}: flower shows {len(tasks)} tasks, expected {expected}:\n{summary}"
    )
    by_name: dict[str, list[dict[str, Any]]] = {}
    for task in tasks:
        by_name.setdefault(task["name"], []).append(task)
    assert len(by_name["farm.plan_job"]) == 1 and len(by_name["farm.link"]) == 1 and len(by_name["farm.finish"]) == 1
    assert len(by_name["farm.compile_cpu_kernel"]) == job["kernels"], summary
    assert len(by_name["farm.pack_blob"]) == job["blobs"], summary
    assert {task.get("worker") for task in tasks} <= set(names)
    for task in tasks:  # every task's arguments start with the job id
        assert str(task["args"]).lstrip("[(").startswith((f"'{job_id}'", f'"{job_id}"')), task["args"]

    assert flower.get("/api/workers", auth=False)[0] == 401
    assert flower.get("/api/tasks", auth=False)[0] == 401
    status, found = flower.get(f"/api/tasks?search={job_id}&limit=1000")  # README: one job's tasks
    assert status == 200 and set(found or {}) == {task["uuid"] for task in tasks}, sorted(found or {})


def test_metrics_answer_only_with_flowers_login(farm_factory, flower_for) -> None:
    """/metrics names every worker and counts tasks: Flower alone serves it to anyone, deploy/flowerconfig.py puts it
    behind the same basic auth as the API (401 without the login or with a wrong one). /healthcheck, which names
    nothing, stays open."""
    farm = farm_factory(workers=1)
    flower = flower_for(farm)
    name = farm.workers[0].name
    status, text = poll(
        lambda: flower.get_text("/metrics", f"{USER}:{PASSWORD}"),
        lambda answer: answer[0] == 200 and f'worker="{name}"' in answer[1],
    )
    assert status == 200 and f'flower_worker_online{{worker="{name}"}} 1.0' in text, text[-2000:]
    for login in (None, f"{USER}:wrong", f"other:{PASSWORD}"):
        refused, body = flower.get_text("/metrics", login)
        assert refused == 401 and name not in body and "flower_" not in body, (login, refused, body[:200])
    assert flower.get_text("/healthcheck", None) == (200, "OK")


def _unsupported_model(path: Path) -> Path:
    node = helper.make_node("RandomNormalLike", ["x"], ["y"], name="the_node")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _failed_tasks(flower: Flower, job_id: str) -> list[dict[str, Any]]:
    status, tasks = flower.get("/api/tasks?state=FAILURE&limit=1000")
    assert status == 200
    return [task for task in (tasks or {}).values() if job_id in str(task.get("args"))]


def test_the_task_that_fails_a_job_is_a_failure_in_flower_with_its_error(
    farm_factory, flower_for, tmp_path: Path
) -> None:
    """A failed job's failing task ends in Celery state FAILURE carrying the job's error; the skipped tasks of a
    cancelled or failed job succeed with a note saying why they did nothing."""
    model = tmp_path / "tiny_cnn.onnx"
    onnx.save(EXAMPLES["tiny_cnn"](), str(model))
    from farm.distributed.celery_app import make_app
    from farm.distributed.task_messages import Finish

    doomed = packed_weight_symbol(model)
    farm = farm_factory(workers=1, env={"FARM_FAULT_KILL_UNIT": doomed})
    flower = flower_for(farm)

    bad = farm_cli(
        "submit", str(_unsupported_model(tmp_path / "bad.onnx")), "--no-wait", "--json", broker=farm.url, cwd=tmp_path
    )
    crashing = farm_cli("submit", str(model), "--no-wait", "--json", broker=farm.url, cwd=tmp_path)
    bad_id, crashing_id = json.loads(bad.stdout)["job_id"], json.loads(crashing.stdout)["job_id"]
    for job_id in (bad_id, crashing_id):
        assert farm_cli("wait", job_id, broker=farm.url, cwd=tmp_path, timeout=120).returncode in (1, 2)

    failed = poll(lambda: _failed_tasks(flower, bad_id), bool)
    assert [task["name"] for task in failed] == ["farm.plan_job"], farm.logs()
    assert "the_node" in failed[0]["exception"] and "RandomNormalLike" in failed[0]["exception"]

    failed = poll(lambda: _failed_tasks(flower, crashing_id), bool)
    assert len(failed) == 1 and failed[0]["name"] == "farm.pack_blob", failed
    assert "never finished" in failed[0]["exception"] and doomed in failed[0]["exception"]
    late = Finish(crashing_id).message()  # a task of the job that arrives after it ended, as a redelivery would
    make_app(farm.worker_url).send_task(late.task, args=late.args, queue=late.queue)
    skipped = poll(lambda: [t for t in job_tasks(flower, crashing_id) if "skipped" in str(t.get("result"))], bool)
    assert [t["name"] for t in skipped] == ["farm.finish"] and skipped[0]["state"] == "SUCCESS"
    assert f"job {crashing_id} is failed" in skipped[0]["result"]
