"""The farm's Redis key names (farm/distributed/redis_keys.py) and what lives under them: workers' advertisements,
the jobs index, the events channel."""

from __future__ import annotations

from farm.backends.llvm.target import CpuTarget
from farm.backends.opencl.target import OpenClTarget
from farm.distributed import redis_keys

JOB = "0123456789abcdef"
CPU = CpuTarget("x86_64-unknown-linux-gnu", "skylake", "+avx2,+fma")
DEVICE = OpenClTarget("fedcba9876543210")


def test_capabilities_round_trip_and_garbage_advertises_nothing() -> None:
    capabilities = {"host": "h", "cpu": {"id": CPU.id}, "opencl": [{"fingerprint": DEVICE.fingerprint}]}
    assert redis_keys.decode_capabilities(redis_keys.encode_capabilities(capabilities)) == capabilities
    assert redis_keys.decode_capabilities("not json") == redis_keys.decode_capabilities("[1]") == {}
    assert redis_keys.decode_capabilities(None) == {}


def test_the_job_index_and_events_channel_are_named_here() -> None:
    assert redis_keys.JOBS_KEY == "farm:jobs"
    assert redis_keys.job_events_channel(JOB) == f"farm:job:{JOB}:events"
