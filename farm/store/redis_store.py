"""RedisStore: entries in Redis, values split into chunks so that no single command carries a big value, kept
under a byte cap by evicting the least recently used entries that no pin holds. This module holds its entries'
reads and writes, its refs and where its blob store is; it inherits its staging area (farm.store.redis_staging,
which also weighs and checks what is staged) and its cap, eviction and pins (farm.store.redis_cap). Its atomic steps
are the Lua scripts of farm.store.redis_scripts, and farm.store.redis_connection packs its commands, logs clients in
to a published blob Redis and names its errors."""

from __future__ import annotations

import functools
import hashlib
import io
import os
from collections.abc import Callable, Iterable
from typing import NoReturn

from farm.errors import redact_url
from farm.store import redis_scripts
from farm.store.base import (
    REDIS_SCHEMES,
    BadStoreUrlError,
    CorruptEntryError,
    Data,
    MissingEntryError,
    StoreError,
    as_bytes_view,
    check_key,
    is_key,
)
from farm.store.file_store import FILE_SCHEME, FileStore
from farm.store.lua import LuaScript
from farm.store.redis_connection import (
    get_bytes,
    store_errors,
    with_login_of,
    without_login,
    zero_copy_packer,
)
from farm.store.redis_staging import RedisStaging

FILE_CHUNKS = "file"
"""The chunk count in the header of an entry whose bytes live in the blob store (FARM_BLOB_STORE: a folder, or a
Redis of their own; the word is from when the blob store was a folder, and headers farms wrote then still read)."""
UNCAPPED = 1 << 62
"""The cap of a blob Redis: its entries come and go with the durable Redis' headers, whose cap rules them both."""
CHUNK_BYTES = (8 << 20) - 4096
"""8 MiB less a page: Redis allocates a value with its header through jemalloc, whose size classes above 8 MiB are
2 MiB apart, so a chunk of exactly 8 MiB took a 10 MiB allocation and Redis used 30% more memory than the store
held (measured: 130 MiB of used memory for a 100 MiB entry, 101 MiB with this size)."""
SOCKET_READ_BYTES = 1 << 20
"""What one read from the socket takes (redis-py's default is 64 KiB): a chunk of 8 MiB arrives in 8 reads, not 128,
each a system call and a copy into hiredis' reader."""
PUT_ATTEMPTS = 3
"""Writes of one put's chunks before it gives up, when concurrent deletes of the same key keep sweeping them."""


class RedisStore(RedisStaging):
    """Entries in Redis: chunks `{prefix}obj:{key}:{i}`, then a header `{prefix}obj:{key}` = "size:chunks".

    The header is written last and deleted first, so a reader that finds it finds every chunk (barring a concurrent
    delete or an eviction, which the hash check on every read catches). Each chunk travels in its own command, so
    neither side ever holds a big value in one request buffer. Refs are plain string keys `{prefix}ref:{name}`.

    The cap: `{prefix}sizes` (a hash: key -> bytes), `{prefix}bytes` (their sum) and `{prefix}lru` (a sorted set:
    key -> last use, in Redis' milliseconds) are updated by Lua scripts together with the header, so the count
    is exact whoever writes or deletes. A put that takes the bytes above the cap (`{prefix}max_bytes`, published
    by the workers, else FARM_STORE_MAX_BYTES) evicts least recently used entries that no pin holds. Pins are
    sets `{prefix}pin:{owner}` with a TTL, listed in `{prefix}pins` (a sorted set: owner -> expiry); refs that
    point at an entry are listed in `{prefix}backrefs:{key}` and deleted with it (a packed weight's ref, whose key
    the store never holds, with the weight it is made from: `set_ref(..., anchor)`).

    The connection is lazy (a worker may start before Redis does); timeouts are short and retries few, so an
    unreachable server is reported as StoreUnreachableError within seconds rather than hanging a build.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "farm:store:",
        chunk_bytes: int = CHUNK_BYTES,
        *,
        connect_timeout: float = 3.0,
        socket_timeout: float = 10.0,
        retries: int = 1,
        blobs: FileStore | RedisStore | None = None,
        default_cap: int | None = None,
        looks_for_blobs: bool = True,
    ) -> None:
        """`blobs`: where entries' bytes live when they are not chunks in this Redis (FARM_BLOB_STORE: a FileStore
        on a shared file system, or a RedisStore of a Redis of their own, where submitters stage too); the header,
        the count, refs and pins stay here either way. `default_cap`: the cap when none is published here
        (FARM_STORE_MAX_BYTES; a blob Redis' is UNCAPPED). `looks_for_blobs`: without `blobs`, whether to look
        once for a blob store the workers published (a client's view; a blob Redis has none of its own)."""
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.retry import Retry

        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._url, self.prefix, self.chunk_bytes, self.default_cap = url, prefix, chunk_bytes, default_cap
        self.blobs: FileStore | RedisStore | None = blobs
        self.team = ""
        """The team of submitters whose staging area this view reads and writes (for_team)."""
        self._looked_for_blobs = blobs is not None or not looks_for_blobs
        self._unreadable_blobs: str | None = None
        try:
            self.client = redis.Redis.from_url(
                url,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                command_packer=zero_copy_packer(),
                socket_read_size=SOCKET_READ_BYTES,
                # Retry lost connections only (a restarted server, a stale pooled socket): every operation here is
                # idempotent, but retrying a timeout would just double the wait on a server that doesn't answer.
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.1), retries, supported_errors=(RedisConnectionError,)),
            )
        except ValueError as exc:  # redis-py's answer to a malformed URL
            raise BadStoreUrlError(f"bad Redis URL {redact_url(url)}: {exc}") from exc
        script = functools.partial(LuaScript, self.client)
        self._touch, self._commit = script(redis_scripts.TOUCH), script(redis_scripts.COMMIT)
        self._drop, self._evict = script(redis_scripts.DROP), script(redis_scripts.EVICT)
        self._pin, self._unpin = script(redis_scripts.PIN), script(redis_scripts.UNPIN)
        self._owners, self._stats = script(redis_scripts.OWNERS), script(redis_scripts.STATS)
        self._set_ref, self._adopt = script(redis_scripts.SET_REF), script(redis_scripts.ADOPT)
        self._promote, self._whole = script(redis_scripts.PROMOTE), script(redis_scripts.WHOLE)

    @property
    def url(self) -> str:
        return self._url

    def header_key(self, key: str) -> str:
        """The Redis key of the entry's header; its presence is what makes an entry exist."""
        return f"{self.prefix}obj:{check_key(key)}"

    def chunk_key(self, key: str, index: int) -> str:
        """The Redis key of chunk `index` of the entry `key`."""
        return f"{self.prefix}obj:{check_key(key)}:{index}"

    def ref_key(self, name: str) -> str:
        """The Redis key of the ref `name` (Redis keys are binary-safe, so any name will do)."""
        return f"{self.prefix}ref:{name}"

    def put(self, data: Data, key: str | None = None) -> str:
        """Write the entry (or, when it is there, mark it used). Eviction first makes room for it when it wouldn't
        fit (so Redis never holds the new bytes on top of a full store), and runs again if concurrent puts took
        the bytes above the cap meanwhile."""
        view = as_bytes_view(data)
        key = key or hashlib.sha256(view).hexdigest()
        with store_errors(self.url):
            present, total, cap = redis_scripts.flag_bytes_cap(self._script(self._touch, check_key(key)))
        if present:
            self._restore_lost_blob(key, view)
            return key
        if int(total) + len(view) > int(cap):
            self._evict_to(room=len(view))
        with store_errors(self.url):
            for _ in range(PUT_ATTEMPTS):
                count = self._write_bytes(key, view)
                committed, total, cap = redis_scripts.flag_bytes_cap(self._script(self._commit, key, len(view), count))
                if committed:
                    break
            else:
                raise StoreError(f"store entry {key} lost its chunks to concurrent deletes {PUT_ATTEMPTS} times")
        if int(total) > int(cap):
            self.evict()
        return key

    def _restore_lost_blob(self, key: str, view: memoryview) -> None:
        """Write the bytes of an entry whose header is here again when the blob store lost them (a blob Redis is a
        cache: a restart empties it), so that a put always leaves the entry whole."""
        if self.blobs is None:
            return
        with store_errors(self.url):
            header = get_bytes(self.client, self.header_key(key))
        if header is not None and header.endswith(f":{FILE_CHUNKS}".encode()) and self.blobs.lacking({key: len(view)}):
            self.blobs.put(view, key)

    def _write_bytes(self, key: str, view: memoryview) -> int | str:
        """Write an entry's bytes where they live (chunks here, or a file of the blob store); its header's count."""
        if self.blobs is None:
            return self._write_chunks(view, lambda index: self.chunk_key(key, index))
        self.blobs.put(view, key)
        return FILE_CHUNKS

    def get(self, key: str) -> bytes:
        data = self.peek(key, repair=True)
        with store_errors(self.url):
            self._script(self._touch, key)
        return data

    def peek(self, key: str, repair: bool = False) -> bytes:
        """The entry's bytes, read as a submitter's credentials allow (farm.distributed.acl): without marking it
        used, and a corrupt entry reported but left for a worker to delete (`repair`: delete it, as `get` does)."""
        with store_errors(self.url):
            return self._read(self.header_key(key), lambda index: self.chunk_key(key, index), key, repair)

    def _write_chunks(self, view: memoryview, chunk_key: Callable[[int], str], ttl: int | None = None) -> int:
        """Write `view` in chunks of chunk_bytes, each in its own command, under `chunk_key(i)`; returns how many."""
        count = 0
        for count, start in enumerate(range(0, len(view), self.chunk_bytes), start=1):
            self.client.set(chunk_key(count - 1), view[start : start + self.chunk_bytes], ex=ttl)
        return count

    def _admit_in(self, blobs: RedisStaging, key: str) -> bytes | None:
        """Admit bytes staged in the blob Redis: read once and checked there, their chunks renamed into its entry
        (no copy), then the header here says the bytes are there, and the cap is kept by evicting here."""
        data = blobs.take_staged(key)
        if data is None:
            return None
        with store_errors(self.url):
            present, total, cap = redis_scripts.flag_bytes_cap(self._script(self._touch, key))
            if not present and int(total) + len(data) > int(cap):
                self._evict_to(room=len(data))
            committed, total, cap = redis_scripts.flag_bytes_cap(
                self._script(self._commit, key, len(data), FILE_CHUNKS)
            )
        if int(committed) and int(total) > int(cap):
            self.evict()
        return data

    def _stager(self) -> RedisStore:
        """Where submitters stage: the blob Redis when the farm keeps its bytes in one (staged bytes are admitted
        by renaming them into an entry, so they must be where entries' chunks are), else this Redis."""
        blobs = self.blobs if self.blobs is not None else self._published_blobs()
        return blobs.for_team(self.team) if isinstance(blobs, RedisStore) else self

    def missing(self, keys: Iterable[str]) -> list[str]:
        """One pipeline of EXISTS on the entries' headers (a submitter's credentials may read them), then, when the
        bytes live in a blob Redis, one on its entries there: a blob Redis is a cache that may have lost them (a
        restart), and what it lost is uploaded again."""
        keys = list(keys)
        lacking = [key for key, present in zip(keys, self._exist(map(self.header_key, keys))) if not present]
        blobs = self._stager()
        if blobs is self:
            return lacking
        absent = set(lacking)
        absent.update(blobs.missing([key for key in keys if key not in absent]))
        return [key for key in keys if key in absent]

    def incomplete(self, keys: Iterable[str]) -> list[str]:
        """One script over the headers and the lengths of the chunks (a file of the blob store: its size); the whole
        entries are marked used."""
        keys = [check_key(key) for key in keys]
        if not keys:
            return []
        with store_errors(self.url):
            states = redis_scripts.whole_states(self._script(self._whole, *keys))
        elsewhere = {key: int(state) for key, state in zip(keys, states) if int(state) >= 0}
        lost = set(self._blobs_lacking(elsewhere)) if elsewhere else set()
        return [key for key, state in zip(keys, states) if int(state) == -1 or key in lost]

    def _blobs_lacking(self, sizes: dict[str, int]) -> list[str]:
        """Those of the entries (key -> size) whose bytes live in the blob store that it doesn't hold whole; all
        of them when it can't be reached from here."""
        try:
            return self._blob_store().lacking(sizes)
        except StoreError:
            return list(sizes)

    def lacking(self, sizes: dict[str, int]) -> list[str]:
        """Those of the entries (key -> size) not whole here, by their chunks' lengths (the header here holds the
        size: a blob Redis' entries are the bytes the durable Redis' headers count); the whole ones marked used."""
        return self.incomplete(sizes)

    def _exist(self, names: Iterable[str]) -> list[bool]:
        """Whether each Redis key exists, in one round trip."""
        with store_errors(self.url):
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.exists(name)
            return [bool(found) for found in pipe.execute()]

    def has(self, key: str) -> bool:
        with store_errors(self.url):
            return bool(self.client.exists(self.header_key(key)))

    def delete(self, key: str) -> None:
        """Delete the header first (readers stop seeing the entry), then its chunks, then any orphans after them,
        the refs that point at it and its bytes from the count, in one script.

        Orphans are chunks of a put that died before its header; they are numbered from 0 upwards without gaps,
        so deleting on from the header's count until a chunk is absent collects them without a SCAN.
        """
        with store_errors(self.url):
            self._script(self._drop, check_key(key))
        self._delete_files([key])

    def _delete_files(self, keys: Iterable[bytes | str]) -> None:
        """Delete the blob store's copies of entries whose headers are gone (nothing when bytes are chunks here). A
        process without FARM_BLOB_STORE of its own (the operator's `farm store gc`) deletes them in the blob store
        the workers published."""
        names = [key.decode() if isinstance(key, bytes) else str(key) for key in keys]
        if not names:
            return
        try:
            blobs = self._blob_store()
        except StoreError:
            return  # bytes are chunks here (the script deleted them), or the blob store isn't reachable from here
        for name in names:
            blobs.delete(name)

    def set_ref(self, name: str, key: str, anchor: str | None = None) -> None:
        with store_errors(self.url):
            self._script(self._set_ref, name, check_key(key), check_key(anchor or key))

    def get_ref(self, name: str) -> str | None:
        """The target of `name`; a value that isn't a key counts as no ref (a cache miss, then rewritten)."""
        with store_errors(self.url):
            value = self.client.get(self.ref_key(name))
        text = value.decode("ascii", errors="replace") if isinstance(value, bytes) else value
        return text if is_key(text) else None

    def delete_ref(self, name: str) -> None:
        with store_errors(self.url):
            self.client.delete(self.ref_key(name))

    def close(self) -> None:
        self.client.close()

    def _read(self, header_key: str, chunk_key: Callable[[int], str], key: str, repair: bool) -> bytes:
        """The bytes of the header at `header_key` and its chunks (`chunk_key(i)`), which must hash to `key`."""
        header = get_bytes(self.client, header_key)
        if header is None:
            raise MissingEntryError(key, redact_url(self.url))
        size, count = self._parse_header(key, header, repair)
        if isinstance(count, str):
            return self._read_file(key, size, repair)
        return self._read_chunks(header_key, chunk_key, key, size, count, repair)

    def _read_file(self, key: str, size: int, repair: bool) -> bytes:
        """An entry whose bytes live in the blob store (checked against `key` as the blob store reads them; read
        without marking them used there, as a submitter's credentials allow: this header marks the use)."""
        blobs = self._blob_store()
        try:
            data = blobs.peek(key)
        except MissingEntryError:
            self._fail_corrupt(key, f"its bytes in the blob store {redact_url(blobs.url)} are missing", repair)
        except CorruptEntryError:
            self._fail_corrupt(key, f"its bytes in the blob store {redact_url(blobs.url)} have another sha256", repair)
        if len(data) != size:
            self._fail_corrupt(key, f"its blob holds {len(data)} bytes where the header says {size}", repair)
        return data

    def _blob_store(self) -> FileStore | RedisStore:
        """The blob store this process writes (FARM_BLOB_STORE), else the one the workers published; StoreError
        when neither (the bytes are chunks here) or this machine can't reach it."""
        blobs = self.blobs if self.blobs is not None else self._published_blobs()
        if blobs is None:
            raise StoreError(
                self._unreadable_blobs
                or "this farm keeps its blobs in a blob store it did not "
                "publish: set FARM_BLOB_STORE to where it is (a folder mounted here, or a Redis)"
            )
        return blobs

    def _published_blobs(self) -> FileStore | RedisStore | None:
        """The blob store the workers published, as a client opens it (None when the bytes are chunks here): a
        folder mounted at the same path (read-only will do), or a blob Redis this process logs in to with its own
        user and TLS settings (the published URL carries none). Looked up once: workers publish it as they start.
        A folder this machine can't read is None here (uploads don't need it); reading from it says what to mount."""
        if self._looked_for_blobs:
            return self.blobs
        with store_errors(self.url):
            published = get_bytes(self.client, f"{self.prefix}blob_store")
        if not published:
            self._looked_for_blobs = True
            return None
        url = published.decode(errors="replace")
        self._looked_for_blobs = url.startswith(REDIS_SCHEMES)  # a folder may be made or mounted later
        if url.startswith(REDIS_SCHEMES):
            self.blobs = blob_redis(with_login_of(url, self.url))
        elif url.startswith(FILE_SCHEME) and os.path.isdir(url[len(FILE_SCHEME) :]):
            self.blobs, self._looked_for_blobs = FileStore(url[len(FILE_SCHEME) :]), True
        else:
            self._unreadable_blobs = (
                f"this farm keeps its blobs in {url[:200]}, which this machine can't read: "
                "mount it at that path (read-only will do), or set FARM_BLOB_STORE to where "
                "it is mounted"
            )
        return self.blobs

    def streams_uploads(self) -> bool:
        """Whether the farm keeps its bytes in a folder (this process' FARM_BLOB_STORE, else what the workers
        published): each staged weight is then handed to the intakes as soon as it is staged, to be written there,
        and staging holds a window of the model. Staged in the Redis that keeps the bytes (the store's, or a blob
        Redis), a weight is admitted at planning by a rename: a window would read it twice."""
        if self.blobs is not None:
            return isinstance(self.blobs, FileStore)
        with store_errors(self.url):
            published = get_bytes(self.client, f"{self.prefix}blob_store")
        return published is not None and published.startswith(FILE_SCHEME.encode())

    def sweep_orphans(self, older_than: float = 3600.0) -> int:
        """The blob store's entries that have no header here (one pipeline of EXISTS per thousand)."""
        try:
            blobs = self._blob_store()
        except StoreError:
            return 0  # bytes are chunks here: a delete's script removes them with the header
        deleted, batch = 0, []
        for key in blobs.keys_older_than(older_than):
            batch.append(key)
            if len(batch) >= 1000:
                deleted += self._delete_headerless(blobs, batch)
                batch = []
        return deleted + (self._delete_headerless(blobs, batch) if batch else 0)

    def _delete_headerless(self, blobs: FileStore | RedisStore, keys: list[str]) -> int:
        orphans = self.missing(keys)
        for key in orphans:
            blobs.delete(key)
        return len(orphans)

    def publish_blob_store(self, client_url: str | None = None) -> None:
        """Tell clients where entries' bytes live (a worker does at start; never its credentials), or that they
        are chunks here. `client_url`: the blob store's address as clients reach it, when it differs."""
        with store_errors(self.url):
            if self.blobs is None:
                self.client.delete(f"{self.prefix}blob_store")
            else:
                self.client.set(f"{self.prefix}blob_store", without_login(client_url or self.blobs.url))

    def _read_chunks(
        self, header_key: str, chunk_key: Callable[[int], str], key: str, size: int, count: int, repair: bool
    ) -> bytes:
        """Read, hash and join the chunks; a missing chunk, a wrong size or a wrong hash makes the entry corrupt.

        The chunks are appended to one BytesIO whose getvalue doesn't copy, so a big entry costs about its size
        in memory, not twice that; an entry of one chunk (most weights) is that chunk, not copied at all.
        """
        digest, buffer, whole = hashlib.sha256(), io.BytesIO(), b""
        for index in range(count):
            chunk = get_bytes(self.client, chunk_key(index))
            if chunk is None and not self.client.exists(header_key):
                raise MissingEntryError(key, f"{redact_url(self.url)} (evicted or deleted while being read)")
            if chunk is None:
                self._fail_corrupt(key, f"chunk {index} of {count} is missing", repair)
            digest.update(chunk)
            if count == 1:
                whole = chunk
            else:
                buffer.write(chunk)
            del chunk
        held = len(whole) if count == 1 else buffer.tell()
        if held != size:
            self._fail_corrupt(key, f"{held} bytes where the header says {size}", repair)
        if digest.hexdigest() != key:
            self._fail_corrupt(key, f"its {size} bytes have another sha256", repair)
        return whole if count == 1 else buffer.getvalue()

    def _parse_header(self, key: str, header: bytes, repair: bool) -> tuple[int, int | str]:
        """(size, chunk count or FILE_CHUNKS) from a header; an unreadable header makes the entry corrupt."""
        try:
            size_text, count_text = header.decode("ascii").split(":")
            size = int(size_text)
            count: int | str = count_text if count_text == FILE_CHUNKS else int(count_text)
        except (UnicodeDecodeError, ValueError):
            self._fail_corrupt(key, f"its header {header[:40]!r} is not 'size:chunks'", repair)
        if size < 0 or (isinstance(count, int) and count < 0):
            self._fail_corrupt(key, f"its header {header[:40]!r} is negative", repair)
        return size, count

    def _fail_corrupt(self, key: str, reason: str, repair: bool) -> NoReturn:
        """Raise CorruptEntryError; `repair`: delete the entry of `key` first, so the next build puts a good copy."""
        if repair:
            self.delete(key)
        raise CorruptEntryError(key, reason, redact_url(self.url))


def blob_redis(url: str, retries: int = 1) -> RedisStore:
    """The store of a blob Redis (FARM_BLOB_STORE=redis://...): entries' bytes and submitters' staged uploads, with
    the durable Redis' key names (so the ACL file that `farm acl` writes rules both servers alike), uncapped of its
    own: the durable Redis' headers and cap say what it holds."""
    return RedisStore(url, retries=retries, default_cap=UNCAPPED, looks_for_blobs=False)
