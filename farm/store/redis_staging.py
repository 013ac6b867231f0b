"""The staging area of the Redis store (farm.store.redis_store): where submitters, whom the store doesn't trust with
its entries, write uploads beside them until a worker admits them. RedisStaging, which RedisStore inherits, stages,
admits and trims each team's uploads to its quota; the functions here weigh the area by team and check one upload's
chunk lengths before any is read.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from abc import abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from farm import defaults
from farm.errors import redact_url
from farm.store import redis_scripts
from farm.store.base import CorruptEntryError, Data, MissingEntryError, Store, StoreError, as_bytes_view, check_key
from farm.store.expiry import SCAN_COUNT
from farm.store.lua import LuaScript
from farm.store.redis_cap import RedisCap
from farm.store.redis_connection import get_bytes, store_errors

StagingT = TypeVar("StagingT", bound="RedisStaging")


@dataclass
class StagedUpload:
    """One upload in the staging area (its header and chunks) as trim_staging weighs it."""

    size: int = 0
    ttl: int = 1 << 62
    """The shortest time to live of its keys: the oldest upload has the least left."""
    keys: list[bytes | str] = field(default_factory=list)

    def add(self, name: bytes | str, size: int, ttl: int) -> None:
        self.size, self.ttl = self.size + size, min(self.ttl, ttl)
        self.keys.append(name)


def staged_uploads(client: Any, prefix: str) -> dict[str, dict[str, StagedUpload]]:
    """The staging area by team, then by upload (`[<team>.]<key>`). Keys without a time to live get
    STAGED_TTL_SECONDS (the client sets one, a submitter may not)."""
    teams: dict[str, dict[str, StagedUpload]] = {}
    start, cursor = len(f"{prefix}staged:"), 0
    while True:
        cursor, names = client.scan(cursor, match=f"{prefix}staged:*", count=SCAN_COUNT)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.strlen(name)
            pipe.ttl(name)
        found = pipe.execute() if names else []
        for name, size, ttl in zip(names, found[::2], found[1::2]):
            if ttl == -1:  # given a day from now, it counts as staged now
                pipe.expire(name, defaults.STAGED_TTL_SECONDS, nx=True)
                ttl = defaults.STAGED_TTL_SECONDS
            upload = _text(name)[start:].split(":")[0]
            teams.setdefault(upload.rpartition(".")[0], {}).setdefault(upload, StagedUpload()).add(name, size, ttl)
        pipe.execute()
        if not int(cursor):
            return teams


def check_staged_lengths(client: Any, staged: str, key: str, size: int, count: int, max_bytes: int) -> None:
    """Refuse staged bytes before reading any: a size over the store's cap (they could never be admitted), or
    chunks whose lengths (STRLEN, a thousand per round trip) don't add up to the header's size. A submitter
    writes both, so chunks of 256 MB under a header of one byte would otherwise be joined in the worker's memory
    before the size check; read this way, a worker holds at most the size the header names."""
    if size > max_bytes:
        raise CorruptEntryError(key, f"its staged header names {size} bytes, over the store's cap")
    total = 0
    for start in range(0, count, 1000):
        pipe = client.pipeline(transaction=False)
        for index in range(start, min(count, start + 1000)):
            pipe.strlen(f"{staged}:{index}")
        lengths = pipe.execute()
        total += sum(lengths)
        if total > size or (0 in lengths and size):
            raise CorruptEntryError(key, f"its staged chunks hold other than the {size} bytes its header names")
    if total != size:
        raise CorruptEntryError(key, f"its staged chunks hold {total} bytes, not the {size} its header names")


def _text(name: bytes | str) -> str:
    """A key name as redis-py gave it (bytes, unless a client decodes), as text."""
    return name.decode("ascii", "replace") if isinstance(name, bytes) else name


class RedisStaging(RedisCap):
    """The staging area of a RedisStore, which sets the chunk size, the team and the scripts declared here, and
    defines where staged bytes live (`_stager`: this Redis or the blob Redis) and how chunks are written and read."""

    chunk_bytes: int
    team: str
    blobs: Store | None
    _touch: LuaScript
    _promote: LuaScript

    @abstractmethod
    def _stager(self) -> RedisStaging:
        """Where submitters stage: this store, or the blob Redis' store."""

    @abstractmethod
    def _admit_in(self, blobs: RedisStaging, key: str) -> bytes | None:
        """Admit bytes staged in the blob Redis `blobs` into this store's entry `key`."""

    @abstractmethod
    def _write_chunks(self, view: memoryview, chunk_key: Callable[[int], str], ttl: int | None = None) -> int:
        """Write `view` in chunks under `chunk_key(i)`; returns how many."""

    @abstractmethod
    def _read_chunks(
        self, header_key: str, chunk_key: Callable[[int], str], key: str, size: int, count: int, repair: bool
    ) -> bytes:
        """Read, hash and join the chunks of `key`."""

    @abstractmethod
    def _parse_header(self, key: str, header: bytes, repair: bool) -> tuple[int, int | str]:
        """(size, chunk count or a blob's marker) from a header."""

    @abstractmethod
    def _exist(self, names: Iterable[str]) -> list[bool]:
        """Whether each Redis key exists, in one round trip."""

    def stage(self, data: Data) -> str:
        """Write bytes where a writer the store doesn't trust may (a submitter's model): not in the store but beside
        it (`{prefix}staged:{key}`, chunked like an entry; in the blob Redis when there is one), for
        STAGED_TTL_SECONDS, until a worker admits them."""
        stager = self._stager()
        if stager is not self:
            return stager.stage(data)
        view = as_bytes_view(data)
        key, ttl = hashlib.sha256(view).hexdigest(), defaults.STAGED_TTL_SECONDS
        with store_errors(self.url):
            count = self._write_chunks(view, lambda index: f"{self.staged_key(key)}:{index}", ttl)
            self.client.set(self.staged_key(key), f"{len(view)}:{count}", ex=ttl)
        return key

    def stage_stream(self, key: str, size: int, chunks: Iterable[Data]) -> None:
        """Stage bytes as `stage` does, one chunk of at most chunk_bytes at a time (a submitter's weights are
        never held whole): `chunks` may yield pieces of any size (pieces of chunk_bytes are sent as they come);
        their sha256 is checked when a worker admits them."""
        stager = self._stager()
        if stager is not self:
            stager.stage_stream(key, size, chunks)
            return
        staged, ttl = self.staged_key(key), defaults.STAGED_TTL_SECONDS
        count = written = 0
        pending = bytearray()

        def send(piece: Data) -> None:
            nonlocal count, written
            self.client.set(f"{staged}:{count}", piece, ex=ttl)
            count, written = count + 1, written + len(piece)

        with store_errors(self.url):
            for chunk in chunks:
                view = as_bytes_view(chunk)
                if not pending and len(view) == self.chunk_bytes:
                    send(view)
                    continue
                pending += view
                while len(pending) >= self.chunk_bytes:
                    send(bytes(pending[: self.chunk_bytes]))
                    del pending[: self.chunk_bytes]
            if pending or not count:
                send(bytes(pending))
            if written != size:
                raise StoreError(f"staging {key}: {written} bytes came, not {size}")
            self.client.set(staged, f"{size}:{count}", ex=ttl)

    @property
    def piece_bytes(self) -> int:
        return self.chunk_bytes

    def admit(self, key: str) -> bool:
        """Put staged bytes into the store once their sha256 is checked against `key` (so a stager can't make a key
        stand for other bytes); False when nothing whole is staged under `key`."""
        return self.take_staged(key) is not None

    def take_staged(self, key: str) -> bytes | None:
        """The bytes of `key`: the entry's when the store has it whole, else the staged bytes, read once and checked
        against `key`, then admitted by renaming their chunks into the entry (no second copy, and nothing
        written back); None when neither holds them whole (bad staged bytes are dropped)."""
        with contextlib.suppress(MissingEntryError, CorruptEntryError):
            return self.get(key)
        stager = self._stager()
        if stager is not self:
            return self._admit_in(stager, key)
        staged = self.staged_key(key)
        try:
            count, data = self._read_staged(key)
        except (MissingEntryError, CorruptEntryError):
            self._drop_staged(key)
            with contextlib.suppress(MissingEntryError, CorruptEntryError):
                return self.get(key)  # another worker admitted it while this one read
            return None
        if self.blobs is not None:  # the bytes leave Redis for the blob store: written once, as they were read
            self.put(data)
            self._drop_staged(key)
            return data
        with store_errors(self.url):
            present, total, cap = redis_scripts.flag_bytes_cap(self._script(self._touch, key))
        if not present and int(total) + len(data) > int(cap):
            self._evict_to(room=len(data))
        with store_errors(self.url):
            done, total, cap = redis_scripts.flag_bytes_cap(self._script(self._promote, key, staged, len(data), count))
        if int(done) != 1:
            self._drop_staged(key)
            self.put(data)  # staged chunks expired meanwhile: put the bytes read (a no-op when present)
        elif int(total) > int(cap):
            self.evict()
        return data

    def _read_staged(self, key: str) -> tuple[int, bytes]:
        """(chunk count, bytes) of what a submitter staged under `key`, read once and checked against it. Staged
        bytes are chunks here whatever their header says: a submitter's header never sends a read elsewhere."""
        staged = self.staged_key(key)
        with store_errors(self.url):
            header = get_bytes(self.client, staged)
            if header is None:
                raise MissingEntryError(key, f"{redact_url(self.url)} (staging)")
            size, count = self._parse_header(key, header, repair=False)
            if not isinstance(count, int):
                raise CorruptEntryError(key, f"its staged header {header[:40]!r} names no chunks")
            check_staged_lengths(self.client, staged, key, size, count, self.max_bytes)
            return count, self._read_chunks(staged, lambda index: f"{staged}:{index}", key, size, count, False)

    def trim_staging(self, quota: int) -> dict[str, int]:
        """Keep each team's staged bytes (farm.distributed.acl: the default submitters are team "") under `quota`
        and give every staged key a time to live: one SCAN of the staging area (in the blob Redis when there is
        one), the STRLEN and TTL of its keys in a pipeline per step, then each team over `quota` loses its oldest
        uploads (the shortest time to live left) until it is under. A submitter writes staging directly, so this is
        the only place its size is known; returns the bytes dropped, by team."""
        stager = self._stager().for_team("")
        with store_errors(self.url):
            teams = staged_uploads(stager.client, stager.prefix)
        dropped: dict[str, int] = {}
        for team, uploads in teams.items():
            held = sum(upload.size for upload in uploads.values())
            for upload in sorted(uploads.values(), key=lambda upload: upload.ttl):
                if held <= quota:
                    break
                with store_errors(self.url):
                    stager.client.delete(*upload.keys)
                held -= upload.size
                dropped[team] = dropped.get(team, 0) + upload.size
        return dropped

    def _drop_staged(self, key: str) -> None:
        staged = self.staged_key(key)
        with store_errors(self.url):
            self.client.delete(staged)
            index = 0
            while self.client.delete(f"{staged}:{index}"):
                index += 1

    def staged_key(self, key: str) -> str:
        """The Redis key of staged bytes' header (their chunks at `<it>:<i>`): `{prefix}staged:[<team>.]<key>`."""
        return f"{self.prefix}staged:{self.team + '.' if self.team else ''}{check_key(key)}"

    def for_team(self: StagingT, team: str) -> StagingT:
        """This store, staging where `team`'s submitters stage (their Redis user writes only there: a team's staged
        bytes are counted against its quota, trim_staging); the entries, refs and pins are the same."""
        if team == self.team:
            return self
        scoped = copy.copy(self)
        scoped.team = team
        return scoped

    def staged(self, keys: Iterable[str]) -> list[str]:
        """One pipeline of EXISTS on the staged headers (in the blob Redis when there is one)."""
        stager = self._stager()
        if stager is not self:
            return stager.staged(keys)
        keys = list(keys)
        return [key for key, present in zip(keys, self._exist(map(self.staged_key, keys))) if present]
