"""Documented defaults of the farm (farm/defaults.py) and the environment variables that override them."""

from __future__ import annotations

import pytest

from farm import defaults

FARM_ENV = ("FARM_BROKER_URL", "FARM_STORE_URL", "FARM_TASK_SOFT_TIME_LIMIT", "FARM_TASK_TIME_LIMIT",
            "FARM_VISIBILITY_TIMEOUT", "FARM_MAX_DELIVERIES", "FARM_WORKER_REDIS_RETRIES", "FARM_WAIT_FALLBACK_SECONDS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in FARM_ENV:
        monkeypatch.delenv(name, raising=False)


def test_defaults() -> None:
    assert defaults.broker_url() is None  # no broker: builds run on this machine
    assert defaults.store_url("redis://h:6379/0") == "redis://h:6379/0"  # the store defaults to the broker
    assert defaults.task_soft_time_limit() == 600
    assert defaults.task_time_limit() == 660
    assert defaults.visibility_timeout() == 720
    assert defaults.max_deliveries() == 3
    assert defaults.worker_redis_retries() == 60  # about 30 s: a worker waits out a Redis restart
    assert defaults.POLL_SECONDS > 0 and defaults.JOB_TTL_SECONDS == 7 * 24 * 3600
    assert defaults.wait_fallback_seconds() == 5  # a waiting client blocks on notifications, reads at least this often
    assert 0 < defaults.LIVENESS_FIRST_CHECK_SECONDS < defaults.LIVENESS_CHECK_SECONDS < defaults.LIVENESS_CHECK_MAX_SECONDS


def test_the_default_limits_are_ordered() -> None:
    """A task is asked to stop, then killed, and only after that may Redis hand its message to another worker."""
    assert 0 < defaults.task_soft_time_limit() < defaults.task_time_limit() < defaults.visibility_timeout()


def test_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_BROKER_URL", "redis://broker:6379/1")
    monkeypatch.setenv("FARM_STORE_URL", "file:///srv/farm-store")
    monkeypatch.setenv("FARM_TASK_SOFT_TIME_LIMIT", "10.5")
    monkeypatch.setenv("FARM_TASK_TIME_LIMIT", "20")
    monkeypatch.setenv("FARM_VISIBILITY_TIMEOUT", "45")
    monkeypatch.setenv("FARM_MAX_DELIVERIES", "7")
    monkeypatch.setenv("FARM_WORKER_REDIS_RETRIES", "2")
    monkeypatch.setenv("FARM_WAIT_FALLBACK_SECONDS", "0.5")
    assert defaults.broker_url() == "redis://broker:6379/1"
    assert defaults.store_url("redis://broker:6379/1") == "file:///srv/farm-store"
    assert defaults.task_soft_time_limit() == 10.5
    assert defaults.task_time_limit() == 20
    assert defaults.visibility_timeout() == 45
    assert defaults.max_deliveries() == 7
    assert defaults.worker_redis_retries() == 2
    assert defaults.wait_fallback_seconds() == 0.5


def test_the_visibility_timeout_follows_an_overridden_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TASK_TIME_LIMIT", "100")
    assert defaults.visibility_timeout() == 160
    assert defaults.task_soft_time_limit() == 600  # the soft limit has its own default


def test_empty_urls_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_BROKER_URL", "")
    monkeypatch.setenv("FARM_STORE_URL", "")
    assert defaults.broker_url() is None
    assert defaults.store_url("redis://b/0") == "redis://b/0"


def test_values_are_read_at_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    assert defaults.max_deliveries() == 3
    monkeypatch.setenv("FARM_MAX_DELIVERIES", "1")
    assert defaults.max_deliveries() == 1
