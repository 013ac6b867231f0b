"""The content-addressed store: every big byte string of a build (model, object, library, artifact) lives here.

Entries are named by the sha256 of their bytes, so a key names one value anywhere, a second put of the same bytes
costs nothing, and a reader can always check what it got. Celery messages carry keys, never the bytes.

The store is also the compile cache: refs are small named pointers to keys ("kernel:<spec key>" -> object key), so
a worker that finds a ref skips the compile. Two backends share one interface:

- `FileStore(root)`: files under a folder (one machine, or a shared file system); the embedded default.
- `RedisStore(url)`: keys in Redis, values split into chunks so no single command carries a big value.

`open_store(url)` picks the backend from a URL, and `store.url` gives the URL that reopens the same store, so a
store can be named in a message and reopened in another process.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, Union
from urllib.parse import urlsplit, urlunsplit

from farm.atomic import write_atomically
from farm.errors import ExitStatus, FarmError
from farm.runtime.cache import default_cache_dir

Data = Union[bytes, bytearray, memoryview]

EMPTY_KEY = hashlib.sha256(b"").hexdigest()
_KEY_PATTERN = re.compile(r"[0-9a-f]{64}")
_REDIS_SCHEMES = ("redis://", "rediss://")
_FILE_SCHEME = "file://"


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


class StoreUnreachableError(StoreError):
    """The store's server can't be reached (down, wrong address, refused credentials)."""

    exit_status = ExitStatus.UNREACHABLE


def content_key(data: Data) -> str:
    """The key of `data`: its sha256 as 64 lowercase hex digits."""
    return hashlib.sha256(_as_bytes_view(data)).hexdigest()


def is_key(text: object) -> bool:
    """Whether `text` has the form of a key; keys become file names and Redis keys, so anything else is refused."""
    return isinstance(text, str) and _KEY_PATTERN.fullmatch(text) is not None


def _check_key(key: str) -> str:
    """`key` itself, or StoreError: a malformed key is a caller's bug, and must never reach a file path."""
    if not is_key(key):
        raise StoreError(f"not a store key (64 lowercase hex digits of a sha256): {key!r}")
    return key


def _as_bytes_view(data: Data) -> memoryview:
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
    def put(self, data: Data) -> str:
        """Keep `data` and return its key; skips the write when the entry is already there."""

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes of `key`, checked against it; CorruptEntryError (entry deleted) or MissingEntryError."""

    @abstractmethod
    def has(self, key: str) -> bool:
        """Whether `key` has an entry; cheap (no hashing), so get can still find it corrupt."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the entry of `key` if there is one."""

    @abstractmethod
    def set_ref(self, name: str, key: str) -> None:
        """Point the ref `name` at `key`, replacing any earlier target."""

    @abstractmethod
    def get_ref(self, name: str) -> str | None:
        """The key the ref `name` points at, or None when there is no such ref."""

    @abstractmethod
    def delete_ref(self, name: str) -> None:
        """Remove the ref `name` if there is one."""

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


class FileStore(Store):
    """Entries as files: objects at <root>/objects/<key[:2]>/<key>, refs at <root>/refs/<sha256(name)>.

    Every write goes to a temporary file in the destination folder and is renamed into place (os.replace is atomic),
    so a reader in any thread or process sees a whole file or none, and concurrent writers of one key just replace
    one complete copy with another.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        if not str(root):
            raise BadStoreUrlError("a file store needs a folder; got an empty path")
        self.root = Path(root).expanduser().absolute()
        self.objects = self.root / "objects"
        self.refs = self.root / "refs"

    @property
    def url(self) -> str:
        return _FILE_SCHEME + str(self.root)

    def object_path(self, key: str) -> Path:
        """Where the entry of `key` lives (fan-out by the first two hex digits keeps folders small)."""
        _check_key(key)
        return self.objects / key[:2] / key

    def ref_path(self, name: str) -> Path:
        """Where the ref `name` lives; hashing the name makes any string a safe file name."""
        return self.refs / hashlib.sha256(name.encode("utf-8")).hexdigest()

    def put(self, data: Data) -> str:
        view = _as_bytes_view(data)
        key = hashlib.sha256(view).hexdigest()
        path = self.object_path(key)
        if not self._present(path, key):
            write_atomically(path, view)
        return key

    def get(self, key: str) -> bytes:
        path = self.object_path(key)
        try:
            with open(path, "rb") as file:
                identity = os.fstat(file.fileno())
                data = file.read()
        except FileNotFoundError:
            raise MissingEntryError(key, self.url) from None
        except OSError as exc:
            raise StoreError(f"can't read store entry {key} at {path}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != key:
            self._delete_if_same(path, identity)
            raise CorruptEntryError(key, f"its {len(data)} bytes have another sha256", self.url)
        return data

    def has(self, key: str) -> bool:
        return self._present(self.object_path(key), key)

    def delete(self, key: str) -> None:
        self.object_path(key).unlink(missing_ok=True)

    def set_ref(self, name: str, key: str) -> None:
        write_atomically(self.ref_path(name), _check_key(key).encode("ascii"))

    def get_ref(self, name: str) -> str | None:
        """The target of `name`; a ref file that doesn't hold a key counts as no ref (a cache miss, then rewritten)."""
        try:
            text = self.ref_path(name).read_text(encoding="ascii", errors="replace").strip()
        except FileNotFoundError:
            return None
        return text if is_key(text) else None

    def delete_ref(self, name: str) -> None:
        self.ref_path(name).unlink(missing_ok=True)

    @staticmethod
    def _present(path: Path, key: str) -> bool:
        """Whether a plausible entry is at `path`: a file, and empty only for the empty value's key.

        A crash soon after a rename can leave a zero-length file behind; that one costs nothing to spot, while any
        other damage needs the hash check that get does.
        """
        try:
            info = path.stat()
        except FileNotFoundError:
            return False
        return info.st_size > 0 or key == EMPTY_KEY

    @staticmethod
    def _delete_if_same(path: Path, identity: os.stat_result) -> None:
        """Delete the corrupt file we read, but not a good copy a concurrent put renamed over it since."""
        with contextlib.suppress(FileNotFoundError):
            now = path.stat()
            if (now.st_dev, now.st_ino) == (identity.st_dev, identity.st_ino):
                path.unlink()


# --- Redis -------------------------------------------------------------------------------------------------------


def redact_url(url: str) -> str:
    """`url` with its password replaced by ***, fit for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


class RedisStore(Store):
    """Entries in Redis: chunks `{prefix}obj:{key}:{i}`, then a header `{prefix}obj:{key}` = "size:chunks".

    The header is written last and deleted first, so a reader that finds it finds every chunk (barring a concurrent
    delete or an eviction, which the hash check on every read catches). Each chunk travels in its own command, so
    neither side ever holds a big value in one request buffer. Refs are plain string keys `{prefix}ref:{name}`.

    The connection is lazy (a worker may start before Redis does); timeouts are short and retries few, so an
    unreachable server is reported as StoreUnreachableError within seconds rather than hanging a build.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "farm:store:",
        chunk_bytes: int = 8 << 20,
        *,
        connect_timeout: float = 3.0,
        socket_timeout: float = 10.0,
        retries: int = 1,
    ) -> None:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.retry import Retry

        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._url, self.prefix, self.chunk_bytes = url, prefix, chunk_bytes
        try:
            self.client = redis.Redis.from_url(
                url,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                # Retry lost connections only (a restarted server, a stale pooled socket): every operation here is
                # idempotent, but retrying a timeout would just double the wait on a server that doesn't answer.
                retry=Retry(ExponentialBackoff(cap=0.5, base=0.1), retries, supported_errors=(RedisConnectionError,)),
            )
        except ValueError as exc:  # redis-py's answer to a malformed URL
            raise BadStoreUrlError(f"bad Redis URL {redact_url(url)}: {exc}") from exc

    @property
    def url(self) -> str:
        return self._url

    def header_key(self, key: str) -> str:
        """The Redis key of the entry's header; its presence is what makes an entry exist."""
        return f"{self.prefix}obj:{_check_key(key)}"

    def chunk_key(self, key: str, index: int) -> str:
        """The Redis key of chunk `index` of the entry `key`."""
        return f"{self.prefix}obj:{_check_key(key)}:{index}"

    def ref_key(self, name: str) -> str:
        """The Redis key of the ref `name` (Redis keys are binary-safe, so any name will do)."""
        return f"{self.prefix}ref:{name}"

    def put(self, data: Data) -> str:
        view = _as_bytes_view(data)
        key = hashlib.sha256(view).hexdigest()
        with self._errors():
            if self.client.exists(self.header_key(key)):
                return key
            count = 0
            for count, start in enumerate(range(0, len(view), self.chunk_bytes), start=1):
                self.client.set(self.chunk_key(key, count - 1), view[start : start + self.chunk_bytes])
            self.client.set(self.header_key(key), f"{len(view)}:{count}")
        return key

    def get(self, key: str) -> bytes:
        with self._errors():
            header = self.client.get(self.header_key(key))
            if header is None:
                raise MissingEntryError(key, redact_url(self.url))
            size, count = self._parse_header(key, header)
            return self._read_chunks(key, size, count)

    def has(self, key: str) -> bool:
        with self._errors():
            return bool(self.client.exists(self.header_key(key)))

    def delete(self, key: str) -> None:
        """Delete the header first (readers stop seeing the entry), then its chunks, then any orphans after them.

        Orphans are chunks of a put that died before its header; they are numbered from 0 upwards without gaps,
        so deleting on from the header's count until a chunk is absent collects them without a SCAN.
        """
        with self._errors():
            header = self.client.getdel(self.header_key(key))
            count = self._header_count(header)
            if count:
                self.client.delete(*(self.chunk_key(key, index) for index in range(count)))
            while self.client.delete(self.chunk_key(key, count)):
                count += 1

    def set_ref(self, name: str, key: str) -> None:
        with self._errors():
            self.client.set(self.ref_key(name), _check_key(key))

    def get_ref(self, name: str) -> str | None:
        """The target of `name`; a value that isn't a key counts as no ref (a cache miss, then rewritten)."""
        with self._errors():
            value = self.client.get(self.ref_key(name))
        text = value.decode("ascii", errors="replace") if isinstance(value, bytes) else value
        return text if is_key(text) else None

    def delete_ref(self, name: str) -> None:
        with self._errors():
            self.client.delete(self.ref_key(name))

    def close(self) -> None:
        self.client.close()

    def _read_chunks(self, key: str, size: int, count: int) -> bytes:
        """Read, hash and join the chunks; a missing chunk, a wrong size or a wrong hash makes the entry corrupt.

        The chunks are appended to one BytesIO whose getvalue doesn't copy, so a big entry costs about its size
        in memory, not twice that.
        """
        digest, buffer = hashlib.sha256(), io.BytesIO()
        for index in range(count):
            chunk = self.client.get(self.chunk_key(key, index))
            if chunk is None:
                self._fail_corrupt(key, f"chunk {index} of {count} is missing")
            digest.update(chunk)
            buffer.write(chunk)
            del chunk
        if buffer.tell() != size:
            self._fail_corrupt(key, f"{buffer.tell()} bytes where the header says {size}")
        if digest.hexdigest() != key:
            self._fail_corrupt(key, f"its {size} bytes have another sha256")
        return buffer.getvalue()

    def _parse_header(self, key: str, header: bytes) -> tuple[int, int]:
        """(size, chunk count) from a header; an unreadable header makes the entry corrupt."""
        try:
            size_text, count_text = header.decode("ascii").split(":")
            size, count = int(size_text), int(count_text)
        except (UnicodeDecodeError, ValueError):
            self._fail_corrupt(key, f"its header {header[:40]!r} is not 'size:chunks'")
        if size < 0 or count < 0:
            self._fail_corrupt(key, f"its header {header[:40]!r} is negative")
        return size, count

    @staticmethod
    def _header_count(header: bytes | None) -> int:
        """The chunk count of a header, 0 when there is none or it is unreadable (delete then sweeps from 0)."""
        try:
            return max(0, int(header.split(b":")[1])) if header else 0
        except (IndexError, ValueError):
            return 0

    def _fail_corrupt(self, key: str, reason: str) -> NoReturn:
        """Delete the entry of `key` and raise CorruptEntryError, so the next build puts a good copy."""
        self.delete(key)
        raise CorruptEntryError(key, reason, redact_url(self.url))

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn redis-py's errors into StoreErrors naming the store (never its password)."""
        import redis.exceptions

        try:
            yield
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise StoreUnreachableError(f"can't reach the store at {redact_url(self.url)}: {exc}") from exc
        except redis.exceptions.InvalidResponse as exc:
            raise StoreUnreachableError(f"the store at {redact_url(self.url)} is not a Redis server? {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"the store at {redact_url(self.url)} failed: {exc}") from exc


# --- choosing a store --------------------------------------------------------------------------------------------


def default_store_root() -> Path:
    """The embedded store's folder: <farm cache root>/store ($FARM_CACHE_DIR/store or ~/.cache/farm/store)."""
    return default_cache_dir() / "store"


def open_store(url: str | os.PathLike[str], retries: int = 1) -> Store:
    """The store a URL names: redis:// or rediss:// -> RedisStore, file://PATH or a plain path -> FileStore.

    `retries`: how many times a Redis store reconnects before an operation fails (workers wait out a restart).
    """
    if isinstance(url, os.PathLike):
        return FileStore(url)
    if url.startswith(_REDIS_SCHEMES):
        return RedisStore(url, retries=retries)
    if url.startswith(_FILE_SCHEME):
        return FileStore(url[len(_FILE_SCHEME) :])
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url):
        raise BadStoreUrlError(f"unknown store URL {redact_url(url)}: use redis://, rediss://, file:// or a path")
    return FileStore(url)
