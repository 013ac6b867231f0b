"""The local executor: results in call order, in a real process pool or in-process, and failures surface."""

import operator
import os

import pytest

from farm import defaults
from farm.build.executor import LocalExecutor, StepCall
from farm.errors import BuildError


def _fail(name: str) -> bytes:
    raise BuildError(f"kernel {name} failed")


def _bytes_of(n: int) -> bytes:
    return bytes([n % 256]) * n


@pytest.mark.parametrize("workers", [1, 2])
def test_results_in_job_order_and_progress_counts(workers):
    calls = [StepCall(f"j{i}", _bytes_of, (i,)) for i in range(12)]
    seen = []
    with LocalExecutor(workers) as executor:
        results = executor.run(calls, lambda call: seen.append(call.name))
    assert results == [_bytes_of(i) for i in range(12)]
    assert sorted(seen) == sorted(call.name for call in calls)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_job_raises_its_error(workers):
    calls = [StepCall("ok", operator.mul, (b"x", 3)), StepCall("bad", _fail, ("k1",))]
    with LocalExecutor(workers) as executor, pytest.raises(BuildError, match="kernel k1 failed"):
        executor.run(calls)


def test_default_workers_are_the_cpus_this_process_may_use():
    assert LocalExecutor().workers == defaults.cpu_count() == len(os.sched_getaffinity(0))


def _pid() -> bytes:
    import os

    return str(os.getpid()).encode()


def test_big_bytes_jobs_stay_in_this_process_and_others_go_to_the_pool():
    import os

    with LocalExecutor(2) as executor:
        results = executor.run([StepCall("blob", _pid, (), big_bytes=True), StepCall("kernel", _pid, ())])
    assert results[0] == str(os.getpid()).encode()
    assert results[1] != results[0]


def test_keep_large_buffers_is_safe_to_call_again():
    from farm.build.executor import keep_large_buffers

    keep_large_buffers()
    keep_large_buffers()
    assert bytearray(64 << 20)[-1] == 0


def _garbage_collection() -> bytes:
    import gc
    import json

    return json.dumps([gc.get_threshold(), gc.get_freeze_count() > 0]).encode()


def test_every_building_process_collects_garbage_rarely_and_not_over_what_it_loaded():
    """The pool's processes and the one that makes the executor (it plans, links and writes the artifact) raise the
    collector's thresholds and freeze what they have loaded (collect_garbage_rarely)."""
    import json

    from farm.build.executor import GC_THRESHOLDS

    with LocalExecutor(2) as executor:
        results = executor.run(
            [StepCall("here", _garbage_collection, (), big_bytes=True), StepCall("pool", _garbage_collection, ())]
        )
    assert [json.loads(result) for result in results] == [[list(GC_THRESHOLDS), True]] * 2
