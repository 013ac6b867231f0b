"""The content-addressed store, on both backends: files in tmp_path and a real redis-server (tests/services.py)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.errors import ExitStatus
from farm.store import (
    BadStoreUrlError,
    CorruptEntryError,
    FileStore,
    MissingEntryError,
    RedisStore,
    Store,
    StoreError,
    StoreUnreachableError,
    content_key,
    default_store_root,
    open_store,
)
from farm.store.base import EMPTY_KEY, Eviction
from farm.store.redis_connection import with_login_of, without_login
from farm.store.redis_store import CHUNK_BYTES, blob_redis
from tests.services import RedisServer, free_port, redis_server_fixture, redis_servers_fixture  # noqa: F401

MIB = 1 << 20
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.services)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """Each backend in turn: a FileStore in tmp_path, a RedisStore on a fresh redis-server."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    server: RedisServer = request.getfixturevalue("redis_server")
    redis_store = RedisStore(server.url)
    request.addfinalizer(redis_store.close)
    return redis_store


def pseudo_random(size: int, seed: int = 0) -> bytes:
    """Incompressible, reproducible bytes (os.urandom can't be regenerated in another process)."""
    import random

    return random.Random(seed).randbytes(size)


def corrupt(store: Store, key: str) -> None:
    """Flip one byte of the stored value behind the store's back, as a disk or memory fault would."""
    if isinstance(store, FileStore):
        path = store.object_path(key)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        assert isinstance(store, RedisStore)
        chunk = store.chunk_key(key, 0)
        middle = store.client.strlen(chunk) // 2
        byte = store.client.getrange(chunk, middle, middle)
        store.client.setrange(chunk, middle, bytes([byte[0] ^ 0xFF]))


def write_marker(store: Store, key: str) -> object:
    """Something that changes whenever the store writes the entry again (to prove a second put skips the write)."""
    if isinstance(store, FileStore):  # a write renames a new file into place (a put of a present entry only
        return store.object_path(key).stat().st_ino  # touches its mtime: a use)
    assert isinstance(store, RedisStore)
    return store.client.info("commandstats").get("cmdstat_set", {}).get("calls")


# --- both backends -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"", b"x", bytes(range(256)) * 1000, bytearray(b"a bytearray"), memoryview(b"a memoryview")],
    ids=["empty", "one-byte", "256k", "bytearray", "memoryview"],
)
def test_put_get_round_trip(store: Store, value: bytes | bytearray | memoryview) -> None:
    key = store.put(value)
    assert key == hashlib.sha256(bytes(value)).hexdigest() == content_key(value)
    assert store.has(key)
    assert store.get(key) == bytes(value)


def test_empty_value_has_the_empty_key(store: Store) -> None:
    assert store.put(b"") == EMPTY_KEY
    assert store.has(EMPTY_KEY) and store.get(EMPTY_KEY) == b""


def test_non_contiguous_memoryview_is_stored_by_its_bytes(store: Store) -> None:
    """A strided view (e.g. of a numpy slice) must be stored as the bytes it shows, not the buffer behind it."""
    strided = memoryview(bytes(range(100)))[::3]
    key = store.put(strided)
    assert store.get(key) == strided.tobytes()


def test_50_mb_value_round_trips(store: Store) -> None:
    value = pseudo_random(50 * MIB)
    key = store.put(value)
    assert store.get(key) == value
    if isinstance(store, RedisStore):  # chunks of 8 MiB less a page: 7 of them, none over the chunk size
        header = store.client.get(store.header_key(key))
        assert header == f"{50 * MIB}:7".encode()
        assert max(store.client.strlen(store.chunk_key(key, index)) for index in range(7)) == CHUNK_BYTES


def test_put_is_idempotent_and_skips_the_write(store: Store) -> None:
    value = pseudo_random(3 * MIB)
    key = store.put(value)
    marker = write_marker(store, key)
    assert store.put(value) == key
    assert write_marker(store, key) == marker
    assert store.get(key) == value


def test_has_and_delete(store: Store) -> None:
    key = content_key(b"payload")
    assert not store.has(key)
    assert store.put(b"payload") == key
    assert store.has(key)
    store.delete(key)
    assert not store.has(key)
    with pytest.raises(MissingEntryError):
        store.get(key)
    store.delete(key)  # deleting what isn't there is fine


def test_missing_entry_names_its_key(store: Store) -> None:
    key = content_key(b"never stored")
    with pytest.raises(MissingEntryError, match=key) as caught:
        store.get(key)
    assert caught.value.key == key
    assert caught.value.exit_status == ExitStatus.BUILD_FAILED


@pytest.mark.parametrize("bad_key", ["", "../../etc/passwd", "ABC", "A" * 64, "0" * 63, "g" * 64])
def test_malformed_keys_are_refused(store: Store, bad_key: str) -> None:
    """Keys become file paths and Redis keys; anything but 64 lowercase hex digits is a caller's bug."""
    for operation in (store.get, store.has, store.delete):
        with pytest.raises(StoreError, match="not a store key"):
            operation(bad_key)
    with pytest.raises(StoreError, match="not a store key"):
        store.set_ref("kernel:x", bad_key)


def test_refs(store: Store) -> None:
    first, second = store.put(b"object one"), store.put(b"object two")
    name = "kernel:" + content_key(b"spec")
    assert store.get_ref(name) is None
    store.set_ref(name, first)
    assert store.get_ref(name) == first
    store.set_ref(name, second)
    assert store.get_ref(name) == second
    store.delete_ref(name)
    assert store.get_ref(name) is None
    store.delete_ref(name)  # deleting what isn't there is fine
    assert store.has(first) and store.has(second)  # refs don't own their targets


@pytest.mark.parametrize("name", ["job:42:artifact", "a/b/../c", "ünïcode ✓", "x" * 1000, ""])
def test_any_string_names_a_ref(store: Store, name: str) -> None:
    key = store.put(name.encode())
    store.set_ref(name, key)
    assert store.get_ref(name) == key
    assert store.get_ref(name + "-other") is None


def test_corrupt_entry_raises_is_deleted_and_can_be_put_again(store: Store) -> None:
    value = pseudo_random(100_000)
    key = store.put(value)
    corrupt(store, key)
    assert store.has(key)  # has() doesn't hash: only get can tell
    with pytest.raises(CorruptEntryError, match=key) as caught:
        store.get(key)
    assert caught.value.key == key
    assert not store.has(key)
    with pytest.raises(MissingEntryError):
        store.get(key)
    assert store.put(value) == key  # the rebuild
    assert store.get(key) == value


def test_concurrent_puts_of_one_value_from_threads(store: Store) -> None:
    value = pseudo_random(20 * MIB)  # three 8 MiB chunks in Redis
    barrier = threading.Barrier(4)
    keys: list[str] = []
    errors: list[BaseException] = []

    def put() -> None:
        try:
            barrier.wait()
            keys.append(store.put(value))
        except BaseException as exc:  # noqa: B036 -- reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=put) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert keys == [content_key(value)] * 4
    assert store.get(keys[0]) == value
    if isinstance(store, FileStore):
        assert sorted(path.name for path in store.root.rglob("*") if path.is_file()) == [keys[0]]  # no temp files


def test_concurrent_puts_of_one_value_from_processes(store: Store) -> None:
    """Four processes that reopen the store from its URL put the same value at the same moment."""
    script = (
        "import random, sys, time\n"
        "from farm.store import open_store\n"
        "value = random.Random(7).randbytes(9 << 20)\n"
        "time.sleep(max(0.0, float(sys.argv[2]) - time.time()))\n"
        "print(open_store(sys.argv[1]).put(value))\n"
    )
    start_at = str(time.time() + 1.0)
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", script, store.url, start_at], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    outputs = [process.communicate(timeout=60)[0].strip() for process in processes]
    assert [process.returncode for process in processes] == [0] * 4
    value = pseudo_random(9 * MIB, seed=7)
    assert outputs == [content_key(value)] * 4
    assert store.get(outputs[0]) == value


def test_url_reopens_the_same_store(store: Store) -> None:
    key = store.put(b"shared")
    store.set_ref("job:1", key)
    with open_store(store.url) as reopened:
        assert type(reopened) is type(store)
        assert reopened.get(key) == b"shared"
        assert reopened.get_ref("job:1") == key


# --- the cap, eviction and pins (both backends: Redis evicts on put, files when asked, as `farm store gc` does) --

KIB = 1 << 10


def later() -> None:
    """Let the clock move on, so that uses are ordered (file mtimes are coarse; Redis counts milliseconds)."""
    time.sleep(0.02)


def put_in_order(store: Store, *seeds: int, size: int = KIB) -> list[str]:
    keys = []
    for seed in seeds:
        keys.append(store.put(pseudo_random(size, seed)))
        later()
    return keys


def present(store: Store, keys: list[str]) -> list[bool]:
    return [store.has(key) for key in keys]


def test_the_least_recently_used_entries_are_evicted_first(store: Store) -> None:
    store.set_max_bytes(3 * KIB)
    a, b, c = put_in_order(store, 0, 1, 2)
    store.get(a)  # a use: b is now the least recently used
    later()
    d = store.put(pseudo_random(KIB, 3))
    later()
    store.put(pseudo_random(KIB, 1))  # b again, the last used (another eviction: c goes now)
    store.evict()
    assert present(store, [a, b, c, d]) == [True, True, False, True]
    assert (store.stats().entries, store.stats().bytes, store.stats().max_bytes) == (3, 3 * KIB, 3 * KIB)


def test_a_put_of_a_present_entry_counts_as_a_use(store: Store) -> None:
    store.set_max_bytes(2 * KIB)
    a, b = put_in_order(store, 0, 1)
    assert store.put(pseudo_random(KIB, 0)) == a
    later()
    store.put(pseudo_random(KIB, 2))
    assert store.evict().bytes_left == 2 * KIB
    assert present(store, [a, b]) == [True, False]


def test_pins_keep_entries_until_every_owner_releases_them(store: Store) -> None:
    a, b, c = put_in_order(store, 0, 1, 2)
    pending = content_key(b"not put yet")
    store.pin("job:1", [a], ttl=60)
    store.pin("job:2", [a, pending], ttl=60)  # a key can be pinned before its put
    store.set_max_bytes(2 * KIB)
    freed = store.evict()
    assert present(store, [a, b, c]) == [True, False, True]  # b was the least recently used unpinned entry
    stats = store.stats()
    assert (stats.pinned_entries, stats.pinned_bytes, stats.pin_owners) == (1, KIB, ["job:1", "job:2"])
    assert freed == Eviction(1, KIB, 2 * KIB) and stats.bytes == 2 * KIB
    store.unpin("job:1")
    store.put(b"not put yet")
    store.evict()
    assert present(store, [a, c, pending]) == [True, False, True]  # job:2 still pins a
    store.unpin("job:2", [a])
    store.put(pseudo_random(KIB, 3))
    store.evict()
    assert store.has(pending) and not store.has(a)
    assert store.stats().pin_owners == ["job:2"]


def test_a_store_whose_entries_are_all_pinned_stays_above_its_cap(store: Store) -> None:
    store.set_max_bytes(KIB)
    keys = [content_key(pseudo_random(KIB, seed)) for seed in range(3)]
    store.pin("job:1", keys, ttl=60)
    put_in_order(store, 0, 1, 2)
    assert store.evict() == Eviction(0, 0, 3 * KIB)
    assert present(store, keys) == [True] * 3
    stats = store.stats()
    assert (stats.bytes, stats.pinned_entries, stats.pinned_bytes) == (3 * KIB, 3, 3 * KIB)


def test_a_pin_expires_after_its_ttl(store: Store) -> None:
    store.set_max_bytes(KIB)
    (a,) = put_in_order(store, 0)
    store.pin("job:1", [a], ttl=0.2)
    store.put(pseudo_random(KIB, 1))
    store.evict()
    assert store.has(a) and store.pin_owners() == ["job:1"]
    time.sleep(0.3)
    assert store.pin_owners() == []
    store.put(pseudo_random(KIB, 2))
    store.evict()
    assert not store.has(a)


def test_replacing_pins_keeps_only_the_new_keys(store: Store) -> None:
    a, b, c = put_in_order(store, 0, 1, 2)
    store.pin("job:1", [a, b], ttl=60)
    store.pin("job:1", [c], ttl=60, replace=True)
    store.set_max_bytes(KIB)
    store.evict()
    assert present(store, [a, b, c]) == [False, False, True]
    store.pin("job:1", [], ttl=60, replace=True)  # nothing left: the owner is gone
    assert store.pin_owners() == []


@pytest.mark.parametrize("owner", ["", "job 1", "x" * 101, "job/1"])
def test_malformed_pin_owners_are_refused(store: Store, owner: str) -> None:
    with pytest.raises(StoreError, match="pin owner"):
        store.pin(owner, [EMPTY_KEY], ttl=1)


def test_the_cap_is_published_in_the_store(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_STORE_MAX_BYTES", "5000")
    assert store.max_bytes == 5000  # nothing published: this process's setting
    store.set_max_bytes(7000)
    monkeypatch.setenv("FARM_STORE_MAX_BYTES", "9000")
    with open_store(store.url) as reopened:
        assert reopened.max_bytes == 7000 and reopened.stats().max_bytes == 7000
    with pytest.raises(StoreError, match="positive"):
        store.set_max_bytes(0)


def test_the_byte_count_stays_exact_through_deletes_and_corrupt_entries(store: Store) -> None:
    values = [pseudo_random(size, seed) for seed, size in enumerate([0, 1, 1000, 70_000, 3 * MIB])]
    keys = [store.put(value) for value in values + values]  # every value twice: counted once
    store.delete(keys[2])
    store.delete(keys[2])  # twice: nothing more to subtract
    store.delete(content_key(b"never put"))
    corrupt(store, keys[3])
    with pytest.raises(CorruptEntryError):
        store.get(keys[3])
    left = [values[0], values[1], values[4]]
    assert (store.stats().entries, store.stats().bytes) == (3, sum(len(value) for value in left))
    store.put(values[3])  # the rebuild of the corrupt one
    assert store.stats().bytes == sum(len(value) for value in left) + len(values[3])


# --- RedisStore's cap --------------------------------------------------------------------------------------------


def test_redis_a_put_makes_room_before_it_writes(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    store.set_max_bytes(3 * KIB)
    a, b, c = put_in_order(store, 0, 1, 2)
    d = store.put(pseudo_random(2 * KIB, 3))  # no evict call: the put evicts, a and b, before its chunks go in
    assert present(store, [a, b, c, d]) == [False, False, True, True]
    assert store.stats().bytes == 3 * KIB


def test_redis_evicting_an_entry_deletes_the_refs_that_point_at_it(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url)
    a, b = put_in_order(store, 0, 1)
    store.set_ref("kernel:x", a)
    store.set_ref("blob:y", a)
    store.set_ref("blob:z", b)
    store.set_ref("blob:y", b)  # moved on: evicting a must leave it
    store.set_max_bytes(KIB)
    store.evict()
    assert not store.has(a)
    assert (store.get_ref("kernel:x"), store.get_ref("blob:y"), store.get_ref("blob:z")) == (None, b, b)
    store.delete(b)
    assert (store.get_ref("blob:y"), store.get_ref("blob:z")) == (None, None)
    assert store.client.keys(f"{store.prefix}backrefs:*") == []


def test_redis_a_ref_anchored_to_another_entry_goes_with_that_entry(redis_server: RedisServer) -> None:
    """A packed weight's ref names bytes the store never holds: anchored to the weight it is made from, it goes when
    the weight is evicted, unless it was pointed elsewhere since."""
    store = RedisStore(redis_server.url)
    weight, other = put_in_order(store, 0, 1)
    store.set_ref("blob:packed", "e" * 64, anchor=weight)
    store.set_ref("blob:moved", "d" * 64, anchor=weight)
    store.set_ref("blob:moved", other)
    assert store.get_ref("blob:packed") == "e" * 64 and not store.has("e" * 64)
    store.delete(weight)
    assert (store.get_ref("blob:packed"), store.get_ref("blob:moved")) == (None, other)
    with pytest.raises(StoreError):
        store.set_ref("blob:x", "e" * 64, anchor="../etc")


def test_redis_counts_entries_an_older_farm_wrote(redis_server: RedisServer) -> None:
    """Entries written before the store had a cap (no count, no last use) are adopted as the least recently used:
    by gc all at once, or by their next use."""
    store = RedisStore(redis_server.url)
    old = [pseudo_random(KIB, seed) for seed in range(3)]
    for value in old:
        store.client.set(store.chunk_key(content_key(value), 0), value)
        store.client.set(store.header_key(content_key(value)), f"{KIB}:1")
    fresh = store.put(b"new")
    assert (store.stats().entries, store.stats().bytes) == (1, 3)
    assert store.get(content_key(old[0])) == old[0]  # a use counts it
    assert store.adopt_unaccounted() == 2 and store.adopt_unaccounted() == 0
    assert (store.stats().entries, store.stats().bytes) == (4, 3 * KIB + 3)
    store.set_max_bytes(KIB + 3)
    store.evict()
    assert present(store, [content_key(value) for value in old] + [fresh]) == [True, False, False, True]


def test_redis_concurrent_puts_gets_and_deletes_keep_the_count_exact(redis_server: RedisServer) -> None:
    """Four threads put, read and delete overlapping values under a cap that keeps evicting: afterwards the count
    equals the entries there are, to the byte."""
    store = RedisStore(redis_server.url, chunk_bytes=4 * KIB)
    store.set_max_bytes(64 * KIB)
    values = [pseudo_random(1000 + 997 * seed, seed) for seed in range(40)]
    errors: list[BaseException] = []

    def churn(offset: int) -> None:
        try:
            for step in range(120):
                value = values[(step * 7 + offset) % len(values)]
                key = store.put(value)
                if step % 5 == 0:
                    store.delete(key)
                with contextlib.suppress(MissingEntryError):  # evicted or deleted by another thread meanwhile
                    assert store.get(key) == value
        except BaseException as exc:  # noqa: B036 -- reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(offset,)) for offset in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    headers = {
        key: int(store.client.get(store.header_key(key)).split(b":")[0])
        for key in map(content_key, values)
        if store.has(key)
    }
    sizes = {key.decode(): int(size) for key, size in store.client.hgetall(f"{store.prefix}sizes").items()}
    assert sizes == headers and store.stats().bytes == sum(headers.values()) <= 64 * KIB
    assert store.client.zcard(f"{store.prefix}lru") == len(headers)


def test_redis_an_entry_evicted_while_it_is_read_is_missing_not_corrupt(redis_server: RedisServer) -> None:
    class EvictedMidRead(RedisStore):
        """Deletes the entry, as another process's eviction would, just before its second chunk is read."""

        reading = False

        def chunk_key(self, key: str, index: int) -> str:
            if self.reading and index == 1:
                RedisStore(self.url).delete(key)
            return super().chunk_key(key, index)

    store = EvictedMidRead(redis_server.url, chunk_bytes=KIB)
    key = store.put(pseudo_random(3 * KIB))
    store.reading = True
    with pytest.raises(MissingEntryError, match="evicted or deleted while being read"):
        store.get(key)


def test_redis_staged_bytes_enter_the_store_only_when_admitted_whole_and_matching(redis_server: RedisServer) -> None:
    """What a submitter uploads (RedisStore.stage) waits beside the store with a time to live; a worker's admit
    checks it against its key, puts it and drops it from staging."""
    from farm import defaults

    store = RedisStore(redis_server.url, chunk_bytes=KIB)
    data = pseudo_random(3 * KIB)
    key = store.stage(data)
    raw = redis_server.client()
    assert not store.has(key) and 0 < raw.ttl(store.staged_key(key)) <= defaults.STAGED_TTL_SECONDS
    assert store.admit(key) and store.get(key) == data
    assert raw.keys(f"{store.prefix}staged:*") == []
    assert store.admit(key) and raw.keys(f"{store.prefix}staged:*") == []  # in the store: nothing staged to admit

    other = store.stage(pseudo_random(3 * KIB, seed=1))
    raw.set(f"{store.staged_key(other)}:1", b"x" * KIB)  # swapped bytes under the same key
    assert not store.admit(other) and not store.has(other) and raw.keys(f"{store.prefix}staged:*") == []


def test_redis_a_streamed_upload_is_admitted_by_renaming_its_chunks_not_by_a_second_copy(
    redis_server: RedisServer,
) -> None:
    """A submitter's weight is staged a piece at a time (stage_stream); the worker that reads it first checks its
    sha256 and renames its chunks into the entry: Redis receives no byte of it again and never holds it twice."""
    store = RedisStore(redis_server.url, chunk_bytes=64 * KIB)
    data = pseudo_random(320 * KIB + 7)
    key = content_key(data)
    store.stage_stream(key, len(data), (data[start : start + 7000] for start in range(0, len(data), 7000)))
    raw = redis_server.client()
    assert store.missing([key, content_key(b"other")]) == [key, content_key(b"other")]
    assert len(raw.keys(f"{store.prefix}staged:*")) == 1 + 6  # the header and six chunks of at most 64 KiB
    received = raw.info("stats")["total_net_input_bytes"]
    assert store.take_staged(key) == data
    assert raw.info("stats")["total_net_input_bytes"] - received < 16 * KIB  # commands and scripts, no chunk
    assert raw.keys(f"{store.prefix}staged:*") == [] and store.missing([key]) == []
    assert raw.ttl(store.chunk_key(key, 0)) == -1 and store.stats().bytes == len(data)  # persisted, counted
    assert store.get(key) == data and store.take_staged(key) == data  # the entry, once it is one


def test_redis_staged_bytes_that_are_not_their_key_are_dropped_not_admitted(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, chunk_bytes=KIB)
    data = pseudo_random(3 * KIB)
    store.stage_stream(content_key(b"something else"), len(data), [data])
    assert store.take_staged(content_key(b"something else")) is None
    assert redis_server.client().keys(f"{store.prefix}staged:*") == [] and store.stats().entries == 0
    with pytest.raises(StoreError, match="2 bytes came, not 3"):
        store.stage_stream(content_key(b"abc"), 3, [b"ab"])


def test_redis_staged_chunks_bigger_than_their_header_says_are_refused_before_they_are_read(
    redis_server: RedisServer,
) -> None:
    """Issue 30's third attack: three chunks of 256 MB staged under the header `1:3` were joined in the worker
    (143 MB -> 1.35 GB) before their size was checked. Their lengths are checked first (STRLEN), so the worker
    reads nothing of them, and a header naming more than the store's cap is refused at once."""
    store = RedisStore(redis_server.url, chunk_bytes=KIB)
    raw = redis_server.client()
    key = content_key(b"x")
    raw.set(store.staged_key(key), b"1:3")
    for index in range(3):
        raw.set(f"{store.staged_key(key)}:{index}", b"\0" * MIB)
    sent = raw.info("stats")["total_net_output_bytes"]
    assert store.take_staged(key) is None
    assert raw.info("stats")["total_net_output_bytes"] - sent < 16 * KIB  # no chunk left Redis
    assert raw.keys(f"{store.prefix}staged:*") == []
    store.set_max_bytes(MIB)
    raw.set(store.staged_key(key), f"{2 * MIB}:1".encode())
    raw.set(f"{store.staged_key(key)}:0", b"\0" * KIB)
    with pytest.raises(CorruptEntryError, match="over the store's cap"):
        store._read_staged(key)


def test_redis_each_teams_staging_is_trimmed_to_its_quota_oldest_first(redis_server: RedisServer) -> None:
    """A team's uploads are staged under its name (for_team), so the workers can count them: trim_staging drops a
    team's oldest uploads past the quota, leaves the other teams' alone, and gives every staged key a time to
    live."""
    from farm import defaults

    store = RedisStore(redis_server.url, chunk_bytes=KIB)
    vision, raw = store.for_team("vision"), redis_server.client()
    uploads = [vision.stage(pseudo_random(4 * KIB, seed=seed)) for seed in range(3)]
    for age, key in enumerate(uploads):  # the first is the oldest: the least time to live left
        for name in raw.keys(f"{vision.staged_key(key)}*"):
            raw.expire(name, 1000 + age)
    default = store.stage(pseudo_random(4 * KIB, seed=7))
    raw.set(f"{store.staged_key(content_key(b'x'))}", b"1:1")  # a submitter's key without a time to live
    size = 4 * KIB + len(b"4096:4")
    assert store.trim_staging(quota=2 * size + 10) == {"vision": size}
    assert vision.staged(uploads) == uploads[1:] and store.staged([default]) == [default]
    assert vision.staged([default]) == [] and store.staged(uploads) == []  # each team stages apart
    assert all(0 < raw.ttl(name) <= defaults.STAGED_TTL_SECONDS for name in raw.keys(f"{store.prefix}staged:*"))
    assert vision.take_staged(uploads[1]) == pseudo_random(4 * KIB, seed=1)


def test_file_store_stages_and_admits_through_put(tmp_path: Path) -> None:
    """Where every writer is trusted (the local store) staging is the store itself."""
    store = FileStore(tmp_path)
    store.stage_stream(content_key(b"abcdef"), 6, [b"abc", b"def"])
    assert store.missing([content_key(b"abcdef"), content_key(b"x")]) == [content_key(b"x")]
    assert store.take_staged(content_key(b"abcdef")) == b"abcdef" and store.take_staged(content_key(b"x")) is None
    with pytest.raises(StoreError, match="not the 3 bytes"):
        store.stage_stream(content_key(b"xyz"), 3, [b"abc"])


def test_redis_peek_neither_marks_use_nor_deletes_a_corrupt_entry(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, chunk_bytes=KIB)
    key = store.put(pseudo_random(2 * KIB))
    assert store.peek(key) == pseudo_random(2 * KIB)
    redis_server.client().set(store.chunk_key(key, 0), b"y" * KIB)
    with pytest.raises(CorruptEntryError):
        store.peek(key)
    assert store.has(key)  # left for a worker, whose get deletes it
    with pytest.raises(CorruptEntryError):
        store.get(key)
    assert not store.has(key)


# --- FileStore ---------------------------------------------------------------------------------------------------


def test_file_store_layout(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    key = store.put(b"layout")
    assert (tmp_path / "objects" / key[:2] / key).read_bytes() == b"layout"
    store.set_ref("kernel:abc", key)
    ref_file = tmp_path / "refs" / hashlib.sha256(b"kernel:abc").hexdigest()
    assert ref_file.read_text() == key


def test_file_store_truncated_entry_is_corrupt(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    key = store.put(b"0123456789")
    store.object_path(key).write_bytes(b"01234")
    with pytest.raises(CorruptEntryError):
        store.get(key)
    assert not store.object_path(key).exists()


def test_file_store_zero_length_file_is_not_an_entry(tmp_path: Path) -> None:
    """A crash right after a rename can leave an empty file; has() must say no so that put writes it again."""
    store = FileStore(tmp_path)
    key = content_key(b"contents")
    path = store.object_path(key)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert not store.has(key)
    assert store.put(b"contents") == key
    assert store.get(key) == b"contents"


def test_file_store_ref_that_holds_no_key_is_a_miss(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.ref_path("kernel:x").parent.mkdir(parents=True)
    store.ref_path("kernel:x").write_text("half-writ")
    assert store.get_ref("kernel:x") is None


# --- RedisStore --------------------------------------------------------------------------------------------------


def _corrupt_by(change: str, store: RedisStore, key: str) -> None:
    """Damage a three-chunk Redis entry in one of the ways a bad write, eviction or hand edit would."""
    client = store.client
    if change == "flip a byte in chunk 2":
        first = client.getrange(store.chunk_key(key, 2), 0, 0)[0]
        client.setrange(store.chunk_key(key, 2), 0, bytes([first ^ 0xFF]))
    elif change == "drop chunk 1":
        client.delete(store.chunk_key(key, 1))
    elif change == "truncate the last chunk":
        client.set(store.chunk_key(key, 2), b"")
    elif change == "garble the header":
        client.set(store.header_key(key), b"not a header")
    else:
        raise AssertionError(change)


@pytest.mark.parametrize(
    "change", ["flip a byte in chunk 2", "drop chunk 1", "truncate the last chunk", "garble the header"]
)
def test_redis_damaged_entry_is_corrupt_and_fully_deleted(redis_server: RedisServer, change: str) -> None:
    store = RedisStore(redis_server.url, chunk_bytes=1000)
    value = pseudo_random(2500)
    key = store.put(value)
    assert store.client.get(store.header_key(key)) == b"2500:3"
    _corrupt_by(change, store, key)
    with pytest.raises(CorruptEntryError, match=key):
        store.get(key)
    assert store.client.keys(f"{store.prefix}obj:*") == []  # header and every chunk gone
    assert (store.stats().entries, store.stats().bytes) == (0, 0)  # and no longer counted
    assert store.put(value) == key and store.get(key) == value


def test_incomplete_names_absent_entries_without_reading_any_and_marks_the_whole_ones_used(store: Store) -> None:
    store.set_max_bytes(2 * KIB)
    a, b = put_in_order(store, 0, 1)
    absent = content_key(b"never put")
    assert store.incomplete([a, absent, b]) == [absent] and store.incomplete([]) == []
    later()
    store.incomplete([a])  # a use: b is now the least recently used
    later()
    store.put(pseudo_random(KIB, 2))
    store.evict()
    assert present(store, [a, b]) == [True, False]


@pytest.mark.parametrize("change", ["drop chunk 1", "truncate the last chunk", "garble the header"])
def test_redis_incomplete_judges_an_entry_by_the_lengths_of_its_chunks(redis_server: RedisServer, change: str) -> None:
    """A reuse's check (recipes.intact): a chunk gone or of another length is found without reading the bytes; a
    flipped byte is the download's to find (its sha256 check, farm.distributed.redis_keys.REPAIR_KEY)."""
    store = RedisStore(redis_server.url, chunk_bytes=1000)
    damaged, whole = store.put(pseudo_random(2500)), store.put(pseudo_random(2500, seed=1))
    _corrupt_by(change, store, damaged)
    reads = store.client.info("commandstats").get("cmdstat_get", {}).get("calls", 0)
    assert store.incomplete([damaged, whole]) == [damaged]
    assert store.client.info("commandstats")["cmdstat_get"]["calls"] == reads + 2  # the two headers, no chunk


def test_redis_incomplete_checks_the_size_of_a_blob_store_file(redis_server: RedisServer, tmp_path: Path) -> None:
    blobs = FileStore(tmp_path / "cas")
    store = RedisStore(redis_server.url, blobs=blobs)
    truncated, gone, whole = (store.put(pseudo_random(KIB, seed)) for seed in range(3))
    blobs.object_path(truncated).write_bytes(b"short")
    blobs.delete(gone)
    assert store.incomplete([truncated, gone, whole]) == [truncated, gone]


def test_redis_delete_sweeps_chunks_of_a_put_that_died(redis_server: RedisServer) -> None:
    """A worker killed mid-put leaves chunks without a header; delete must collect them."""
    store = RedisStore(redis_server.url, chunk_bytes=4)
    key = content_key(b"0123456789")
    for index, chunk in enumerate([b"0123", b"4567"]):
        store.client.set(store.chunk_key(key, index), chunk)
    assert not store.has(key)
    store.delete(key)
    assert store.client.keys("*") == []


def test_redis_prefixes_keep_stores_apart(redis_server: RedisServer) -> None:
    first, second = RedisStore(redis_server.url, prefix="a:"), RedisStore(redis_server.url, prefix="b:")
    key = first.put(b"only in a")
    first.set_ref("r", key)
    assert not second.has(key) and second.get_ref("r") is None
    assert all(name.startswith(b"a:") for name in first.client.keys("*"))


def test_redis_with_password(redis_servers: Callable[..., RedisServer]) -> None:
    server = redis_servers(password="s3cret")
    store = open_store(server.url)
    key = store.put(b"behind a password")
    assert open_store(store.url).get(key) == b"behind a password"
    wrong = RedisStore(server.url.replace("s3cret", "guess"))
    with pytest.raises(StoreUnreachableError) as caught:
        wrong.has(key)
    assert "guess" not in str(caught.value) and str(server.port) in str(caught.value)
    assert str(caught.value).endswith("refused the connection: the URL has a wrong password (or user)")
    with pytest.raises(StoreUnreachableError, match="the URL lacks the password the server requires$"):
        RedisStore(server.url.replace(":s3cret@", "")).has(key)


def test_unreachable_redis_fails_fast_without_leaking_the_password() -> None:
    port = free_port()
    store = RedisStore(f"redis://:hunter2@127.0.0.1:{port}/0")  # constructing doesn't connect
    key = content_key(b"x")
    operations: list[Callable[[], object]] = [
        lambda: store.put(b"x"), lambda: store.get(key), lambda: store.has(key), lambda: store.delete(key),
        lambda: store.set_ref("r", key), lambda: store.get_ref("r"), lambda: store.delete_ref("r"),
    ]  # fmt: skip
    for operation in operations:
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError) as caught:
            operation()
        assert time.monotonic() - started < 5
        message = str(caught.value)
        assert f"127.0.0.1:{port}" in message and "hunter2" not in message and "***" in message
        assert caught.value.exit_status == ExitStatus.UNREACHABLE == 4


def test_redis_silent_server_times_out_once() -> None:
    """A port that accepts but never answers (not Redis, or hung) fails after one socket timeout, not a retry loop."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        store = RedisStore(f"redis://127.0.0.1:{listener.getsockname()[1]}/0", socket_timeout=1)
        started = time.monotonic()
        with pytest.raises(StoreUnreachableError, match="Timeout"):
            store.has(EMPTY_KEY)
        assert time.monotonic() - started < 3


def test_redis_restart_keeps_data_and_the_store_reconnects(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, chunk_bytes=MIB)
    value = pseudo_random(3 * MIB)
    key = store.put(value)
    store.set_ref("artifact", key)
    redis_server.restart()
    assert store.get(key) == value  # the same store object: its pooled connections went stale
    assert store.get_ref("artifact") == key


def test_redis_killed_server_loses_no_acknowledged_write(redis_server: RedisServer) -> None:
    """SIGKILL, then restart from the append-only file (fsync always): every acknowledged put is back."""
    store = RedisStore(redis_server.url)
    key = store.put(b"survives a crash")
    redis_server.kill()
    with pytest.raises(StoreUnreachableError):
        store.get(key)
    redis_server.restart()
    assert store.get(key) == b"survives a crash"


# --- choosing a store --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("redis://127.0.0.1:1/0", RedisStore),
        ("rediss://user:pw@example.invalid:6380/2", RedisStore),
        ("file:///tmp/farm-store", FileStore),
        ("/tmp/farm-store", FileStore),
        ("relative/store", FileStore),
        (Path("/tmp/farm-store"), FileStore),
    ],
)
def test_open_store_dispatches_on_the_url(url: str | os.PathLike[str], kind: type[Store]) -> None:
    assert type(open_store(url)) is kind


def test_open_store_file_urls_and_paths(tmp_path: Path) -> None:
    assert open_store(f"file://{tmp_path}").root == tmp_path  # type: ignore[attr-defined]
    assert open_store(str(tmp_path)).url == f"file://{tmp_path}"
    assert open_store(tmp_path).url == f"file://{tmp_path}"


@pytest.mark.parametrize("url", ["s3://bucket/key", "http://host/store", "file://"])
def test_open_store_refuses_unknown_urls(url: str) -> None:
    with pytest.raises(BadStoreUrlError) as caught:
        open_store(url)
    assert caught.value.exit_status == ExitStatus.BAD_INPUT


def test_default_store_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path / "cache"))
    assert default_store_root() == tmp_path / "cache" / "store"
    monkeypatch.delenv("FARM_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_store_root() == tmp_path / "home" / ".cache" / "farm" / "store"


def test_store_error_exit_statuses() -> None:
    assert StoreError("x").exit_status == ExitStatus.BUILD_FAILED
    assert CorruptEntryError(EMPTY_KEY, "why").exit_status == ExitStatus.BUILD_FAILED
    assert MissingEntryError(EMPTY_KEY).exit_status == ExitStatus.BUILD_FAILED
    assert StoreUnreachableError("x").exit_status == ExitStatus.UNREACHABLE


def test_redis_with_a_file_blob_store_keeps_bytes_in_files_and_everything_else_in_redis(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """FARM_BLOB_STORE=file://...: the header, the count, refs and pins stay in Redis, the bytes are files of a
    shared folder; the cap, LRU eviction and deletes hold the same, and the files go with their entries."""
    blobs = FileStore(tmp_path / "cas")
    store = RedisStore(redis_server.url, chunk_bytes=KIB, blobs=blobs)
    store.set_max_bytes(10 * KIB)
    raw = redis_server.client()
    first, second = pseudo_random(4 * KIB, seed=1), pseudo_random(4 * KIB, seed=2)
    keys = [store.put(first), store.put(second)]
    assert raw.get(store.header_key(keys[0])) == f"{4 * KIB}:file".encode() and not raw.exists(
        store.chunk_key(keys[0], 0)
    )
    assert store.get(keys[0]) == first and blobs.has(keys[0]) and store.stats().bytes == 8 * KIB
    store.put(pseudo_random(4 * KIB, seed=3))  # over the cap: the least recently used goes, file and all
    assert not store.has(keys[1]) and not blobs.has(keys[1]) and store.stats().bytes == 8 * KIB
    store.delete(keys[0])
    assert not blobs.has(keys[0]) and store.stats().entries == 1

    staged = pseudo_random(3 * KIB, seed=4)
    store.stage_stream(content_key(staged), len(staged), [staged])
    assert store.take_staged(content_key(staged)) == staged and blobs.has(content_key(staged))
    assert raw.keys(f"{store.prefix}staged:*") == []

    lost = store.put(pseudo_random(KIB, seed=5))
    blobs.delete(lost)
    with pytest.raises(CorruptEntryError, match="its bytes in the blob store .* are missing"):
        store.get(lost)
    assert not store.has(lost)  # repaired: the next build puts it again


def test_redis_with_a_blob_redis_keeps_bytes_and_staging_there_and_the_metadata_here(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """FARM_BLOB_STORE=redis://...: a Redis of its own (a cache, without persistence) holds the entries' chunks
    and the submitters' staged uploads; the durable Redis holds the headers, the count, the LRU, refs and pins,
    and its cap rules both. Staged bytes are admitted by renaming their chunks there (never a second copy)."""
    durable, cache = redis_servers(), redis_servers()
    blobs = blob_redis(cache.url)
    store = RedisStore(durable.url, chunk_bytes=KIB, blobs=blobs)
    store.set_max_bytes(10 * KIB)
    first, second = pseudo_random(4 * KIB, seed=1), pseudo_random(4 * KIB, seed=2)
    keys = [store.put(first), store.put(second)]
    assert durable.client().get(store.header_key(keys[0])) == f"{4 * KIB}:file".encode()
    assert durable.client().keys(f"{store.prefix}obj:*:*") == [] and blobs.has(keys[0])
    assert store.get(keys[0]) == first and store.stats().bytes == 8 * KIB
    store.put(pseudo_random(4 * KIB, seed=3))  # over the durable Redis' cap: the LRU entry goes from both
    assert not store.has(keys[1]) and not blobs.has(keys[1]) and store.stats().bytes == 8 * KIB

    warm_up, staged = pseudo_random(KIB, seed=5), pseudo_random(3 * KIB, seed=4)
    key = content_key(staged)
    store.stage_stream(key, len(staged), [staged])
    assert durable.client().keys(f"{store.prefix}staged:*") == [] and store.staged([key]) == [key]
    store.stage(warm_up)
    store.take_staged(content_key(warm_up))  # the scripts' sources travel once
    written = cache.client().info("stats")["total_net_input_bytes"]
    assert store.take_staged(key) == staged and blobs.has(key) and store.has(key)
    assert cache.client().info("stats")["total_net_input_bytes"] - written < len(staged)  # renamed, not rewritten
    assert cache.client().keys(f"{store.prefix}staged:*") == []


def test_what_a_blob_redis_lost_is_missing_uploaded_again_and_never_read_as_whole(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """A blob Redis is a cache: after a restart without persistence its entries are gone while the durable
    Redis' headers remain. Such entries count as missing (the client uploads them again) and incomplete (no reuse
    of an artifact), and a read repairs the header instead of failing forever."""
    durable, cache = redis_servers(), redis_servers()
    store = RedisStore(durable.url, blobs=blob_redis(cache.url))
    kept, lost = store.put(b"kept"), store.put(b"lost in a restart")
    cache.client().delete(*cache.client().keys(f"{store.prefix}obj:{lost}*"))
    assert store.missing([kept, lost]) == [lost] and store.incomplete([kept, lost]) == [lost]
    with pytest.raises(CorruptEntryError, match="its bytes in the blob store redis://.* are missing"):
        store.get(lost)
    assert not store.has(lost)
    store.stage(b"lost in a restart")
    assert store.take_staged(lost) == b"lost in a restart" and store.get(lost) == b"lost in a restart"
    cache.client().flushall()
    assert store.put(b"kept") == kept and store.get(kept) == b"kept"  # a put that finds the header restores


def test_a_client_logs_in_to_the_published_blob_redis_as_it_logs_in_to_the_farm(
    redis_servers: Callable[..., RedisServer],
) -> None:
    """Workers publish the blob Redis without their credentials; a client (a submitter, the operator's `farm
    store`) opens it with the user and password of its own URL, to stage, find what is missing and download."""
    durable, cache = redis_servers(password="farm-secret"), redis_servers(password="farm-secret")
    worker = RedisStore(durable.url, blobs=blob_redis(cache.url))
    member = worker.put(b"an artifact member")
    worker.publish_blob_store()
    published = durable.client().get(f"{worker.prefix}blob_store").decode()
    assert "farm-secret" not in published and published.endswith(f":{cache.port}/0")
    client = RedisStore(durable.url)
    assert client.peek(member) == b"an artifact member" and not client.streams_uploads()  # admitted by a rename
    client.stage(b"a weight")
    assert cache.client().exists(f"{worker.prefix}staged:{content_key(b'a weight')}")
    assert client.missing([member, content_key(b"a weight")]) == [content_key(b"a weight")]
    assert worker.take_staged(content_key(b"a weight")) == b"a weight"
    worker.publish_blob_store("redis://farm-worker:farm-secret@farm-host:6380/0")  # FARM_BLOB_STORE_CLIENT_URL
    assert durable.client().get(f"{worker.prefix}blob_store") == b"redis://farm-host:6380/0"


def test_the_published_blob_redis_carries_no_login_and_a_client_adds_its_own() -> None:
    assert without_login("redis://farm-worker:secret@blobs:6379/0") == "redis://blobs:6379/0"
    assert without_login("file:///mnt/farm-cas") == "file:///mnt/farm-cas"
    own = "rediss://farm-submitter:pw@farm-host:6379/0?ssl_ca_certs=/etc/farm/ca.pem"
    assert with_login_of("rediss://farm-host:6380/0", own) == (
        "rediss://farm-submitter:pw@farm-host:6380/0?ssl_ca_certs=/etc/farm/ca.pem"
    )
    assert with_login_of("redis://farm-host:6380/0", own) == "redis://farm-submitter:pw@farm-host:6380/0"
    assert with_login_of("redis://farm-host:6380/0", "redis://farm-host:6379/0") == "redis://farm-host:6380/0"


def test_blob_redis_entries_no_header_owns_are_swept_once_an_hour_old(
    redis_servers: Callable[..., RedisServer],
) -> None:
    durable, cache = redis_servers(), redis_servers()
    blobs = blob_redis(cache.url)
    store = RedisStore(durable.url, blobs=blobs)
    kept, orphan = store.put(b"an entry"), blobs.put(b"a put that died before its header")
    assert store.sweep_orphans() == 0  # young: it may be a put in flight
    assert store.sweep_orphans(older_than=-1) == 1
    assert blobs.has(kept) and not blobs.has(orphan)


def test_a_client_reads_the_blob_store_the_workers_published_or_says_what_to_mount(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    worker = RedisStore(redis_server.url, blobs=FileStore(tmp_path / "cas"))
    key = worker.put(b"an artifact member")
    client = RedisStore(redis_server.url)
    with pytest.raises(StoreError, match="a blob store it did not publish"):
        client.peek(key)
    worker.publish_blob_store()
    assert RedisStore(redis_server.url).peek(key) == b"an artifact member"
    redis_server.client().set(f"{worker.prefix}blob_store", "file:///nowhere/farm-cas")
    with pytest.raises(StoreError, match="file:///nowhere/farm-cas, which this machine can't read: mount it"):
        RedisStore(redis_server.url).peek(key)


def test_files_no_entry_owns_are_swept_once_an_hour_old(redis_server: RedisServer, tmp_path: Path) -> None:
    """A process killed between an eviction's script and its unlink leaves a file without a header: `farm store
    gc` (sweep_orphans) deletes it, but never a file young enough to be a put in flight."""
    import os
    import time

    blobs = FileStore(tmp_path / "cas")
    store = RedisStore(redis_server.url, blobs=blobs)
    kept = store.put(b"an entry")
    orphan, young = blobs.put(b"a dropped entry's file"), blobs.put(b"a put in flight")
    old = time.time() - 7200
    for key in (kept, orphan):
        os.utime(blobs.object_path(key), (old, old))
    assert store.sweep_orphans() == 1
    assert blobs.has(kept) and not blobs.has(orphan) and blobs.has(young)
    assert RedisStore(redis_server.url).sweep_orphans() == 0  # bytes as chunks: nothing to sweep
