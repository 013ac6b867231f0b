"""Documented defaults of the farm, in one place; each can be overridden by the environment variable named."""

from __future__ import annotations

import os
from pathlib import Path

from farm.errors import BadInputError


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


STORE_MAX_BYTES = 2 << 30
"""The default FARM_STORE_MAX_BYTES: 2 GiB. The farm's store shares one Redis with the queues, which must never be
refused a write (deploy/redis.conf runs with noeviction), so the store is kept well below the memory a small farm
host gives Redis: Redis uses 5-10% more than the entries' bytes (measured in benchmarks/bench_farm.py), so
about 2.2 GiB, which leaves room on a 4 GiB host for the queues and for the copy-on-write of an append-only-file
rewrite's fork. A job keeps about five times its model's weights in the store (model, weights, weight objects,
library, artifact), so the cap holds four jobs of a ResNet-50-sized model (100 MB of weights) at once, and a
running job of a model with up to about 400 MB of weights still fits under it (what a running job pins is never
evicted, so a bigger one takes the store above the cap until it ends)."""


def store_max_bytes() -> int:
    """FARM_STORE_MAX_BYTES: the cap on the bytes of the store's entries (default STORE_MAX_BYTES, 2 GiB). The
    farm's workers publish it in the store at start; least recently used entries that no live job pins are
    evicted to stay under it."""
    text = os.environ.get("FARM_STORE_MAX_BYTES", "").strip()
    if not text:
        return STORE_MAX_BYTES
    if not text.isdigit() or int(text) <= 0:
        raise BadInputError(f"FARM_STORE_MAX_BYTES={text[:40]!r}: expected a positive whole number of bytes")
    return int(text)


def tune_seconds_per_variant() -> float:
    """FARM_TUNE_SECONDS_PER_VARIANT: about how long tuning times each variant of a kernel (default 0.03; at least
    3 rounds whatever it says)."""
    return _seconds("FARM_TUNE_SECONDS_PER_VARIANT", 0.03)


POLL_SECONDS = 0.05
JOB_TTL_SECONDS = 7 * 24 * 3600
