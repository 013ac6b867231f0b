"""`farm store stats` and `farm store gc` (farm/cli/store.py), run as a user would: the real CLI in a fresh process,
on this machine's store and on a farm's (a real redis-server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from farm.backends.llvm.target import host_target
from farm.cli.store import human_bytes
from farm.distributed import pins
from farm.distributed.board import JobBoard
from farm.distributed.job_record import JobRecord, JobState
from farm.store import FileStore, RedisStore
from tests.services import RedisServer, free_port, redis_server_fixture  # noqa: F401

KIB = 1 << 10


def farm(*args: str, cwd: Path, broker: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """`farm ARGS` in a fresh process, with FARM_BROKER_URL only when `broker` is given."""
    base = {key: value for key, value in os.environ.items() if key not in ("FARM_BROKER_URL", "FARM_STORE_MAX_BYTES")}
    return subprocess.run(
        [sys.executable, "-m", "farm", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **({"FARM_BROKER_URL": broker} if broker else {}), **env},
    )


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 3 << 20, 2 << 30, 5 << 40)] == [
        "0 B",
        "1023 B",
        "1.00 KiB",
        "3.00 MiB",
        "2.00 GiB",
        "5.00 TiB",
    ]


def test_without_a_farm_they_act_on_this_machines_store(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "cache" / "store")
    keys = [store.put(bytes([seed]) * KIB) for seed in range(3)]
    env = {"FARM_CACHE_DIR": str(tmp_path / "cache"), "FARM_STORE_MAX_BYTES": str(2 * KIB)}
    stats = farm("store", "stats", "--json", cwd=tmp_path, **env)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout) == {
        "store": store.url,
        "entries": 3,
        "bytes": 3 * KIB,
        "max_bytes": 2 * KIB,
        "pinned_entries": 0,
        "pinned_bytes": 0,
        "pin_owners": [],
    }
    text = farm("store", "stats", cwd=tmp_path, **env).stdout
    assert "3 entries, 3.00 KiB of the 2.00 KiB cap (150%)" in text
    collected = farm("store", "gc", cwd=tmp_path, **env)
    assert collected.returncode == 0, collected.stderr
    assert "freed 1 entries, 1.00 KiB" in collected.stdout and "2 entries, 2.00 KiB" in collected.stdout
    assert [store.has(key) for key in keys].count(False) == 1


def test_on_a_farm_gc_releases_ended_jobs_and_evicts_down_to_the_published_cap(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    store, board = RedisStore(redis_server.url), JobBoard(redis_server.url)
    kept, dropped = store.put(b"k" * KIB), store.put(b"d" * KIB)
    running, failed = (uuid.uuid4().hex[:16] for _ in range(2))
    for job_id, key in ((running, kept), (failed, dropped)):
        board.create(job_id, JobRecord(JobState.COMPILING, key, "m", key, [host_target()]))
        pins.pin_for_job(store, job_id, [key])
    board.fail(failed, "its worker died")
    store.set_max_bytes(KIB)  # as a worker does at start

    stats = json.loads(farm("store", "stats", "--json", cwd=tmp_path, broker=redis_server.url).stdout)
    assert (stats["entries"], stats["bytes"], stats["max_bytes"]) == (2, 2 * KIB, KIB)
    assert (stats["pinned_entries"], sorted(stats["pin_owners"])) == (2, sorted([f"job:{running}", f"job:{failed}"]))

    collected = farm("store", "gc", "--json", cwd=tmp_path, broker=redis_server.url)
    assert collected.returncode == 0, collected.stderr
    report = json.loads(collected.stdout)
    assert report["released_jobs"] == [failed] and (report["freed_entries"], report["freed_bytes"]) == (1, KIB)
    assert report["stats"]["pin_owners"] == [f"job:{running}"] and store.has(kept) and not store.has(dropped)
    text = farm("store", "gc", cwd=tmp_path, broker=redis_server.url).stdout
    assert "freed 0 entries, 0 B" in text and "pinned: 1 entries, 1.00 KiB, by job:" in text


def test_an_unreachable_farm_exits_4_with_one_line(tmp_path: Path) -> None:
    result = farm("store", "stats", cwd=tmp_path, broker=f"redis://:secret@127.0.0.1:{free_port()}/0")
    assert result.returncode == 4
    assert result.stderr.startswith("farm: error:") and len(result.stderr.strip().splitlines()) == 1
    assert "secret" not in result.stderr


@pytest.mark.parametrize("command", ["stats", "gc"])
def test_a_bad_cap_setting_is_bad_input(tmp_path: Path, command: str) -> None:
    result = farm("store", command, cwd=tmp_path, FARM_CACHE_DIR=str(tmp_path), FARM_STORE_MAX_BYTES="2GB")
    assert result.returncode == 2 and "FARM_STORE_MAX_BYTES" in result.stderr
