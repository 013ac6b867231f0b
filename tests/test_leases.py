"""Worker leases and running tasks (farm/distributed/leases.py) on a real redis-server: a dead holder's tasks are
dispatched again exactly once, a live holder's never."""

from __future__ import annotations

import threading
import time

import pytest

from farm.backends.llvm.target import CpuTarget
from farm.distributed import redis_keys, task_messages
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobRecord, JobState
from farm.distributed.leases import LeaseKeeper, Leases, holder_of
from farm.distributed.task_messages import Finish, Link, Message, PlanJob
from tests.services import RedisServer, redis_server_fixture  # noqa: F401

JOB = "0123456789abcdef"


@pytest.fixture
def leases(redis_server: RedisServer) -> Leases:
    board = JobBoard(redis_server.url)
    return Leases(board.redis, board.call)


def test_a_lease_lapses_unless_renewed_and_release_spares_a_newer_incarnation(leases: Leases) -> None:
    leases.renew("w1", "old", 0.3)
    assert leases.redis.get(redis_keys.lease_key("w1")) == "old"
    time.sleep(0.5)
    assert leases.redis.get(redis_keys.lease_key("w1")) is None
    leases.renew("w1", "new", 5)
    leases.release("w1", "old")  # the old incarnation shutting down late must not drop the restarted worker's lease
    assert leases.redis.get(redis_keys.lease_key("w1")) == "new"
    leases.release("w1", "new")
    assert leases.redis.get(redis_keys.lease_key("w1")) is None


def test_a_task_is_running_for_the_time_of_its_step_even_when_it_raises(leases: Leases) -> None:
    message = PlanJob(JOB).message()
    with leases.running("t1", holder_of("w1", "i1"), message):
        entry = task_messages.RunningTask.decode(leases.redis.hget(redis_keys.RUNNING_KEY, "t1"))
        assert entry.message == message and (entry.worker, entry.incarnation) == ("w1", "i1")
    with pytest.raises(RuntimeError), leases.running("t2", holder_of("w1", "i1"), message):
        raise RuntimeError("the step failed")
    assert leases.redis.hlen(redis_keys.RUNNING_KEY) == 0


def test_reap_dispatches_a_dead_holders_tasks_and_leaves_a_live_holders(leases: Leases) -> None:
    leases.renew("alive", "i1", 5)
    leases.renew("restarted", "new", 5)
    tasks = {
        "t1": ("alive#i1", Link(JOB, "cpu-x").message()),
        "t2": ("dead#i2", PlanJob(JOB).message()),
        "t3": ("restarted#old", Finish(JOB).message()),
    }
    for task_id, (holder, message) in tasks.items():
        leases.redis.hset(redis_keys.RUNNING_KEY, task_id, task_messages.RunningTask(holder, message).encode())
    leases.redis.hset(redis_keys.RUNNING_KEY, "forged", '{"holder": "x#y", "task": "os.system", "args": ["id"]}')
    sent: list[Message] = []
    reaped = leases.reap(sent.append)
    assert sorted(sent, key=str) == sorted([PlanJob(JOB).message(), Finish(JOB).message()], key=str)
    assert sorted((task.holder, task.job_id) for task in reaped) == [("dead#i2", JOB), ("restarted#old", JOB)]
    assert set(leases.redis.hkeys(redis_keys.RUNNING_KEY)) == {"t1"}  # the forged entry was dropped, not sent


def test_concurrent_reapers_dispatch_each_lost_task_once(leases: Leases) -> None:
    for index in range(40):
        leases.redis.hset(
            redis_keys.RUNNING_KEY, f"t{index}", task_messages.RunningTask("dead#i", PlanJob(JOB).message()).encode()
        )
    sent: list[Message] = []
    lock = threading.Lock()

    def dispatch(message: Message) -> None:
        with lock:
            sent.append(message)

    reapers = [threading.Thread(target=leases.reap, args=(dispatch,)) for _ in range(4)]
    for reaper in reapers:
        reaper.start()
    for reaper in reapers:
        reaper.join(30)
    assert len(sent) == 40


def test_the_keeper_renews_reaps_tells_each_job_what_it_lost_and_releases(
    leases: Leases, redis_server: RedisServer
) -> None:
    other = "fedcba9876543210"
    board, target = JobBoard(redis_server.url), CpuTarget("x86_64-unknown-linux-gnu")
    for job_id in (JOB, other):
        board.create(job_id, JobRecord(JobState.COMPILING, "a" * 64, "m", "a" * 64, [target]))
    lost = {
        "t1": ("gone#i", PlanJob(JOB)),
        "t2": ("gone#i", Link(JOB, "cpu-x")),
        "t3": ("gone#i", Finish(other)),
        "t4": ("also-gone#j", Finish(JOB)),
    }
    for task_id, (holder, args) in lost.items():
        leases.redis.hset(redis_keys.RUNNING_KEY, task_id, task_messages.RunningTask(holder, args.message()).encode())
    sent: list[Message] = []
    keeper = LeaseKeeper(leases, "w1", "i1", sent.append, board.lost_worker, seconds=0.4)
    keeper.start()
    time.sleep(1.0)  # longer than the lease: renewals keep it
    assert leases.redis.get(redis_keys.lease_key("w1")) == "i1" and len(sent) == 4
    assert board.get(JOB).lost_workers == {"gone#i": 2, "also-gone#j": 1}  # once per holder, reaped once
    assert board.get(other).lost_workers == {"gone#i": 1}
    keeper.stop()
    keeper.join(5)
    assert leases.redis.get(redis_keys.lease_key("w1")) is None


def test_a_running_tasks_key_of_the_wrong_type_skips_rounds_but_never_ends_the_keeper(leases: Leases) -> None:
    """Any error of a round (here a WRONGTYPE on the running tasks, as the operator's hand could make it) is logged
    and the next round goes on: a keeper that ended would let its worker's lease lapse while it works."""
    leases.redis.set(redis_keys.RUNNING_KEY, "x")
    keeper = LeaseKeeper(leases, "w1", "i1", lambda message: None, lambda *args: True, seconds=0.4)
    keeper.start()
    time.sleep(0.5)
    assert keeper.is_alive()
    leases.redis.delete(redis_keys.RUNNING_KEY)
    leases.redis.delete(redis_keys.lease_key("w1"))
    time.sleep(0.3)
    assert leases.redis.get(redis_keys.lease_key("w1")) == "i1"
    keeper.stop()
    keeper.join(5)
