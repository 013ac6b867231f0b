"""The staging area of the Redis store (farm.store.redis_store), as a worker weighs and checks what submitters
wrote there: the uploads in it by team (what RedisStore.trim_staging keeps under each team's quota), and the lengths
of one staged upload's chunks, checked before any is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from farm import defaults
from farm.store.base import CorruptEntryError
from farm.store.expiry import SCAN_COUNT


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
