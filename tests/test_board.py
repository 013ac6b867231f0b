"""The job board (farm/distributed/board.py) on a real redis-server: records, state changes, counters, unreachable Redis."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from farm import defaults
from farm.distributed.board import TERMINAL, JobBoard, JobState
from farm.errors import ExitStatus
from farm.store import StoreUnreachableError
from tests.services import RedisServer, free_port, redis_server_fixture  # noqa: F401


@pytest.fixture
def board(redis_server: RedisServer) -> JobBoard:
    return JobBoard(redis_server.url)


def test_create_get_and_update_a_job_record(board: JobBoard) -> None:
    assert board.get("nope") is None
    board.create("j1", {"model_name": "m", "targets": [{"id": "t"}], "no_cache": False, "total": 0})
    record = board.get("j1")
    assert record is not None
    assert record["state"] == "queued" and record["model_name"] == "m"
    assert json.loads(record["targets"]) == [{"id": "t"}] and record["no_cache"] == "False"
    assert float(record["created"]) <= float(record["updated"]) <= time.time()
    assert 0 < board.redis.ttl(board.key("j1")) <= defaults.JOB_TTL_SECONDS

    time.sleep(0.01)
    board.update("j1", state=JobState.COMPILING.value, total=5, kernels=[1, 2])
    updated = board.get("j1")
    assert updated["state"] == "compiling" and updated["total"] == "5" and json.loads(updated["kernels"]) == [1, 2]
    assert float(updated["updated"]) > float(record["updated"])
    assert updated["model_name"] == "m" and not board.is_over("j1")


def test_advance_moves_only_a_live_job(board: JobBoard) -> None:
    board.create("j", {"model_name": "m"})
    assert board.advance("j", JobState.PLANNING) and board.advance("j", JobState.COMPILING, total=3)
    assert board.get("j")["state"] == "compiling" and board.get("j")["total"] == "3"
    assert board.advance("j", JobState.CANCELLED, error="cancelled by user") is True
    assert board.is_over("j")
    assert board.advance("j", JobState.DONE, artifact_key="k") is False  # a late done can't undo the cancel
    assert board.fail("j", "too late") is False
    record = board.get("j")
    assert record["state"] == "cancelled" and record["error"] == "cancelled by user" and "artifact_key" not in record

    assert board.advance("never-created", JobState.DONE) is False
    assert board.get("never-created") is None  # finishing an unknown job writes nothing
    assert board.is_over("never-created")


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_no_terminal_state_can_be_left(board: JobBoard, state: str) -> None:
    board.create("j", {})
    assert board.advance("j", JobState(state))
    for other in JobState:  # neither to another end nor back to a live state
        assert board.advance("j", other, extra="x") is False
    assert board.get("j")["state"] == state and "extra" not in board.get("j")


def test_fail_records_the_error_exit_status_and_unit(board: JobBoard) -> None:
    board.create("j", {})
    assert board.fail("j", "kernel k failed: boom", ExitStatus.BAD_INPUT, "cpu-x/farm_k_1")
    record = board.get("j")
    assert record["state"] == "failed" and record["error"] == "kernel k failed: boom"
    assert record["exit_status"] == "2" and record["failed_unit"] == "cpu-x/farm_k_1"

    board.create("k", {})
    assert board.fail("k", "link failed")
    assert board.get("k")["exit_status"] == str(int(ExitStatus.BUILD_FAILED)) and board.get("k")["failed_unit"] == ""


def test_complete_counts_distinct_names_per_phase(board: JobBoard) -> None:
    assert board.complete("j", "compile", "a") == 1
    assert board.complete("j", "compile", "b") == 2
    assert board.complete("j", "compile", "a") == -1  # a redelivered task counts once
    assert board.complete("j", "link", "a") == 1  # phases count apart
    assert board.complete("other", "compile", "a") == 1  # and jobs too
    assert board.complete("j", "compile", "c") == 3
    assert 0 < board.redis.ttl(board.key("j", ":compile")) <= defaults.JOB_TTL_SECONDS


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
    assert 0 < board.redis.ttl(board.key("j", ":deliveries:u")) <= defaults.JOB_TTL_SECONDS


@pytest.mark.parametrize("operation", ["create", "get", "update", "advance", "complete", "count_delivery"])
def test_an_unreachable_redis_raises_store_unreachable_quickly(operation: str) -> None:
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"  # nothing listens there
    board = JobBoard(url)
    calls = {"create": lambda: board.create("j", {"a": 1}), "get": lambda: board.get("j"),
             "update": lambda: board.update("j", state="x"), "advance": lambda: board.advance("j", JobState.DONE),
             "complete": lambda: board.complete("j", "compile", "u"),
             "count_delivery": lambda: board.count_delivery("j", "u")}
    started = time.monotonic()
    with pytest.raises(StoreUnreachableError) as caught:
        calls[operation]()
    assert time.monotonic() - started < 5
    assert caught.value.exit_status == ExitStatus.UNREACHABLE == 4
    assert "unreachable" in str(caught.value) and "secret" not in str(caught.value)


