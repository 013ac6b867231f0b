"""The job board (farm/distributed/board.py) on a real redis-server: records, state changes, counters, unreachable Redis."""

from __future__ import annotations

import random
import threading
import time

import pytest

from farm import defaults
from farm.backends.llvm.target import CpuTarget
from farm.distributed import redis_keys
from farm.distributed.board import JobBoard
from farm.distributed.job_record import TERMINAL, JobRecord, JobState
from farm.errors import CredentialsRefusedError, ExitStatus, UnreachableError
from tests.services import RedisServer, free_port, redis_server_fixture, redis_servers_fixture  # noqa: F401

J1, J2 = "0123456789abcdef", "fedcba9876543210"


@pytest.fixture
def board(redis_server: RedisServer) -> JobBoard:
    return JobBoard(redis_server.url)


def new_record(**fields: object) -> JobRecord:
    now = time.time()
    return JobRecord(
        JobState.QUEUED,
        "a" * 64,
        "m",
        "b" * 64,
        [CpuTarget("x86_64-unknown-linux-gnu")],
        created=now,
        updated=now,
        **fields,
    )


def test_create_get_and_update_a_job_record(board: JobBoard) -> None:
    assert board.get(J1) is None
    board.create(J1, new_record(no_cache=False))
    record = board.get(J1)
    assert record is not None
    assert record.state == JobState.QUEUED and record.model_name == "m" and record.no_cache is False
    assert record.targets == [CpuTarget("x86_64-unknown-linux-gnu")] and record.total is None
    assert record.created <= record.updated <= time.time()
    assert 0 < board.redis.ttl(redis_keys.job_key(J1)) <= defaults.JOB_TTL_SECONDS

    time.sleep(0.01)
    board.update(J1, state=JobState.COMPILING, total=5, tune_units=["a", "b"])
    updated = board.get(J1)
    assert updated.state == JobState.COMPILING and updated.total == 5 and updated.tune_units == ["a", "b"]
    assert updated.updated > record.updated
    assert updated.model_name == "m" and not board.is_over(J1)


def test_map_fields_gain_entries_without_losing_others(board: JobBoard) -> None:
    board.create(J1, new_record())
    board.update(J1, libraries={"cpu-a": "1" * 64})
    board.update(J1, libraries={"cpu-b": "2" * 64}, tune_errors={"t/k": "boom"})
    record = board.get(J1)
    assert record.libraries == {"cpu-a": "1" * 64, "cpu-b": "2" * 64} and record.tune_errors == {"t/k": "boom"}


def test_advance_moves_only_a_live_job(board: JobBoard) -> None:
    board.create(J1, new_record())
    assert board.advance(J1, JobState.PLANNING) and board.advance(J1, JobState.COMPILING, total=3)
    assert board.get(J1).state == JobState.COMPILING and board.get(J1).total == 3
    assert board.advance(J1, JobState.CANCELLED, error="cancelled by user") is True
    assert board.is_over(J1)
    assert board.advance(J1, JobState.DONE, artifact_key="c" * 64) is False  # a late done can't undo the cancel
    assert board.fail(J1, "too late") is False
    record = board.get(J1)
    assert record.state == JobState.CANCELLED and record.error == "cancelled by user" and record.artifact_key is None

    assert board.advance(J2, JobState.DONE) is False
    assert board.get(J2) is None  # finishing an unknown job writes nothing
    assert board.is_over(J2)


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_no_terminal_state_can_be_left(board: JobBoard, state: JobState) -> None:
    board.create(J1, new_record())
    assert board.advance(J1, state)
    for other in JobState:  # neither to another end nor back to a live state
        assert board.advance(J1, other, error="x") is False
    assert board.get(J1).state == state and board.get(J1).error == ""


def test_fail_records_the_error_exit_status_and_unit(board: JobBoard) -> None:
    board.create(J1, new_record())
    assert board.fail(J1, "kernel k failed: boom", ExitStatus.BAD_INPUT, "cpu-x/farm_k_1")
    record = board.get(J1)
    assert record.state == JobState.FAILED and record.error == "kernel k failed: boom"
    assert record.exit_status == 2 and record.failed_unit == "cpu-x/farm_k_1"

    board.create(J2, new_record())
    assert board.fail(J2, "link failed")
    assert board.get(J2).exit_status == ExitStatus.BUILD_FAILED and board.get(J2).failed_unit == ""


def test_complete_counts_distinct_names_per_phase(board: JobBoard) -> None:
    assert board.complete("j", "compile", "a") == 1
    assert board.complete("j", "compile", "b") == 2
    assert board.complete("j", "compile", "a") == -1  # a redelivered task counts once
    assert board.complete("j", "link", "a") == 1  # phases count apart
    assert board.complete("other", "compile", "a") == 1  # and jobs too
    assert board.complete("j", "compile", "c") == 3
    assert 0 < board.redis.ttl(redis_keys.phase_key("j", "compile")) <= defaults.JOB_TTL_SECONDS


def test_exactly_one_of_many_concurrent_completions_sees_the_last_unit(board: JobBoard) -> None:
    """8 threads each complete all 50 names (every unit delivered 8 times): each count 1..50 is seen exactly once."""
    names = [f"unit-{i}" for i in range(50)]
    barrier = threading.Barrier(8)
    results: list[int] = []
    lock = threading.Lock()

    def work(seed: int) -> None:
        order = names[:]
        random.Random(seed).shuffle(order)
        barrier.wait()
        seen = [board.complete("j", "compile", name) for name in order]
        with lock:
            results.extend(seen)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 400
    assert results.count(50) == 1
    assert sorted(r for r in results if r != -1) == list(range(1, 51))
    assert results.count(-1) == 350


def test_count_delivery_increments_per_job_and_unit(board: JobBoard) -> None:
    assert [board.count_delivery("j", "u") for _ in range(3)] == [1, 2, 3]
    assert board.count_delivery("j", "v") == 1
    assert board.count_delivery("other", "u") == 1
    assert 0 < board.redis.ttl(redis_keys.deliveries_key("j", "u")) <= defaults.JOB_TTL_SECONDS


@pytest.mark.parametrize("operation", ["create", "get", "update", "advance", "complete", "count_delivery"])
def test_an_unreachable_redis_raises_store_unreachable_quickly(operation: str) -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"  # nothing listens there
    board = JobBoard(url)
    calls = {
        "create": lambda: board.create(J1, new_record()),
        "get": lambda: board.get("j"),
        "update": lambda: board.update(J1, error="x"),
        "advance": lambda: board.advance("j", JobState.DONE),
        "complete": lambda: board.complete("j", "compile", "u"),
        "count_delivery": lambda: board.count_delivery("j", "u"),
    }
    started = time.monotonic()
    with pytest.raises(UnreachableError) as caught:
        calls[operation]()
    assert time.monotonic() - started < 5
    assert caught.value.exit_status == ExitStatus.UNREACHABLE == 4
    assert "unreachable" in str(caught.value) and "secret" not in str(caught.value)


def test_refused_credentials_say_so_without_the_password(redis_servers) -> None:
    server = redis_servers(password="s3cret")
    for url, why in (
        (server.url.replace(":s3cret@", ""), "lacks the password the server requires"),
        (server.url.replace("s3cret", "guess"), "has a wrong password (or user)"),
    ):
        board = JobBoard(url)
        with pytest.raises(CredentialsRefusedError) as caught:
            board.get(J1)
        assert str(caught.value).endswith(f"refused the connection: the URL {why}")
        assert "guess" not in str(caught.value) and caught.value.exit_status == ExitStatus.UNREACHABLE
    assert JobBoard(server.url).get(J1) is None  # the right password gets in


def test_each_state_change_and_finished_unit_is_published_on_the_jobs_channel(board: JobBoard) -> None:
    """Waiting clients block on the job's channel (farm/distributed/client.py JobEvents) instead of polling."""
    pubsub = board.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(redis_keys.job_events_channel(J1))
    assert pubsub.get_message(timeout=5) is None  # the subscription's confirmation, taken
    board.create(J1, new_record())
    assert board.advance(J1, JobState.PLANNING)
    assert board.complete(J1, "compile", "cpu/farm_k_1") == 1
    assert board.complete(J2, "compile", "cpu/farm_k_1") == 1  # another job's channel
    assert board.fail(J1, "boom")
    assert not board.advance(J1, JobState.DONE)  # refused: nothing changed, nothing said
    received = []
    while (message := pubsub.get_message(timeout=1)) is not None:
        received.append((message["channel"], message["data"]))
    channel = redis_keys.job_events_channel(J1)
    assert received == [(channel, "planning"), (channel, "compile"), (channel, "failed")]
    pubsub.close()


def test_a_lost_worker_is_counted_on_a_live_job_only_and_published(board: JobBoard) -> None:
    """The reaper (farm/distributed/leases.py) tells each job which worker it lost and how many of its tasks went
    out again; reapers that share one holder's tasks add up, and an ended or expired job is left alone."""
    pubsub = board.redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(redis_keys.job_events_channel(J1))
    assert pubsub.get_message(timeout=5) is None  # the subscription's confirmation, taken
    board.create(J1, new_record())
    assert board.lost_worker(J1, "w2@h#i1", 2) and board.lost_worker(J1, "w2@h#i1", 1)
    assert board.lost_worker(J1, "w3@h#i2", 1)
    assert board.get(J1).lost_workers == {"w2@h#i1": 3, "w3@h#i2": 1}
    assert [pubsub.get_message(timeout=1)["data"] for _ in range(3)] == ["lost_worker"] * 3
    board.fail(J1, "boom")
    assert not board.lost_worker(J1, "w4@h#i3", 1) and "w4@h#i3" not in board.get(J1).lost_workers
    assert not board.lost_worker(J2, "w2@h#i1", 1) and not board.redis.exists(redis_keys.job_key(J2))
    board.create(J2, new_record())
    assert not board.lost_worker(J2, f"{'w' * 600}#i1", 1) and board.get(J2).lost_workers == {}  # kept readable
    pubsub.close()


def test_a_record_is_created_once(board: JobBoard, redis_server: RedisServer) -> None:
    assert board.create(J1, new_record()) is True
    board.advance(J1, JobState.COMPILING)
    assert board.create(J1, new_record(tune=True)) is False
    assert board.get(J1).state == JobState.COMPILING and not board.get(J1).tune
    assert 0 < redis_server.client().ttl(redis_keys.job_key(J1)) <= defaults.JOB_TTL_SECONDS


def test_a_submitted_request_reads_as_a_queued_job_until_a_record_exists(
    board: JobBoard, redis_server: RedisServer
) -> None:
    job_id = board.submit(new_record(no_cache=True))
    raw = redis_server.client()
    assert raw.lrange(redis_keys.SUBMITTED_KEY, 0, -1) == [job_id.encode()]
    assert raw.zscore(redis_keys.JOBS_KEY, job_id) is not None and raw.ttl(redis_keys.request_key(job_id)) > 0
    assert board.get(job_id) is None
    viewed = board.view(job_id)
    assert viewed == board.request(job_id) and viewed.state == JobState.QUEUED and viewed.no_cache
    board.create(job_id, new_record(tune=True))
    assert board.view(job_id).tune  # the record, once there, is what clients see
    board.nudge(job_id)
    assert raw.lrange(redis_keys.SUBMITTED_KEY, 0, -1) == [job_id.encode()] * 2
    assert board.view(J2) is None and board.request(J2) is None


def test_a_raised_cancel_flag_cancels_a_live_job_and_wins_over_every_later_step(board: JobBoard) -> None:
    board.create(J1, new_record())
    board.advance(J1, JobState.COMPILING)
    board.raise_flag(J1, redis_keys.cancel_key)
    record = board.get(J1)
    assert record.state == JobState.CANCELLED and record.error == "cancelled by user" and record.is_over
    assert board.advance(J1, JobState.LINKING) is False  # the step that tries to move it stops ...
    assert board.call(board.redis.hget, redis_keys.job_key(J1), "state") == "cancelled"  # ... and the record catches up
    assert board.advance(J1, JobState.DONE, artifact_key="c" * 64) is False

    board.create(J2, new_record())
    board.advance(J2, JobState.DONE, artifact_key="c" * 64)
    board.raise_flag(J2, redis_keys.cancel_key)
    assert board.get(J2).state == JobState.DONE  # an ended job stays as it ended


def test_a_request_cancelled_before_acceptance_reads_as_cancelled(board: JobBoard) -> None:
    job_id = board.submit(new_record())
    board.raise_flag(job_id, redis_keys.cancel_key)
    assert board.view(job_id).state == JobState.CANCELLED
    assert board.flag_raised(job_id, redis_keys.cancel_key) and not board.flag_raised(job_id, redis_keys.downloaded_key)
