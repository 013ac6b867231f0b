"""The cap of the Redis store (farm.store.redis_store), apart from its entries' reads and writes: the cap itself,
the eviction of the least recently used entries that no pin holds, the pins, the entries' ages, and the runner of the
store's Lua scripts (each gets the cap this process defaults to). RedisCap is the lowest of RedisStore's classes; what
RedisStore sets or defines that these need (the client, the prefix, the scripts, deleting the blob store's copies) is
declared on it."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from farm import defaults
from farm.store import redis_scripts
from farm.store.base import Eviction, Store, StoreError, StoreStats, check_key, check_owner, is_key
from farm.store.lua import LuaScript
from farm.store.redis_connection import reply_bytes, store_errors

if TYPE_CHECKING:
    from redis import Redis

EVICT_BATCH = 1000
"""Entries one eviction script deletes at most, so that Redis (which runs a script to its end) answers the queues
between batches."""


class RedisCap(Store):
    """The cap, eviction and pins of a RedisStore (which sets the client, the prefix and the scripts declared here)."""

    client: Redis
    prefix: str
    default_cap: int | None
    _pin: LuaScript
    _unpin: LuaScript
    _owners: LuaScript
    _stats: LuaScript
    _evict: LuaScript
    _adopt: LuaScript

    @abstractmethod
    def _delete_files(self, keys: Iterable[bytes | str]) -> None:
        """Delete the blob store's copies of entries whose headers are gone (those an eviction batch dropped)."""

    @property
    def max_bytes(self) -> int:
        with store_errors(self.url):
            published = self.client.get(f"{self.prefix}max_bytes")
        return int(published) if published else defaults.store_max_bytes()

    def set_max_bytes(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise StoreError(f"the store's cap must be a positive number of bytes, got {max_bytes}")
        with store_errors(self.url):
            self.client.set(f"{self.prefix}max_bytes", int(max_bytes))

    def pin(self, owner: str, keys: Iterable[str], ttl: float | None, replace: bool = False) -> None:
        ttl_ms = "" if ttl is None else str(max(1, int(ttl * 1000)))
        with store_errors(self.url):
            self._script(
                self._pin, check_owner(owner), ttl_ms, "1" if replace else "0", *(check_key(key) for key in keys)
            )

    def unpin(self, owner: str, keys: Iterable[str] | None = None) -> None:
        chosen = None if keys is None else [check_key(key) for key in keys]
        if chosen == []:
            return
        with store_errors(self.url):
            self._script(self._unpin, check_owner(owner), *(chosen or ()))

    def pin_owners(self) -> list[str]:
        with store_errors(self.url):
            return [owner.decode() for owner in redis_scripts.owner_names(self._script(self._owners))]

    def stats(self) -> StoreStats:
        with store_errors(self.url):
            entries, total, cap, pinned_entries, pinned_bytes, owners = redis_scripts.stats_counts(
                self._script(self._stats)
            )
        return StoreStats(
            int(entries),
            int(total),
            int(cap),
            int(pinned_entries),
            int(pinned_bytes),
            [owner.decode() for owner in owners],
        )

    def evict(self) -> Eviction:
        return self._evict_to(room=0)

    def _evict_to(self, room: int) -> Eviction:
        """Evict in batches of EVICT_BATCH entries until `room` bytes are free under the cap (or only pinned
        entries are left)."""
        freed_entries = freed_bytes = 0
        with store_errors(self.url):
            while True:
                entries, freed, left, more, dropped = redis_scripts.eviction_batch(
                    self._script(self._evict, EVICT_BATCH, room)
                )
                self._delete_files(dropped)
                freed_entries, freed_bytes = freed_entries + int(entries), freed_bytes + int(freed)
                if not int(more):
                    return Eviction(freed_entries, freed_bytes, int(left))

    def adopt_unaccounted(self) -> int:
        """Count the entries an older farm wrote before the store had a cap (they are the least recently used
        now); returns how many. A SCAN over the whole database: `farm store gc` runs it, nothing else."""
        adopted = 0
        with store_errors(self.url):
            batch: list[str] = []
            for name in self.client.scan_iter(match=f"{self.prefix}obj:*", count=1000):
                key = reply_bytes(name).decode(errors="replace")[len(self.prefix) + 4 :]
                if is_key(key):
                    batch.append(key)
                if len(batch) >= 1000:
                    adopted += int(redis_scripts.adopted_count(self._script(self._adopt, *batch)))
                    batch = []
            if batch:
                adopted += int(redis_scripts.adopted_count(self._script(self._adopt, *batch)))
        return adopted

    def _script(self, script: LuaScript, *args: object) -> object:
        """Run one of the store's Lua scripts with the prefix and this process's default cap before `args`."""
        cap = defaults.store_max_bytes() if self.default_cap is None else self.default_cap
        return script(args=[self.prefix, cap, *args])

    def keys_older_than(self, seconds: float) -> Iterator[str]:
        """The keys of entries last used more than `seconds` ago (by this Redis' clock)."""
        with store_errors(self.url):
            now, micros = self.client.time()
            oldest = int(now) * 1000 + int(micros) // 1000 - int(seconds * 1000)
            names = self.client.zrangebyscore(f"{self.prefix}lru", "-inf", oldest)
        for name in names:
            key = reply_bytes(name).decode(errors="replace")
            if is_key(key):
                yield key
