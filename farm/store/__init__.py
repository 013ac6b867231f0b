"""The content-addressed store: every big byte string of a build (model, object, library, artifact) lives here.

Entries are named by the sha256 of their bytes, so a key names one value anywhere, a second put of the same bytes
costs nothing, and a reader can always check what it got. Celery messages carry keys, never the bytes.

The store is also the compile cache and the tuning database: refs (farm.store.refs) are small named pointers to
keys ("kernel:<compiler key>:<spec key>" -> object key), so a worker that finds a ref skips the compile. Two
backends share one interface (farm.store.base.Store):

- `FileStore(root)` (farm.store.file_store): files under a folder; the embedded default.
- `RedisStore(url)` (farm.store.redis_store): keys in Redis, values in chunks.

`open_store(url)` picks the backend from a URL, and `store.url` gives the URL that reopens the same store, so a
store can be named in a message and reopened in another process. The store sits below the build: local builds,
the farm and the tuning database all use it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm import defaults
from farm.errors import redact_url
from farm.store.base import (
    REDIS_SCHEMES,
    BadStoreUrlError,
    CorruptEntryError,
    MissingEntryError,
    Store,
    StoreError,
    StoreUnreachableError,
    content_key,
    is_key,
)
from farm.store.file_store import FILE_SCHEME, FileStore

if TYPE_CHECKING:
    from farm.store.redis_store import RedisStore

__all__ = [
    "BadStoreUrlError",
    "CorruptEntryError",
    "FileStore",
    "MissingEntryError",
    "RedisStore",
    "Store",
    "StoreError",
    "StoreUnreachableError",
    "content_key",
    "default_store_root",
    "is_key",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """RedisStore, imported on first use: the Redis client takes 0.1 s to import, which a local build (its
    submitting process and each of its compile workers) never needs."""
    if name == "RedisStore":
        from farm.store.redis_store import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_store_root() -> Path:
    """The embedded store's folder: <farm cache root>/store ($FARM_CACHE_DIR/store or ~/.cache/farm/store)."""
    return defaults.cache_dir() / "store"


def open_store(url: str | os.PathLike[str], retries: int = 1) -> Store:
    """The store a URL names: redis:// or rediss:// -> RedisStore (its entries' bytes where FARM_BLOB_STORE says:
    a folder or a Redis of their own), file://PATH or a plain path -> FileStore.

    `retries`: how many times a Redis store reconnects before an operation fails (workers wait out a restart).
    """
    if isinstance(url, os.PathLike):
        return FileStore(url)
    if url.startswith(REDIS_SCHEMES):
        from farm.store.redis_store import RedisStore

        return RedisStore(url, retries=retries, blobs=_blob_store(defaults.blob_store_url(), retries))
    if url.startswith(FILE_SCHEME):
        return FileStore(url[len(FILE_SCHEME) :])
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", url):
        raise BadStoreUrlError(f"unknown store URL {redact_url(url)}: use redis://, rediss://, file:// or a path")
    return FileStore(url)


def _blob_store(url: str | None, retries: int) -> FileStore | RedisStore | None:
    """The blob store FARM_BLOB_STORE names: a folder, a Redis of its own, or None (chunks in the store's Redis)."""
    if url is None:
        return None
    if url.startswith(REDIS_SCHEMES):
        from farm.store.redis_store import blob_redis

        return blob_redis(url, retries=retries)
    return FileStore(url[len(FILE_SCHEME) :])
