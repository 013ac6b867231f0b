"""RedisStore: entries in Redis, values split into chunks so that no single command carries a big value."""

from __future__ import annotations

import contextlib
import hashlib
import io
from collections.abc import Iterator
from typing import NoReturn

from farm.errors import credentials_refused, redact_url
from farm.store.base import (
    BadStoreUrlError,
    CorruptEntryError,
    Data,
    MissingEntryError,
    Store,
    StoreError,
    StoreUnreachableError,
    as_bytes_view,
    check_key,
    is_key,
)

REDIS_SCHEMES = ("redis://", "rediss://")


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
        return f"{self.prefix}obj:{check_key(key)}"

    def chunk_key(self, key: str, index: int) -> str:
        """The Redis key of chunk `index` of the entry `key`."""
        return f"{self.prefix}obj:{check_key(key)}:{index}"

    def ref_key(self, name: str) -> str:
        """The Redis key of the ref `name` (Redis keys are binary-safe, so any name will do)."""
        return f"{self.prefix}ref:{name}"

    def put(self, data: Data) -> str:
        view = as_bytes_view(data)
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
            self.client.set(self.ref_key(name), check_key(key))

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
        except (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError) as exc:
            raise StoreUnreachableError(credentials_refused(self.url)) from exc
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            raise StoreUnreachableError(f"can't reach the store at {redact_url(self.url)}: {exc}") from exc
        except redis.exceptions.InvalidResponse as exc:
            raise StoreUnreachableError(f"the store at {redact_url(self.url)} is not a Redis server? {exc}") from exc
        except redis.exceptions.RedisError as exc:
            raise StoreError(f"the store at {redact_url(self.url)} failed: {exc}") from exc
