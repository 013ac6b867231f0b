"""The farm's Redis users (farm/distributed/acl.py) on a real redis-server, and attacks made with a submitter's
credentials (what a CI job holds) against a real farm: every write outside a submission is refused by Redis, and
every submission a worker reads is checked, so a forged one is refused while the farm goes on serving."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import time
import uuid
from pathlib import Path

import onnx
import pytest
import redis

from farm.backends.llvm.target import host_target
from farm.backends.opencl.backend import opencl_queue
from farm.distributed import acl, intake, job_record, redis_keys, task_messages
from farm.distributed.board import JobBoard
from farm.distributed.celery_app import make_app
from farm.distributed.client import FarmClient
from farm.distributed.job_record import JobRecord, JobState
from farm.errors import BadInputError
from farm.frontend.split import split_model
from farm.store import RedisStore, refs
from farm.tools import examples
from tests.farm_services import FARM_ACL, Farm, farm_cli, farm_factory_fixture  # noqa: F401
from tests.services import RedisServer, _started_servers
from tests.test_tuning_harness import QUICK

JOB = "0123456789abcdef"
SHA = "ab" * 32


@pytest.fixture
def farm_redis() -> RedisServer:
    with _started_servers() as start:
        yield start(acl=FARM_ACL)


@pytest.fixture
def submitter(farm_redis: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(Farm(farm_redis, Path()).url)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny_cnn.onnx"
    onnx.save(examples.tiny_cnn(), path)
    return path


def test_the_file_names_each_role_with_its_password_hashed_and_turns_the_default_user_off() -> None:
    text = acl.acl_file({"worker": "w-pass", "submitter": "s-pass", "flower": "f-pass"})
    lines = text.splitlines()
    assert lines[0] == "user default off"
    assert [line.split()[1] for line in lines[1:]] == ["farm-worker", "farm-submitter", "farm-flower"]
    assert "s-pass" not in text and f"#{hashlib.sha256(b's-pass').hexdigest()}" in lines[2]
    with pytest.raises(BadInputError, match="FARM_SUBMITTER_PASSWORD is empty"):
        acl.acl_file({"submitter": ""})


def test_passwords_come_from_the_environment_and_a_missing_one_is_named() -> None:
    environ = {"FARM_WORKER_PASSWORD": "a", "FARM_SUBMITTER_PASSWORD": "b", "FARM_FLOWER_REDIS_PASSWORD": "c"}
    assert acl.passwords_from_environment(environ) == {"worker": "a", "submitter": "b", "flower": "c"}
    with pytest.raises(BadInputError, match="set FARM_FLOWER_REDIS_PASSWORD"):
        acl.passwords_from_environment({**environ, "FARM_FLOWER_REDIS_PASSWORD": ""})


def test_farm_acl_writes_the_file_from_the_environment_only(tmp_path: Path) -> None:
    env = {"FARM_WORKER_PASSWORD": "a", "FARM_SUBMITTER_PASSWORD": "b", "FARM_FLOWER_REDIS_PASSWORD": "c"}
    written = farm_cli("acl", "-o", str(tmp_path / "users.acl"), broker="", cwd=tmp_path, env=env)
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "users.acl").read_text() == acl.acl_file({"worker": "a", "submitter": "b", "flower": "c"})
    missing = farm_cli(
        "acl", "-o", str(tmp_path / "other.acl"), broker="", cwd=tmp_path, env={name: "" for name in env}
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "FARM_WORKER_PASSWORD" in missing.stderr


FORBIDDEN_WRITES = {
    "a job record": ("HSET", redis_keys.job_key(JOB), "state", "done"),
    "a job's artifact": ("HSET", redis_keys.job_key(JOB), "artifact_key", SHA),
    "a job's progress": ("SADD", redis_keys.phase_key(JOB, "compile"), "unit"),
    "a cache ref": ("SET", f"{acl.STORE_PREFIX}ref:kernel:x", SHA),
    "a compiled object": ("SET", f"{acl.STORE_PREFIX}obj:{SHA}", "1:1"),
    "an object's chunk": ("SET", f"{acl.STORE_PREFIX}obj:{SHA}:0", "x"),
    "a pin": ("SADD", f"{acl.STORE_PREFIX}pin:job:{JOB}", SHA),
    "the store's cap": ("SET", f"{acl.STORE_PREFIX}max_bytes", "1"),
    "the control queue": ("LPUSH", task_messages.CONTROL_QUEUE, "{}"),
    "the llvm queue": ("LPUSH", task_messages.LLVM_QUEUE, "{}"),
    "a device's queue": ("LPUSH", opencl_queue("ab" * 8), "{}"),
    "a tuning queue": ("LPUSH", task_messages.tune_queue("x86_64"), "{}"),
    "Celery's routing": ("SADD", "_kombu.binding.control", "x"),
    "Celery's unacked tasks": ("HSET", "unacked", "t", "{}"),
    "a running task": ("HSET", redis_keys.RUNNING_KEY, "t", "{}"),
    "a worker's lease": ("SET", redis_keys.lease_key("w1@host"), "x"),
    "a worker's advertisement": ("HSET", redis_keys.WORKERS_KEY, "w1@host", "{}"),
    "a tuning record": ("SET", f"{acl.STORE_PREFIX}ref:tuning:x", SHA),
    "a control broadcast": ("PUBLISH", "/0.celery.pidbox", "{}"),
    "a Flower event": ("PUBLISH", "/0.celeryev/task.failed", "{}"),
    "a script": ("EVAL", "return redis.call('FLUSHALL')", "0"),
    "a key listing": ("SCAN", "0"),
    "KEYS": ("KEYS", "*"),
    "a server setting": ("CONFIG", "SET", "maxmemory", "1"),
    "a flush": ("FLUSHALL",),
    "deleting a record": ("DEL", redis_keys.job_key(JOB)),
    "a repair's claim": ("SET", redis_keys.repair_claim_key(SHA), "1"),
    "a string for the intake list": ("SET", redis_keys.SUBMITTED_KEY, "x"),
    "a string for the admissions": ("SET", redis_keys.ADMIT_KEY, "x"),
    "a sorted set for the repairs": ("ZADD", redis_keys.REPAIR_KEY, "1", "x"),
    "the intake list emptied": ("DEL", redis_keys.SUBMITTED_KEY),
    "the intake list popped": ("RPOP", redis_keys.SUBMITTED_KEY),
    "a string for the jobs index": ("SET", redis_keys.JOBS_KEY, "x"),
    "a list for the jobs index": ("LPUSH", redis_keys.JOBS_KEY, "x"),
    "a string for a request": ("SET", redis_keys.request_key(JOB), "x"),
    "a list for a request": ("RPUSH", redis_keys.request_key(JOB), "x"),
    "a request kept forever": ("PERSIST", redis_keys.request_key(JOB)),
    "a hash for staged bytes": ("HSET", f"{acl.STORE_PREFIX}staged:{SHA}", "a", "b"),
    "staged bytes appended to": ("APPEND", f"{acl.STORE_PREFIX}staged:{SHA}:0", "x"),
    "a list for a cancel flag": ("LPUSH", redis_keys.cancel_key(JOB), "x"),
    "another database": ("SELECT", "1"),
    "a key outside the farm's": ("SET", "elsewhere", "x"),
}
"""What a submitter must never do, each as a Redis command: write the farm's records, the store, Celery's queues
and control channels, workers' liveness, run anything that reaches all keys, leave the farm's database, or put
another type of value where the farm keeps a list, a sorted set or a hash (a WRONGTYPE there fails every call on
the key: `SET farm:submitted x` ended every worker's intake)."""


@pytest.mark.parametrize("command", FORBIDDEN_WRITES.values(), ids=FORBIDDEN_WRITES.keys())
def test_a_submitter_is_refused(submitter: redis.Redis, command: tuple[str, ...]) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        submitter.execute_command(*command)


def test_a_submitter_may_report_a_damaged_entry_but_not_claim_its_check(submitter: redis.Redis) -> None:
    """A download that finds a member damaged pushes its key for the workers (redis_keys.REPAIR_KEY); the claim that
    rate-limits the check is the workers' (refused above)."""
    assert submitter.lpush(redis_keys.REPAIR_KEY, SHA) == 1


def test_a_submitter_cant_send_a_celery_task(farm_redis: RedisServer) -> None:
    from kombu.exceptions import OperationalError

    app = make_app(Farm(farm_redis, Path()).url)
    with pytest.raises(OperationalError, match="no permissions"):
        app.send_task("farm.finish", args=[JOB], queue=task_messages.CONTROL_QUEUE, retry=False)
    assert farm_redis.client().llen(task_messages.CONTROL_QUEUE) == 0


def test_a_submitter_submits_follows_cancels_and_reads_but_writes_nothing_else(
    farm_redis: RedisServer, model_path: Path
) -> None:
    client = FarmClient(Farm(farm_redis, Path()).url)
    job_id = client.submit(model_path, [host_target()])
    assert client.status(job_id)["state"] == "queued" and client.jobs()[0]["job_id"] == job_id
    assert client.cancel(job_id) is True and client.status(job_id)["state"] == "cancelled"
    raw = farm_redis.client()
    assert raw.lrange(redis_keys.SUBMITTED_KEY, 0, -1) == [job_id.encode()]
    assert not raw.exists(redis_keys.job_key(job_id))  # the record is a worker's to write
    assert set(raw.keys("farm:store:*")) == {
        f"farm:store:staged:{client.record(job_id).model_key}".encode(),
        f"farm:store:staged:{client.record(job_id).model_key}:0".encode(),
    }


def test_farm_store_or_worker_with_a_submitters_credentials_is_refused_in_one_line(
    farm_redis: RedisServer, tmp_path: Path
) -> None:
    for args in (["store", "stats"], ["store", "gc"], ["worker", "--hostname", "sneaky@host"]):
        result = farm_cli(*args, broker=Farm(farm_redis, Path()).url, cwd=tmp_path)
        assert result.returncode == 4, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and "refused this to the URL's user" in result.stderr


def _forged_request(board: JobBoard, model_sha256: str, **changes: str) -> str:
    """A request written by hand as an attacker would, with fields changed after its id was made; its id pushed."""
    record = JobRecord(JobState.QUEUED, model_sha256, "tiny_cnn", model_sha256, [host_target()], created=time.time())
    job_id, request = job_record.encode_request(record)
    board.redis.hset(redis_keys.request_key(job_id), mapping={**request, **changes})
    board.redis.lpush(redis_keys.SUBMITTED_KEY, job_id)
    return job_id


def test_forged_submissions_are_refused_and_the_farm_goes_on(farm_factory, model_path: Path, tmp_path: Path) -> None:
    """Submitter-written keys are all a worker reads from a submitter: junk ids, a request rewritten after its id
    was made (another user's pending job, say), one that sets fields only the farm sets, and a model whose staged
    bytes aren't the ones named. Each is refused; a real submission then builds."""
    farm: Farm = farm_factory(workers=1)
    board = JobBoard(farm.url)
    store = RedisStore(farm.url)
    data = model_path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    store.stage(data)
    for junk in ("../../etc/passwd", "x" * 100_000, JOB, "DEADBEEFDEADBEEF"):
        board.redis.lpush(redis_keys.SUBMITTED_KEY, junk)
    rewritten = _forged_request(
        board,
        sha,
        targets=json.dumps([{"kind": "cpu", "triple": "aarch64-linux-gnu", "cpu": "generic", "features": ""}]),
    )
    with_artifact = _forged_request(board, sha, artifact_key=SHA)
    other_bytes = hashlib.sha256(b"not the model").hexdigest()
    store.stage(b"not the model")
    farm.redis.client().set(f"farm:store:staged:{other_bytes}:0", data)  # the staged bytes swapped (as the operator)
    swapped = _forged_request(board, other_bytes)

    submitted = farm_cli(
        "submit", str(model_path), "--json", "-o", str(tmp_path / "out"), broker=farm.url, cwd=tmp_path, timeout=300
    )
    assert submitted.returncode == 0, submitted.stderr + farm.logs()

    client = FarmClient(farm.url)
    for job_id in (rewritten, with_artifact):
        assert board.get(job_id) is None and board.view(job_id) is None  # refused and dropped: an unknown job
    failed = client.status(swapped)
    assert failed["state"] == "failed" and failed["exit_status"] == 2 and "upload" in failed["error"]
    assert farm.workers[0].process.poll() is None
    log = farm.workers[0].log_path.read_text()
    assert f"job {rewritten} refused" in log and "malformed, the rest with no request" in log


def test_a_farm_key_of_the_wrong_type_is_one_line_for_clients_and_deleted_by_the_workers(
    farm_factory, model_path: Path, tmp_path: Path
) -> None:
    """Issue 30's first attack: `SET farm:submitted x` ended the intake thread of every worker and `SET farm:jobs x`
    made every `farm submit` and `farm jobs` end in a traceback. The submitter's ACL refuses both now (above); made
    by the operator's hand (or an older farm), each is a one-line error for clients (exit 4) until the workers'
    housekeeping deletes it, and the farm goes on building."""
    farm: Farm = farm_factory(workers=1)
    operator = farm.redis.client()
    operator.set(redis_keys.JOBS_KEY, "x")
    operator.set(redis_keys.SUBMITTED_KEY, "x")
    listed = farm_cli("jobs", broker=farm.url, cwd=tmp_path)
    if operator.type(redis_keys.JOBS_KEY) == b"string":  # the housekeeping may already have run
        assert listed.returncode == 4 and listed.stderr.count("\n") == 1, listed.stderr
        assert "WRONGTYPE" in listed.stderr and "the workers delete such keys" in listed.stderr
    deadline = time.monotonic() + intake.SWEEP_SECONDS + 10
    while operator.exists(redis_keys.JOBS_KEY, redis_keys.SUBMITTED_KEY) and time.monotonic() < deadline:
        time.sleep(0.1)
    submitted = farm_cli(
        "submit", str(model_path), "--json", "-o", str(tmp_path / "out"), broker=farm.url, cwd=tmp_path, timeout=300
    )
    assert submitted.returncode == 0 and json.loads(submitted.stdout)["state"] == "done", submitted.stderr
    log = farm.workers[0].log_path.read_text()
    assert f"deleted {redis_keys.SUBMITTED_KEY} (a string)" in log
    assert f"deleted {redis_keys.JOBS_KEY}, a string where the farm keeps a zset" in log


def test_only_the_operator_may_retune_and_a_submitters_tune_only_adds_records(
    farm_factory, model_path: Path, tmp_path: Path
) -> None:
    """Issue 30's fourth attack: a submitter's `farm submit --retune` changed which variants another submitter's
    next build of the same model used. Tuning records are every job's: a submitter's --retune is refused before
    anything is sent (exit 4, one line), a request forged to ask for one fails, and the records, hence the other
    submitter's artifact, stay as they were; the operator's --retune (the workers' credentials) still runs."""
    farm: Farm = farm_factory(workers=1, env={"FARM_TUNE_SECONDS_PER_VARIANT": QUICK})
    store = RedisStore(farm.worker_url)

    def submit(*flags: str, broker: str = farm.url) -> subprocess.CompletedProcess:
        return farm_cli(
            "submit",
            str(model_path),
            "--json",
            "-o",
            str(tmp_path / uuid.uuid4().hex),
            *flags,
            broker=broker,
            cwd=tmp_path,
            timeout=300,
        )

    tuned = submit("--tune")
    assert tuned.returncode == 0, tuned.stderr + farm.logs()
    records = {ref: store.get_ref(ref) for ref in _tuning_refs(farm)}
    assert records and all(records.values())

    refused = submit("--retune")
    assert refused.returncode == 4 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--retune" in refused.stderr and "operator" in refused.stderr
    board = JobBoard(farm.url)
    split = split_model(model_path)
    job_id, request = job_record.encode_request(
        JobRecord(
            JobState.QUEUED,
            split.graph_key,
            "tiny_cnn",
            split.model_sha256,
            [host_target()],
            retune=True,
            created=time.time(),
        )
    )
    board.submit_request(job_id, request, time.time())  # what the client would send, less the grant
    deadline = time.monotonic() + 60
    while (record := board.get(job_id)) is None or not record.is_over:
        assert time.monotonic() < deadline, farm.logs()
        time.sleep(0.2)
    assert record.state == JobState.FAILED and "not granted" in record.error
    again = submit("--tune")
    assert again.returncode == 0 and not (json.loads(again.stdout)["tuning"] or {}).get("timed"), again.stderr
    assert {ref: store.get_ref(ref) for ref in records} == records
    assert (
        Path(json.loads(again.stdout)["artifact"]).read_bytes()
        == Path(json.loads(tuned.stdout)["artifact"]).read_bytes()
    )

    retuned = submit("--retune", broker=farm.worker_url)
    assert retuned.returncode == 0 and json.loads(retuned.stdout)["tuning"]["timed"] == len(records), (
        retuned.stderr + farm.logs()
    )


def _tuning_refs(farm: Farm) -> list[str]:
    """The refs of the tuning database's records (as the operator lists them)."""
    return [
        name.decode().removeprefix(acl.STORE_PREFIX + "ref:")
        for name in farm.redis.client().keys(f"{acl.STORE_PREFIX}ref:{refs.tuning_record('*', '*')}")
    ]


def test_what_a_submitter_writes_without_a_time_to_live_gets_one_from_the_workers(farm_factory) -> None:
    """Issue 30's third attack: keys a submitter set without a time to live lived forever, though the docs say
    uploads expire after a day. A worker's housekeeping gives them one (the first sweep runs SWEEP_SECONDS after
    the worker starts, then at most every EXPIRY_SWEEP_SECONDS across the farm), and a second database is refused."""
    from farm import defaults

    farm: Farm = farm_factory(workers=1)
    attacker = JobBoard(farm.url).redis
    staged = f"{acl.STORE_PREFIX}staged:{SHA}"
    attacker.set(staged, "1:1")
    attacker.hset(redis_keys.request_key(JOB), "model_key", SHA)
    attacker.set(redis_keys.cancel_key(JOB), "1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        attacker.execute_command("SELECT", "1")
    operator = farm.redis.client()
    deadline = time.monotonic() + intake.SWEEP_SECONDS + 20
    while -1 in (
        ttls := [operator.ttl(key) for key in (staged, redis_keys.request_key(JOB), redis_keys.cancel_key(JOB))]
    ):
        assert time.monotonic() < deadline, farm.logs()
        time.sleep(0.2)
    assert 0 < ttls[0] <= defaults.STAGED_TTL_SECONDS and all(0 < ttl <= defaults.JOB_TTL_SECONDS for ttl in ttls)


def test_a_submitters_floods_and_oversized_claims_are_bounded_and_the_farm_goes_on(
    farm_factory, model_path: Path, tmp_path: Path
) -> None:
    """Issue 30's third category with a submitter's credentials against a real worker: 50,000 junk ids, a request
    naming 70 targets (an artifact holds at most 64), and staged chunks far bigger than their header names. The
    ids are skipped a thousand per pop, the request is refused, the staged bytes are dropped unread, and a real
    submission builds."""
    farm: Farm = farm_factory(workers=1)
    board = JobBoard(farm.url)
    pipe = board.redis.pipeline(transaction=False)
    for index in range(50_000):
        pipe.lpush(redis_keys.SUBMITTED_KEY, f"{index:016x}")
    pipe.execute()
    cpus = [dataclasses.replace(host_target(), cpu=f"znver{index}") for index in range(70)]
    many, request = job_record.encode_request(
        JobRecord(JobState.QUEUED, SHA, "tiny_cnn", SHA, cpus, created=time.time())
    )
    board.submit_request(many, request, time.time())
    oversized = hashlib.sha256(b"oversized").hexdigest()
    staged = f"{acl.STORE_PREFIX}staged:{oversized}"
    board.redis.set(staged, "1:3")
    for index in range(3):
        board.redis.set(f"{staged}:{index}", b"\0" * (8 << 20))
    swollen = board.submit(JobRecord(JobState.QUEUED, oversized, "tiny_cnn", SHA, [host_target()], created=time.time()))

    submitted = farm_cli(
        "submit", str(model_path), "--json", "-o", str(tmp_path / "out"), broker=farm.url, cwd=tmp_path, timeout=300
    )
    assert submitted.returncode == 0 and json.loads(submitted.stdout)["state"] == "done", submitted.stderr
    assert board.view(many) is None  # refused and dropped
    failed = FarmClient(farm.url).status(swollen)
    assert failed["state"] == "failed" and "upload" in failed["error"]
    assert not farm.redis.client().exists(staged, f"{staged}:0")
    log = farm.workers[0].log_path.read_text()
    assert f"job {many} refused" in log and "more than 64 targets" in log


# --- teams: per-team submitter users (FARM_TEAMS), their visibility and quotas -----------------------------------


def test_farm_acl_writes_a_user_per_team_and_names_a_missing_password(tmp_path: Path) -> None:
    env = {
        "FARM_WORKER_PASSWORD": "a",
        "FARM_SUBMITTER_PASSWORD": "b",
        "FARM_FLOWER_REDIS_PASSWORD": "c",
        "FARM_TEAMS": "vision, nlp-2",
        "FARM_SUBMITTER_PASSWORD_VISION": "d",
        "FARM_SUBMITTER_PASSWORD_NLP_2": "e",
    }
    assert acl.passwords_from_environment(env) == {
        "worker": "a",
        "submitter": "b",
        "flower": "c",
        "team:vision": "d",
        "team:nlp-2": "e",
    }
    written = farm_cli("acl", "-o", str(tmp_path / "users.acl"), broker="", cwd=tmp_path, env=env)
    assert written.returncode == 0, written.stderr
    users = [line.split()[1] for line in (tmp_path / "users.acl").read_text().splitlines()]
    assert users == [
        "default",
        "farm-worker",
        "farm-submitter",
        "farm-flower",
        "farm-submitter-vision",
        "farm-submitter-nlp-2",
    ]
    with pytest.raises(BadInputError, match="set FARM_SUBMITTER_PASSWORD_NLP_2"):
        acl.passwords_from_environment({**env, "FARM_SUBMITTER_PASSWORD_NLP_2": ""})
    with pytest.raises(BadInputError, match="not a team name"):
        acl.passwords_from_environment({**env, "FARM_TEAMS": "Vision"})
    assert acl.team_of_url("redis://farm-submitter-vision:x@host:6379/0") == "vision"
    assert acl.team_of_url("redis://farm-submitter:x@host:6379/0") == ""


def test_teams_read_follow_and_cancel_only_their_own_jobs(farm_factory, model_path: Path, tmp_path: Path) -> None:
    """Per-team users close what the shared submitter user leaves open: a team lists, reads, follows and cancels
    its own jobs only (its ids carry its name, which Redis's ACL lets only its user write), and the default
    submitters see none of the teams' jobs; each builds as usual."""
    farm: Farm = farm_factory(workers=1)
    built = farm_cli(
        "submit",
        str(model_path),
        "--json",
        "-o",
        str(tmp_path / "vision"),
        broker=farm.team_url("vision"),
        cwd=tmp_path,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr + farm.logs()
    vision_job = json.loads(built.stdout)["job_id"]
    assert vision_job.startswith("vision.") and redis_keys.team_of(vision_job) == "vision"
    nlp = FarmClient(farm.team_url("nlp-2"))
    assert [job["job_id"] for job in FarmClient(farm.team_url("vision")).jobs()] == [vision_job]
    assert nlp.jobs() == [] and FarmClient(farm.url).jobs() == []
    for command in (["status", vision_job], ["cancel", vision_job], ["download", vision_job, "-o", "x"]):
        refused = farm_cli(*command, broker=farm.team_url("nlp-2"), cwd=tmp_path)
        assert refused.returncode == 4 and refused.stderr.count("\n") == 1, (command, refused.stderr)
        assert "refused this to the URL's user" in refused.stderr
    with pytest.raises(redis.exceptions.NoPermissionError):  # nor forge a request in the name of another team
        nlp.board.redis.hset(redis_keys.request_key(f"vision.{'ab' * 8}"), "model_key", SHA)
    assert farm_cli("status", vision_job, broker=farm.team_url("vision"), cwd=tmp_path).returncode == 0


def test_a_team_past_its_quota_of_live_jobs_is_refused_in_one_line_and_other_teams_go_on(
    farm_redis: RedisServer, model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A team's jobs queued or running count against FARM_MAX_LIVE_JOBS (set to 2 here: the quota is what this
    test is about); the next one fails at once naming the quota, the other teams' jobs are accepted, and once one
    of the team's jobs ends (cancelled here) the team may submit again. The workers' side runs in this process
    (steps.Farm.accept, a worker's intake's call) on the real Redis, with the workers' credentials."""
    from farm.distributed.steps import Farm as Steps

    monkeypatch.setenv("FARM_MAX_LIVE_JOBS", "2")
    cluster = Farm(farm_redis, tmp_path)
    steps = Steps(JobBoard(cluster.worker_url), RedisStore(cluster.worker_url), lambda message: None)
    vision, nlp = FarmClient(cluster.team_url("vision")), FarmClient(cluster.team_url("nlp-2"))
    first, second, third = (vision.submit(model_path, [host_target()]) for _ in range(3))
    other = nlp.submit(model_path, [host_target()])
    assert [steps.accept(job_id) for job_id in (first, second, other)] == [
        f"job {job_id} accepted" for job_id in (first, second, other)
    ]
    assert "their quota (FARM_MAX_LIVE_JOBS=2" in steps.accept(third)
    refused = farm_cli("wait", third, broker=cluster.team_url("vision"), cwd=tmp_path)
    assert refused.returncode == 2 and "team 'vision' already have 2 jobs queued or running" in refused.stderr
    assert vision.cancel(first)
    fourth = vision.submit(model_path, [host_target()])
    assert steps.accept(fourth) == f"job {fourth} accepted"


def test_a_teams_uploads_past_its_staging_quota_are_dropped_oldest_first_and_only_its_jobs_are_told(
    farm_redis: RedisServer, model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each team stages under its own name, which its Redis user alone writes, so the workers can weigh it: past
    FARM_MAX_STAGED_BYTES (512 KiB here: the quota is what this test is about) a team's oldest uploads go, its job
    that needed one fails naming the quota, and the other team's upload of the same model is untouched. The
    workers' side runs in this process (steps.Farm's housekeeping and accept) with the workers' credentials."""
    from farm.distributed.steps import Farm as Steps

    cluster = Farm(farm_redis, tmp_path)
    steps = Steps(JobBoard(cluster.worker_url), RedisStore(cluster.worker_url), lambda message: None)
    vision, nlp = FarmClient(cluster.team_url("vision")), FarmClient(cluster.team_url("nlp-2"))
    victim, other = vision.submit(model_path, [host_target()]), nlp.submit(model_path, [host_target()])
    operator = farm_redis.client()
    for name in operator.keys(f"{acl.STORE_PREFIX}staged:vision.*"):
        operator.expire(name, 3600)  # staged an hour before the flood
    flood = f"{acl.STORE_PREFIX}staged:vision.{SHA}"
    vision.board.redis.set(flood, b"\0" * (1 << 20))  # the team's own flood, without a time to live
    with pytest.raises(redis.exceptions.NoPermissionError):  # in its own staging area only
        vision.board.redis.set(f"{acl.STORE_PREFIX}staged:nlp-2.{SHA}", b"x")
    monkeypatch.setenv("FARM_MAX_STAGED_BYTES", str(512 << 10))
    steps._trim_staging()
    assert "FARM_MAX_STAGED_BYTES" in steps.accept(victim) and steps.accept(other) == f"job {other} accepted"
    assert not operator.exists(flood)
    told = farm_cli("wait", victim, broker=cluster.team_url("vision"), cwd=tmp_path)
    assert told.returncode == 2 and "team 'vision' had more than 524288 bytes of uploads staged" in told.stderr
