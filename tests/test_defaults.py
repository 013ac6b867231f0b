"""Documented defaults of the farm (farm/defaults.py) and the environment variables that override them."""

from __future__ import annotations

import os

import pytest

from farm import defaults
from farm.errors import BadInputError, ExitStatus

FARM_ENV = (
    "FARM_BROKER_URL",
    "FARM_STORE_URL",
    "FARM_TASK_SOFT_TIME_LIMIT",
    "FARM_TASK_TIME_LIMIT",
    "FARM_VISIBILITY_TIMEOUT",
    "FARM_MAX_DELIVERIES",
    "FARM_WORKER_REDIS_RETRIES",
    "FARM_TOOLCHAIN_LABEL",
    "FARM_STORE_MAX_BYTES",
    "FARM_WORKER_LEASE_SECONDS",
    "FARM_WAIT_FALLBACK_SECONDS",
)


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
    assert defaults.toolchain_label() == ""
    assert defaults.POLL_SECONDS > 0 and defaults.JOB_TTL_SECONDS == 7 * 24 * 3600
    assert defaults.store_max_bytes() == defaults.STORE_MAX_BYTES == 2 << 30
    assert defaults.wait_fallback_seconds() == 5  # a waiting client blocks on notifications, reads at least this often
    assert (
        0
        < defaults.LIVENESS_FIRST_CHECK_SECONDS
        < defaults.LIVENESS_CHECK_SECONDS
        < defaults.LIVENESS_CHECK_MAX_SECONDS
    )


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
    monkeypatch.setenv("FARM_TOOLCHAIN_LABEL", "canary")
    monkeypatch.setenv("FARM_STORE_MAX_BYTES", "1048576")
    monkeypatch.setenv("FARM_WAIT_FALLBACK_SECONDS", "0.5")
    assert defaults.broker_url() == "redis://broker:6379/1"
    assert defaults.store_url("redis://broker:6379/1") == "file:///srv/farm-store"
    assert defaults.task_soft_time_limit() == 10.5
    assert defaults.task_time_limit() == 20
    assert defaults.visibility_timeout() == 45
    assert defaults.max_deliveries() == 7
    assert defaults.worker_redis_retries() == 2
    assert defaults.toolchain_label() == "canary"
    assert defaults.store_max_bytes() == 1 << 20
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


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "redis://:pw@farm-host:6379/0",
        "rediss://me:pw@h/2",
        "redis://h",
        "redis://h:6379",
        "redis://h:6379/",
        "redis://[::1]:6379/0",
        "redis://h:6379/0?socket_timeout=5",
    ],
)
def test_redis_urls_the_farm_can_use(url: str) -> None:
    assert defaults.redis_url(url) == url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("127.0.0.1:6379", "127.0.0.1:6379"),  # no scheme: redis-py's answer was a 43-line traceback
        ("localhost", "localhost"),
        ("", ""),
        ("http://h:6379/0", "http://h:6379/0"),
        ("unix:///run/r.sock", None),
        ("redis://", None),
        ("redis://h:port/0", None),
        ("redis://h:0/0", None),
        ("redis://h:99999/0", None),
        ("redis://h:6379/db", None),
        ("redis://[::1/0", None),
        (":hunter2@h:6379", "***@h:6379"),
        ("redis://:hunter2@h:x/0", "redis://***@h:x/0"),
        ("http://u:hunter2@h/0", "http://***@h/0"),
        ("redis://:hun@ter2@h:1/x", "redis://***@h:1/x"),
    ],
)
def test_anything_else_is_refused_naming_its_source_and_never_its_password(url: str, shown: str | None) -> None:
    with pytest.raises(BadInputError) as caught:
        defaults.redis_url(url, "FARM_BROKER_URL")
    assert str(caught.value) == (
        f"FARM_BROKER_URL {url if shown is None else shown}: not a Redis URL "
        "(redis://[:password@]host:port/db or rediss://...)"
    )
    assert "hunter2" not in str(caught.value) and "ter2" not in str(caught.value)
    assert caught.value.exit_status == ExitStatus.BAD_INPUT == 2


@pytest.mark.parametrize("value", ["0", "-5", "2GB", "1.5e9", "lots"])
def test_a_bad_store_cap_is_bad_input_naming_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("FARM_STORE_MAX_BYTES", value)
    with pytest.raises(BadInputError, match="FARM_STORE_MAX_BYTES"):
        defaults.store_max_bytes()


def test_a_rediss_url_verifies_the_server_by_default_and_names_its_files(tmp_path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    assert defaults.redis_tls_options("rediss://h/0") == {"ssl_cert_reqs": "required"}
    assert defaults.redis_tls_options(f"rediss://:pw@h/0?ssl_ca_certs={ca}&ssl_cert_reqs=none&socket_timeout=5") == {
        "ssl_cert_reqs": "none",
        "ssl_ca_certs": str(ca),
    }
    assert defaults.redis_tls_options("redis://h/0") is None
    url = f"rediss://:pw@h:6380/0?ssl_cert_reqs=required&ssl_ca_certs={ca}&ssl_certfile={ca}&ssl_keyfile={ca}"
    assert defaults.redis_url(url) == url


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("ssl_cert_reqs=CERT_MAYBE", "ssl_cert_reqs must be one of required, optional, none"),
        ("ssl_cert_reqs=REQUIRED", "ssl_cert_reqs must be one of required, optional, none"),  # redis-py: lower case
        ("ssl_ca_certs=/no/such/ca.pem", "ssl_ca_certs /no/such/ca.pem: no such readable file"),
        ("ssl_keyfile=/no/key.pem", "ssl_keyfile /no/key.pem: no such readable file"),
    ],
)
def test_tls_parameters_that_cannot_work_are_bad_input_naming_the_parameter(query: str, named: str) -> None:
    with pytest.raises(BadInputError) as caught:
        defaults.redis_url(f"rediss://:hunter2@h:6380/0?{query}", "FARM_BROKER_URL")
    assert str(caught.value) == f"FARM_BROKER_URL rediss://***@h:6380/0?{query}: {named}"


def test_tls_parameters_on_a_plain_url_are_bad_input() -> None:
    with pytest.raises(BadInputError, match=r"ssl_\* parameters need a rediss:// URL"):
        defaults.redis_url("redis://h:6379/0?ssl_ca_certs=/etc/ca.pem")


def test_the_blob_store_is_the_farms_redis_unless_it_names_a_redis_or_an_absolute_folder(monkeypatch) -> None:
    from farm import defaults
    from farm.errors import BadInputError

    for unset in ("", "redis", "  "):
        monkeypatch.setenv("FARM_BLOB_STORE", unset)
        assert defaults.blob_store_url() is None
    for good in ("file:///mnt/farm-cas", "redis://farm-worker:secret@blobs:6379/0", "rediss://blobs:6380"):
        monkeypatch.setenv("FARM_BLOB_STORE", good)
        assert defaults.blob_store_url() == good
    for bad in ("s3://bucket", "file://relative/cas", "/mnt/farm-cas", "http://user:secret@blobs"):
        monkeypatch.setenv("FARM_BLOB_STORE", bad)
        with pytest.raises(BadInputError, match="FARM_BLOB_STORE=.*expected redis, redis://HOST:PORT/DB") as error:
            defaults.blob_store_url()
        assert "secret" not in str(error.value)
    monkeypatch.setenv("FARM_BLOB_STORE", "redis://farm-worker:secret@blobs:port/0")
    with pytest.raises(BadInputError, match=r"FARM_BLOB_STORE redis://\*\*\*@blobs:port/0: not a Redis URL"):
        defaults.blob_store_url()


def test_the_blob_store_clients_reach_is_a_redis_or_a_folder(monkeypatch) -> None:
    from farm import defaults
    from farm.errors import BadInputError

    monkeypatch.delenv("FARM_BLOB_STORE_CLIENT_URL", raising=False)
    assert defaults.blob_store_client_url() is None
    for good in ("redis://farm-host:6380/0", "file:///mnt/farm-cas"):
        monkeypatch.setenv("FARM_BLOB_STORE_CLIENT_URL", good)
        assert defaults.blob_store_client_url() == good
    monkeypatch.setenv("FARM_BLOB_STORE_CLIENT_URL", "farm-host:6380")
    with pytest.raises(BadInputError, match="FARM_BLOB_STORE_CLIENT_URL='farm-host:6380': expected redis://"):
        defaults.blob_store_client_url()


def test_a_waiting_client_prefetches_512_mib_unless_told(monkeypatch) -> None:
    from farm import defaults
    from farm.errors import BadInputError

    monkeypatch.delenv("FARM_PREFETCH_BYTES", raising=False)
    assert defaults.prefetch_bytes() == 512 << 20
    monkeypatch.setenv("FARM_PREFETCH_BYTES", "0")
    assert defaults.prefetch_bytes() == 0
    monkeypatch.setenv("FARM_PREFETCH_BYTES", "1GiB")
    with pytest.raises(BadInputError, match="FARM_PREFETCH_BYTES='1GiB': expected a whole number of bytes"):
        defaults.prefetch_bytes()


def test_the_folded_bytes_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FARM_MAX_FOLDED_BYTES", raising=False)
    assert defaults.max_folded_bytes() == defaults.MAX_FOLDED_BYTES == 1 << 30
    monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", " 4096 ")
    assert defaults.max_folded_bytes() == 4096
    for bad in ("0", "-1", "1e9", "lots"):
        monkeypatch.setenv("FARM_MAX_FOLDED_BYTES", bad)
        with pytest.raises(BadInputError, match="FARM_MAX_FOLDED_BYTES=.*positive whole number of bytes"):
            defaults.max_folded_bytes()


def test_the_step_memory_limit_is_the_hosts_share_per_process_but_no_less_than_4_gib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three quarters of the host's memory shared among the pool's processes, but at least STEP_MEMORY_MIN_BYTES
    while the host has twice that (a 64-core host of 128 GiB: 4 GiB a process, not 1.5); FARM_STEP_MEMORY_BYTES
    overrides, 0 is none."""
    monkeypatch.delenv("FARM_STEP_MEMORY_BYTES", raising=False)
    host = defaults.host_memory_bytes()
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert 0 < host <= physical
    for processes in (1, 2, 3, 64, 1024):
        expected = max(host * 3 // 4 // processes, min(defaults.STEP_MEMORY_MIN_BYTES, host // 2))
        assert defaults.step_memory_bytes(processes) == expected
    assert defaults.step_memory_bytes(1) == host * 3 // 4
    assert defaults.step_memory_bytes(1024) == min(4 << 30, host // 2)
    monkeypatch.setenv("FARM_STEP_MEMORY_BYTES", "3221225472")
    assert defaults.step_memory_bytes(2) == 3 << 30
    monkeypatch.setenv("FARM_STEP_MEMORY_BYTES", "0")
    assert defaults.step_memory_bytes(2) == 0  # no limit: a host that bounds its workers with a cgroup
    monkeypatch.setenv("FARM_STEP_MEMORY_BYTES", "4G")
    with pytest.raises(BadInputError, match=r"FARM_STEP_MEMORY_BYTES='4G': expected a whole number of bytes \(0: no"):
        defaults.step_memory_bytes(2)
