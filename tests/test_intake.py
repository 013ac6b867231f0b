"""A worker's intake (farm/distributed/intake.py) on a real redis-server: it pops submitted ids and accepts each
well-formed one, and nothing a submitter pushes, nor any error of an acceptance, stops it."""

from __future__ import annotations

import time

from farm.distributed import redis_keys
from farm.distributed.board import JobBoard
from farm.distributed.intake import POP_SECONDS, SUBMITTED_BATCH, Intake
from tests.services import RedisServer, redis_server_fixture  # noqa: F401

JOB = "0123456789abcdef"


def _requested(board: JobBoard, *job_ids: str) -> None:
    """Give each id a request (its contents don't matter to the intake, which hands the id to `accept`)."""
    for job_id in job_ids:
        board.redis.hset(redis_keys.request_key(job_id), "model_key", "x")


def test_each_id_is_accepted_once_and_junk_is_skipped(redis_server: RedisServer) -> None:
    board = JobBoard(redis_server.url)
    accepted: list[str] = []
    intake = Intake(board, lambda job_id: accepted.append(job_id) or f"job {job_id} accepted")
    _requested(board, JOB)
    for pushed in (JOB, "../../etc/passwd", "x" * 10_000, JOB.upper(), "fedcba9876543210", JOB):
        board.redis.lpush(redis_keys.SUBMITTED_KEY, pushed)

    assert intake.take_one() == (
        f"job {JOB} accepted; skipped 4 submitted id(s): 3 malformed, the rest with no "
        "request (never submitted, expired or refused) or accepted already"
    )
    assert accepted == [JOB]
    assert intake.take_one() is None  # nothing left: it waited POP_SECONDS and came back


def test_a_flood_of_junk_ids_costs_one_round_trip_per_batch(redis_server: RedisServer) -> None:
    """Issue 30: 50,000 junk ids pushed in 0.2 s made a 2 s build take 40 s (each id its own pop, reads and log
    line). A pop takes a batch, and ids with no request are skipped together: the flood is 50 pops."""
    board = JobBoard(redis_server.url)
    accepted: list[str] = []
    intake = Intake(board, lambda job_id: accepted.append(job_id) or f"job {job_id} accepted")
    pipe = board.redis.pipeline(transaction=False)
    for index in range(50_000):
        pipe.lpush(redis_keys.SUBMITTED_KEY, f"{index:016x}")
    pipe.execute()
    _requested(board, JOB)
    board.redis.lpush(redis_keys.SUBMITTED_KEY, JOB)
    pops = 0
    while board.redis.llen(redis_keys.SUBMITTED_KEY):
        intake.take_one()
        pops += 1
    assert pops == 50_001 // SUBMITTED_BATCH + 1 and accepted == [JOB]


def test_damaged_entries_go_to_repair_and_junk_is_refused(redis_server: RedisServer) -> None:
    board = JobBoard(redis_server.url)
    repaired: list[str] = []
    intake = Intake(board, lambda job_id: "", repair=lambda key: repaired.append(key) or f"{key} checked")
    key = "ab" * 32
    for pushed in (key, "../" + key, key.upper() + "0"):
        board.redis.lpush(redis_keys.REPAIR_KEY, pushed)
    notes = [intake.take_one() for _ in range(3)]
    assert repaired == [key] and notes[0] == f"{key} checked"
    assert all(note.startswith("refused a repair") for note in notes[1:])


def test_an_acceptance_that_raises_is_logged_and_the_intake_goes_on(redis_server: RedisServer) -> None:
    board = JobBoard(redis_server.url)

    def accept(job_id: str) -> str:
        if job_id == JOB:
            raise RuntimeError("boom")
        return f"job {job_id} accepted"

    intake = Intake(board, accept)
    _requested(board, JOB, "fedcba9876543210")
    intake.start()
    try:
        board.redis.lpush(redis_keys.SUBMITTED_KEY, JOB, "fedcba9876543210")
        deadline = time.monotonic() + 10
        while board.redis.llen(redis_keys.SUBMITTED_KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert board.redis.llen(redis_keys.SUBMITTED_KEY) == 0 and intake.is_alive()
    finally:
        intake.stop()
        intake.join(POP_SECONDS + 5)
    assert not intake.is_alive()


def test_an_intake_key_set_to_another_type_is_deleted_and_the_intake_goes_on(redis_server: RedisServer) -> None:
    """`SET farm:submitted x` (a submitter may push there) made every pop fail with WRONGTYPE, which ended the intake
    thread of every worker: no job was accepted again until they restarted. The intake deletes what is not a list
    and goes on accepting."""
    board = JobBoard(redis_server.url)
    accepted: list[str] = []
    intake = Intake(board, lambda job_id: accepted.append(job_id) or f"job {job_id} accepted")
    intake.start()
    try:
        board.redis.set(redis_keys.SUBMITTED_KEY, "x")
        board.redis.hset(redis_keys.REPAIR_KEY, "a", "b")
        deadline = time.monotonic() + 10
        while board.redis.exists(redis_keys.SUBMITTED_KEY, redis_keys.REPAIR_KEY) and time.monotonic() < deadline:
            time.sleep(0.05)
        _requested(board, JOB)
        board.redis.lpush(redis_keys.SUBMITTED_KEY, JOB)
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert accepted == [JOB] and intake.is_alive()
    finally:
        intake.stop()
        intake.join(POP_SECONDS + 5)
    board.redis.set(redis_keys.ADMIT_KEY, "x")
    assert intake.take_one() == f"deleted {redis_keys.ADMIT_KEY} (a string): an intake key must be a list"


def test_a_lost_redis_is_waited_out(redis_server: RedisServer) -> None:
    board = JobBoard(redis_server.url)
    intake = Intake(board, lambda job_id: f"job {job_id} accepted")
    redis_server.stop()
    assert intake.take_one() is None
    redis_server.start()
    _requested(board, JOB)
    board.redis.lpush(redis_keys.SUBMITTED_KEY, JOB)
    assert intake.take_one() == f"job {JOB} accepted"


def test_the_intake_runs_the_stores_housekeeping_every_sweep_seconds_and_survives_its_errors(
    redis_server: RedisServer,
) -> None:
    from farm.distributed.intake import SWEEP_SECONDS

    runs: list[float] = []

    def housekeep() -> None:
        runs.append(time.monotonic())
        raise RuntimeError("Redis went away")

    intake = Intake(JobBoard(redis_server.url), lambda job_id: "", housekeep)
    intake.sweep()
    assert runs == []  # not before SWEEP_SECONDS have passed since the intake started
    intake._swept -= SWEEP_SECONDS
    intake.sweep()
    intake.sweep()
    assert len(runs) == 1  # the failure was logged, and the next run waits its turn
