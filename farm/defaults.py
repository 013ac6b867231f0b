"""Documented defaults of the farm, in one place; each can be overridden by the environment variable named."""

from __future__ import annotations

import os
from pathlib import Path


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask): the default number of local compile processes and of
    runtime threads."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def cache_dir() -> Path:
    """FARM_CACHE_DIR: farm's cache root (the embedded store, the runtime's libraries and programs); default
    ~/.cache/farm."""
    configured = os.environ.get("FARM_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "farm"


def broker_url() -> str | None:
    """FARM_BROKER_URL: the Redis URL of the farm; unset means builds run on this machine."""
    return os.environ.get("FARM_BROKER_URL") or None


def store_url(broker: str) -> str:
    """FARM_STORE_URL: where big bytes live; defaults to the broker's Redis."""
    return os.environ.get("FARM_STORE_URL") or broker


def task_soft_time_limit() -> float:
    """FARM_TASK_SOFT_TIME_LIMIT: seconds a task may run before it is asked to stop (default 600)."""
    return _seconds("FARM_TASK_SOFT_TIME_LIMIT", 600)


def task_time_limit() -> float:
    """FARM_TASK_TIME_LIMIT: seconds after which a task's process is killed (default 660)."""
    return _seconds("FARM_TASK_TIME_LIMIT", 660)


def visibility_timeout() -> float:
    """FARM_VISIBILITY_TIMEOUT: seconds before Redis redelivers an unacknowledged task; longer than any task."""
    return _seconds("FARM_VISIBILITY_TIMEOUT", task_time_limit() + 60)


def max_deliveries() -> int:
    """FARM_MAX_DELIVERIES: deliveries of one task (its first run included) before its job fails (default 3)."""
    return int(os.environ.get("FARM_MAX_DELIVERIES", 3))


def worker_redis_retries() -> int:
    """FARM_WORKER_REDIS_RETRIES: reconnections a worker tries (about 0.5 s apart) before a step fails, so that
    a Redis restart in the middle of a job is waited out (default 60)."""
    return int(os.environ.get("FARM_WORKER_REDIS_RETRIES", 60))


def tune_seconds_per_variant() -> float:
    """FARM_TUNE_SECONDS_PER_VARIANT: about how long tuning times each variant of a kernel (default 0.03; at least
    3 rounds whatever it says)."""
    return _seconds("FARM_TUNE_SECONDS_PER_VARIANT", 0.03)


def wait_fallback_seconds() -> float:
    """FARM_WAIT_FALLBACK_SECONDS: a waiting client blocks on its job's notifications and reads the job again at
    least this often anyway, so a missed notification (a dropped connection) only delays it (default 5)."""
    return _seconds("FARM_WAIT_FALLBACK_SECONDS", 5)


POLL_SECONDS = 0.05
"""The least time between two reads of a job by one waiting client: a burst of notifications is one read."""
LIVENESS_FIRST_CHECK_SECONDS = 2.0
"""A waiting client first asks which of its job's queues have no live worker this long after it starts, unless the
job ended: a check may take a second (it pings the workers), and a job a live farm ends at once needs none."""
LIVENESS_CHECK_SECONDS = 5.0
"""It asks again after the job has shown no change for this long; the pause doubles after each check while the job
still shows none."""
LIVENESS_CHECK_MAX_SECONDS = 60.0
"""The longest pause between two such checks of a job that shows no change."""
JOB_TTL_SECONDS = 7 * 24 * 3600
