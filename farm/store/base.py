"""What every store shares: keys (sha256 of the bytes), the errors a store raises, and the Store interface."""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeGuard, Union

from farm.errors import ExitStatus, FarmError, UnreachableError, redact_url

Data = Union[bytes, bytearray, memoryview]

REDIS_SCHEMES = ("redis://", "rediss://")
"""The URL schemes of a store in Redis (farm.store.redis_store)."""
EMPTY_KEY = hashlib.sha256(b"").hexdigest()
_KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
_OWNER_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,100}")


class StoreError(FarmError):
    """The store can't give or keep an entry; the build that needed it fails."""


class BadStoreUrlError(StoreError):
    """A store URL names no backend farm knows, so nothing was read or built."""

    exit_status = ExitStatus.BAD_INPUT


class MissingEntryError(StoreError):
    """No entry has this key: it was never put, or was deleted (e.g. found corrupt)."""

    def __init__(self, key: str, where: str = "") -> None:
        self.key = key
        super().__init__(f"store entry {key} is missing" + (f" from {where}" if where else ""))


class CorruptEntryError(StoreError):
    """An entry's bytes don't hash to its key; it has been deleted so a rebuild can put it again."""

    def __init__(self, key: str, reason: str, where: str = "") -> None:
        self.key = key
        where_text = f" in {where}" if where else ""
        super().__init__(f"store entry {key}{where_text} is corrupt ({reason}); it was deleted, rebuild it")


class StoreUnreachableError(StoreError, UnreachableError):
    """The store's server can't be reached (down, wrong address, refused credentials)."""


def content_key(data: Data) -> str:
    """The key of `data`: its sha256 as 64 lowercase hex digits."""
    return hashlib.sha256(as_bytes_view(data)).hexdigest()


def is_key(text: object) -> TypeGuard[str]:
    """Whether `text` has the form of a key; keys become file names and Redis keys, so anything else is refused."""
    return isinstance(text, str) and _KEY_PATTERN.fullmatch(text) is not None


def check_key(key: str | None) -> str:
    """`key` itself, or StoreError: a malformed key (or None, a key a record doesn't name) is a caller's bug, and
    must never reach a file path."""
    if not is_key(key):
        raise StoreError(f"not a store key (64 lowercase hex digits of a sha256): {key!r}")
    return key


def check_owner(owner: str) -> str:
    """`owner` itself, or StoreError: a pin's owner names a Redis key or a file, so it is a short plain name."""
    if not isinstance(owner, str) or not _OWNER_PATTERN.fullmatch(owner):
        raise StoreError(f"not a pin owner (1-100 of A-Z a-z 0-9 _ . : -): {str(owner)[:120]!r}")
    return owner


@dataclass(frozen=True)
class StoreStats:
    """What the store holds: its entries and their bytes, the cap, and what pins keep from eviction."""

    entries: int
    bytes: int
    max_bytes: int
    pinned_entries: int
    pinned_bytes: int
    pin_owners: list[str]

    def to_json(self) -> dict[str, object]:
        return {
            "entries": self.entries,
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "pinned_entries": self.pinned_entries,
            "pinned_bytes": self.pinned_bytes,
            "pin_owners": self.pin_owners,
        }


@dataclass(frozen=True)
class Eviction:
    """What one eviction pass freed, and the bytes of entries left (above the cap only when pins hold them)."""

    entries: int
    bytes: int
    bytes_left: int

    def to_json(self) -> dict[str, int]:
        return {"freed_entries": self.entries, "freed_bytes": self.bytes, "bytes_left": self.bytes_left}


def as_bytes_view(data: Data) -> memoryview:
    """A flat byte view of `data` without copying it when it is contiguous (big blobs shouldn't be copied twice)."""
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class Store(ABC):
    """A content-addressed byte store plus small named refs; safe to share between threads and processes."""

    @property
    @abstractmethod
    def url(self) -> str:
        """A URL that `open_store` turns back into a store over the same entries."""

    @abstractmethod
    def put(self, data: Data, key: str | None = None) -> str:
        """Keep `data` and return its key; skips the write when the entry is already there. `key`: the sha256 of
        `data` when this process just computed it from these bytes (a worker pins an output by its key before it
        puts it), so that the bytes are not hashed again; never a key that came from elsewhere."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes of `key`, checked against it; CorruptEntryError (entry deleted) or MissingEntryError."""

    @abstractmethod
    def has(self, key: str) -> bool:
        """Whether `key` has an entry; cheap (no hashing), so get can still find it corrupt."""

    def peek(self, key: str) -> bytes:
        """The bytes of `key` read as a writer the store doesn't trust may (farm.store.redis_store separates such
        writers: submitters); here, where every writer is trusted, `get`."""
        return self.get(key)

    def stage(self, data: Data) -> str:
        """Offer bytes for a trusted process to `admit` into the store; here, where every writer is trusted, `put`."""
        return self.put(data)

    def stage_stream(self, key: str, size: int, chunks: Iterable[Data]) -> None:
        """Stage the `size` bytes that `chunks` yield, which their writer says hash to `key` (admission checks it),
        holding one chunk at a time where the store allows (a submitter's weights can be gigabytes); here the
        pieces are joined and put."""
        data = b"".join(bytes(as_bytes_view(chunk)) for chunk in chunks)
        if len(data) != size or content_key(data) != key:
            raise StoreError(f"staged bytes for {key} are not the {size} bytes that hash to it")
        self.put(data)

    @property
    def piece_bytes(self) -> int:
        """The size of the pieces `stage_stream` sends without gathering them (a reader hands it pieces of this)."""
        return 4 << 20

    def admit(self, key: str) -> bool:
        """Move staged bytes into the store, checked against `key`; False when none are staged (or they are not
        whole). Here, where staging is the store itself, whether the entry is there."""
        return self.has(key)

    def take_staged(self, key: str) -> bytes | None:
        """The bytes of `key`, admitted from staging (checked against `key` as they are read) unless the store has
        them; None when neither holds them whole. Admitting moves the staged bytes, never copies them (a weight is
        in the store once, as its one read out of it). Here, where staging is the store itself, `get`."""
        try:
            return self.get(key)
        except (MissingEntryError, CorruptEntryError):
            return None

    def missing(self, keys: Iterable[str]) -> list[str]:
        """Those of `keys` the store has no entry for, in one round trip where the store allows."""
        return [key for key in keys if not self.has(key)]

    @abstractmethod
    def incomplete(self, keys: Iterable[str]) -> list[str]:
        """Those of `keys` without a whole entry (none, or its bytes gone or of another length), judged without
        reading the bytes, so that checking an artifact of gigabytes before reusing it costs no read of them (each
        read checks the sha256: `get`, a download); the whole ones are marked used, as a read would."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the entry of `key` if there is one."""

    @abstractmethod
    def set_ref(self, name: str, key: str, anchor: str | None = None) -> None:
        """Point the ref `name` at `key`, replacing any earlier target. A store that drops refs with their entries
        drops it with `anchor`'s entry when given (a packed weight's ref names bytes the store never holds: it goes
        with the weight they are made from), else with `key`'s."""

    @abstractmethod
    def get_ref(self, name: str) -> str | None:
        """The key the ref `name` points at, or None when there is no such ref."""

    @abstractmethod
    def delete_ref(self, name: str) -> None:
        """Remove the ref `name` if there is one."""

    # -- the cap, eviction and pins (see docs/architecture.md, "The store's cap") --

    @property
    @abstractmethod
    def max_bytes(self) -> int:
        """The cap on the bytes of entries: the one published in the store (`set_max_bytes`), else this process's
        FARM_STORE_MAX_BYTES (farm.defaults.store_max_bytes)."""

    @abstractmethod
    def set_max_bytes(self, max_bytes: int) -> None:
        """Publish the cap in the store, so every process that writes it evicts down to the same one."""

    @abstractmethod
    def pin(self, owner: str, keys: Iterable[str], ttl: float | None, replace: bool = False) -> None:
        """Keep `keys` (present or yet to be put) from eviction for `owner` (a job, the tuning database) until it
        unpins them or `ttl` seconds pass (None: no expiry); every call restarts the owner's ttl. `replace`
        makes `keys` the owner's only pins, atomically (what was pinned stays pinned until the new set is)."""

    @abstractmethod
    def unpin(self, owner: str, keys: Iterable[str] | None = None) -> None:
        """Release `keys` pinned by `owner`, or all of them."""

    @abstractmethod
    def pin_owners(self) -> list[str]:
        """The owners holding live (not expired) pins."""

    @abstractmethod
    def stats(self) -> StoreStats:
        """Entries, bytes, the cap and the pinned entries and bytes, as of now."""

    @abstractmethod
    def evict(self) -> Eviction:
        """Evict least recently used entries that no live pin holds until the entries' bytes are within the cap."""

    def streams_uploads(self) -> bool:
        """Whether uploads should be admitted as they arrive rather than when their job is planned: when the bytes
        live elsewhere than staging (a file blob store), so that staging never holds a whole model. Not here."""
        return False

    def staged(self, keys: Iterable[str]) -> list[str]:
        """Those of `keys` whose staged bytes wait for admission; none where staging is the store itself."""
        return []

    def for_team(self, team: str) -> Store:
        """This store as one team of submitters stages into it (farm.distributed.acl); the store itself where
        staging is the store (every writer trusted)."""
        return self

    def trim_staging(self, quota: int) -> dict[str, int]:
        """Keep each team's staged bytes under `quota` (dropping its oldest uploads) and give every staged key a
        time to live; returns the bytes dropped, by team. Nothing to do where staging is the store itself."""
        return {}

    def publish_blob_store(self, client_url: str | None = None) -> None:
        """Tell clients where the entries' bytes live (at `client_url` when they reach it by another address), when
        that is elsewhere than the store (RedisStore with FARM_BLOB_STORE); nothing to tell here."""
        return None

    def sweep_orphans(self, older_than: float = 3600.0) -> int:
        """Delete bytes no entry owns any more (a process killed between dropping an entry and deleting its file),
        untouched for `older_than` seconds so that no put in flight loses its bytes; returns how many. Nothing to
        sweep where an entry and its bytes are one file."""
        return 0

    def adopt_unaccounted(self) -> int:
        """Count entries written before the store kept a count (an older farm's); returns how many. A store that
        counts by walking its entries has none."""
        return 0

    def close(self) -> None:
        """Release connections or handles; the store must not be used afterwards. Files hold none."""
        return None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"


# --- files -------------------------------------------------------------------------------------------------------
