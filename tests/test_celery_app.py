"""The farm's Celery app (farm/distributed/celery_app.py, its tasks in farm/distributed/tasks.py): its settings, its
routes, its tasks, and a real worker refusing pickle."""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kombu import Connection
from kombu.exceptions import ContentDisallowed
from kombu.serialization import dumps, loads, prepare_accept_content

from farm.distributed.celery_app import make_app
from farm.distributed.task_messages import FIXED_QUEUES as QUEUES
from farm.distributed.tasks import FarmTask, TuneTask, app
from tests.farm_services import FarmWorker
from tests.services import RedisServer, redis_server_fixture  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
UNUSED_URL = "redis://127.0.0.1:1/0"  # make_app connects lazily; nothing here talks to it
FARM_ENV = (
    "FARM_BROKER_URL",
    "FARM_STORE_URL",
    "FARM_TASK_SOFT_TIME_LIMIT",
    "FARM_TASK_TIME_LIMIT",
    "FARM_VISIBILITY_TIMEOUT",
    "FARM_MAX_DELIVERIES",
    "FARM_WORKER_REDIS_RETRIES",
)
TASK_NAMES = {"farm.plan_job", "farm.compile_cpu_kernel", "farm.pack_blob", "farm.link", "farm.finish"}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FARM_ENV:
        monkeypatch.delenv(name, raising=False)


def test_a_rediss_url_gives_celery_kombu_and_flower_its_tls_options(clean_env: None, tmp_path: Path) -> None:
    """Celery's redis backend refuses a rediss:// URL without ssl_cert_reqs and kombu would skip verification, so
    make_app states the documented default (`required`) in broker_use_ssl and redis_backend_use_ssl (where Flower
    reads it too), with the URL's CA file."""
    import ssl

    ca = tmp_path / "ca.pem"
    ca.write_text("")
    tls_app = make_app(f"rediss://:pw@127.0.0.1:1/0?ssl_ca_certs={ca}")
    expected = {"ssl_cert_reqs": "required", "ssl_ca_certs": str(ca)}
    assert tls_app.conf.broker_use_ssl == tls_app.conf.redis_backend_use_ssl == expected
    assert tls_app.backend.connparams["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert tls_app.backend.connparams["ssl_ca_certs"] == str(ca)
    bare = make_app("rediss://127.0.0.1:1/0")  # no query at all: still verified, never kombu's CERT_NONE
    assert bare.backend.connparams["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    with bare.connection_for_write() as connection:
        assert connection.ssl == {"ssl_cert_reqs": "required"}
    assert not make_app(UNUSED_URL).conf.broker_use_ssl


def test_messages_are_json_only(clean_env: None) -> None:
    conf = make_app(UNUSED_URL).conf
    assert conf.task_serializer == "json" and conf.result_serializer == "json"
    assert list(conf.accept_content) == ["json"] and list(conf.result_accept_content) == ["json"]


def test_kombu_refuses_a_pickle_payload_under_the_apps_accept_list(clean_env: None) -> None:
    accept = prepare_accept_content(make_app(UNUSED_URL).conf.accept_content)
    content_type, encoding, payload = dumps({"args": ["job"]}, serializer="pickle")
    assert content_type == "application/x-python-serialize"
    with pytest.raises(ContentDisallowed, match="pickle"):
        loads(payload, content_type, encoding, accept=accept)
    content_type, encoding, payload = dumps({"args": ["job"]}, serializer="json")
    assert loads(payload, content_type, encoding, accept=accept) == {"args": ["job"]}


def test_delivery_guarantees(clean_env: None) -> None:
    conf = make_app(UNUSED_URL).conf
    assert conf.task_acks_late is True and conf.task_reject_on_worker_lost is True
    assert conf.worker_prefetch_multiplier == 1
    assert 0 < conf.task_soft_time_limit < conf.task_time_limit
    assert conf.broker_transport_options["visibility_timeout"] > conf.task_time_limit
    assert conf.result_backend_transport_options["visibility_timeout"] > conf.task_time_limit
    assert conf.broker_connection_retry_on_startup is True
    for name in TASK_NAMES | {"farm.tune_kernel"}:  # what each registered task actually runs with
        task = app.tasks[name]
        assert task.acks_late is True and task.reject_on_worker_lost is True, name
        assert task.ignore_result is True, name


def test_events_are_on_for_flower(clean_env: None) -> None:
    conf = make_app(UNUSED_URL).conf
    assert conf.worker_send_task_events is True and conf.task_send_sent_event is True
    assert conf.task_track_started is True


@pytest.mark.parametrize(
    ("task", "queue"),
    [
        ("farm.compile_cpu_kernel", "llvm"),
        ("farm.pack_blob", "llvm"),
        ("farm.link", "llvm"),
        ("farm.plan_job", "control"),
        ("farm.finish", "control"),
        ("some.other_task", "control"),
    ],
)
def test_routes(task: str, queue: str) -> None:
    router = make_app(UNUSED_URL).amqp.router
    assert router.route({}, task, (), {})["queue"].name == queue
    assert QUEUES.get(task, "control") == queue


def test_every_farm_task_is_registered_as_a_farm_task() -> None:
    routed_per_call = {"farm.compile_cl_kernel", "farm.tune_kernel"}  # to opencl.<fingerprint>, tune.<cpu id>
    assert {name for name in app.tasks if name.startswith("farm.")} == TASK_NAMES | routed_per_call
    assert set(QUEUES) == TASK_NAMES
    for name in TASK_NAMES | routed_per_call:
        assert isinstance(app.tasks[name], FarmTask), name  # retried while Redis is away
    assert isinstance(app.tasks["farm.tune_kernel"], TuneTask)  # whose failure leaves the default, not a failed job


def _settings_in_a_fresh_process(env: dict[str, str]) -> dict:
    code = (
        "import json; from farm.distributed.celery_app import make_app; from farm.distributed.tasks import app\n"
        "def show(a):\n"
        "    c = a.conf\n"
        "    return {'broker': c.broker_url, 'soft': c.task_soft_time_limit, 'hard': c.task_time_limit,\n"
        "            'visibility': c.broker_transport_options['visibility_timeout'],\n"
        "            'result_visibility': c.result_backend_transport_options['visibility_timeout']}\n"
        "print(json.dumps({'module': show(app), 'made': show(make_app('redis://127.0.0.1:2/5'))}))\n"
    )
    clean = {name: value for name, value in os.environ.items() if name not in FARM_ENV}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_farm_env_overrides_change_make_apps_settings() -> None:
    settings = _settings_in_a_fresh_process(
        {
            "FARM_BROKER_URL": "redis://10.0.0.9:6380/2",
            "FARM_TASK_SOFT_TIME_LIMIT": "30",
            "FARM_TASK_TIME_LIMIT": "45",
            "FARM_VISIBILITY_TIMEOUT": "90",
        }
    )
    assert settings["module"] == {
        "broker": "redis://10.0.0.9:6380/2",
        "soft": 30,
        "hard": 45,
        "visibility": 90,
        "result_visibility": 90,
    }
    assert settings["made"]["broker"] == "redis://127.0.0.1:2/5"  # an explicit broker wins over FARM_BROKER_URL
    assert settings["made"]["hard"] == 45

    derived = _settings_in_a_fresh_process({"FARM_TASK_TIME_LIMIT": "100"})["module"]
    assert derived == {
        "broker": "redis://127.0.0.1:6379/0",
        "soft": 600,
        "hard": 100,
        "visibility": 160,
        "result_visibility": 160,
    }

    default = _settings_in_a_fresh_process({})["module"]
    assert (default["soft"], default["hard"], default["visibility"]) == (600, 660, 720)


class Touch:
    """A pickle that, when loaded, creates a file: proof of whether anyone deserialized it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def _wait_for(condition, timeout: float, what: str, worker: FarmWorker) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; worker log:\n{worker.log_tail()}")
        time.sleep(0.1)


def test_a_real_worker_refuses_a_pickled_task_message(redis_server: RedisServer, tmp_path: Path) -> None:
    marker = tmp_path / "unpickled"
    pickle.loads(pickle.dumps(Touch(tmp_path / "selftest")))  # the payload does what it says when loaded
    assert (tmp_path / "selftest").exists()

    worker = FarmWorker(redis_server.url, "pickle@test", tmp_path).start()
    try:
        raw = redis_server.client()
        refused_id = str(uuid.uuid4())
        with Connection(redis_server.url) as connection:
            connection.Producer().publish(
                ([Touch(marker)], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}),
                exchange="",
                routing_key="control",
                serializer="pickle",
                headers={
                    "lang": "py",
                    "task": "farm.plan_job",
                    "id": refused_id,
                    "root_id": refused_id,
                    "parent_id": None,
                    "group": None,
                    "argsrepr": "[...]",
                    "kwargsrepr": "{}",
                    "origin": "test",
                },
            )
        _wait_for(
            lambda: "Refusing to deserialize" in worker.log_path.read_text(errors="replace"),
            30,
            "the worker to refuse the pickle",
            worker,
        )
        log = worker.log_path.read_text(errors="replace")
        assert "application/x-python-serialize" in log and "ignored and discarded" in log
        _wait_for(
            lambda: raw.llen("control") == 0 and raw.hlen("unacked") == 0,
            10,
            "the refused message to be dropped (not requeued, not left unacknowledged)",
            worker,
        )

        # The same worker runs a JSON task sent on the same queue: it was the content type it refused.
        accepted_id = (
            make_app(redis_server.url).send_task("farm.plan_job", args=["0123456789abcdef"], queue="control").id
        )
        _wait_for(
            lambda: f"farm.plan_job[{accepted_id}] succeeded" in worker.log_path.read_text(errors="replace"),
            60,
            "the JSON task to run",
            worker,
        )
        log = worker.log_path.read_text(errors="replace")
        assert f"[{refused_id}] received" not in log and f"[{refused_id}] succeeded" not in log
        assert worker.process.poll() is None  # still serving
    finally:
        worker.stop()
    assert not marker.exists(), "the worker unpickled the message"
    assert raw.llen("control") == 0 and raw.hlen("unacked") == 0


def test_dispatch_waits_out_a_redis_restart(redis_server: RedisServer) -> None:
    """A worker dispatching while Redis restarts still enqueues the task (kombu's own retry can't, see dispatch)."""
    import threading

    redis_server.stop()
    restarter = threading.Timer(1.5, redis_server.restart)
    restarter.start()
    code = (
        "from farm.distributed.task_messages import Finish; from farm.distributed.tasks import dispatch; "
        "dispatch(Finish('0123456789abcdef').message())"
    )
    env = {**os.environ, "FARM_BROKER_URL": redis_server.url}
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
    finally:
        restarter.join()
    assert done.returncode == 0, done.stderr
    assert redis_server.client().llen("control") == 1
