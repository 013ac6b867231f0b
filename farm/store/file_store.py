"""FileStore: entries as files under a folder (one machine, or a shared file system); the embedded default."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from farm import defaults
from farm.atomic import write_atomically
from farm.store.base import (
    EMPTY_KEY,
    BadStoreUrlError,
    CorruptEntryError,
    Data,
    Eviction,
    MissingEntryError,
    Store,
    StoreError,
    StoreStats,
    as_bytes_view,
    check_key,
    check_owner,
    is_key,
)

FILE_SCHEME = "file://"


class FileStore(Store):
    """Entries as files: objects at <root>/objects/<key[:2]>/<key>, refs at <root>/refs/<sha256(name)>.

    Every write goes to a temporary file in the destination folder and is renamed into place (os.replace is atomic),
    so a reader in any thread or process sees a whole file or none, and concurrent writers of one key just replace
    one complete copy with another.

    The cap is not enforced on every put (that would need a walk of the folder, or a shared count that files can't
    keep cheaply): `evict` (`farm store gc`) walks the entries and deletes the least recently used (by mtime,
    which get and put refresh) that no pin holds. Pins are JSON files <root>/pins/<sha256(owner)>.json, changed
    under a lock file that eviction holds too; the published cap is <root>/max_bytes.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        if not str(root):
            raise BadStoreUrlError("a file store needs a folder; got an empty path")
        self.root = Path(root).expanduser().absolute()
        self.objects = self.root / "objects"
        self.refs = self.root / "refs"
        self.pins = self.root / "pins"

    @property
    def url(self) -> str:
        return FILE_SCHEME + str(self.root)

    def object_path(self, key: str) -> Path:
        """Where the entry of `key` lives (fan-out by the first two hex digits keeps folders small)."""
        check_key(key)
        return self.objects / key[:2] / key

    def ref_path(self, name: str) -> Path:
        """Where the ref `name` lives; hashing the name makes any string a safe file name."""
        return self.refs / hashlib.sha256(name.encode("utf-8")).hexdigest()

    def put(self, data: Data, key: str | None = None) -> str:
        view = as_bytes_view(data)
        key = key or hashlib.sha256(view).hexdigest()
        path = self.object_path(key)
        if self._present(path, key):
            self._mark_used(path)
        else:
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
        self._mark_used(path)
        return data

    def has(self, key: str) -> bool:
        return self._present(self.object_path(key), key)

    def incomplete(self, keys: Iterable[str]) -> list[str]:
        lacking = []
        for key in keys:
            path = self.object_path(key)
            if self._present(path, key):
                self._mark_used(path)
            else:
                lacking.append(key)
        return lacking

    def lacking(self, sizes: dict[str, int]) -> list[str]:
        """Those of the entries (key -> size) without a file of that size here (a Redis store's header counts
        them, and keeps their bytes here: FARM_BLOB_STORE)."""
        lacking = []
        for key, size in sizes.items():
            try:
                whole = self.object_path(key).stat().st_size == size
            except OSError:
                whole = False
            if not whole:
                lacking.append(key)
        return lacking

    def keys_older_than(self, seconds: float) -> Iterator[str]:
        """The keys of entries whose file was last touched more than `seconds` ago."""
        oldest = time.time_ns() - int(seconds * 1e9)
        for used, _, key, _ in self._entries():
            if used < oldest:
                yield key

    def delete(self, key: str) -> None:
        self.object_path(key).unlink(missing_ok=True)

    def set_ref(self, name: str, key: str, anchor: str | None = None) -> None:
        """Refs here outlive their entries (a dangling one reads as a miss), so `anchor` changes nothing."""
        write_atomically(self.ref_path(name), check_key(key).encode("ascii"))

    def get_ref(self, name: str) -> str | None:
        """The target of `name`; a ref file that doesn't hold a key counts as no ref (a cache miss, then rewritten)."""
        try:
            text = self.ref_path(name).read_text(encoding="ascii", errors="replace").strip()
        except FileNotFoundError:
            return None
        return text if is_key(text) else None

    def delete_ref(self, name: str) -> None:
        self.ref_path(name).unlink(missing_ok=True)

    # -- the cap, eviction and pins --

    @property
    def max_bytes(self) -> int:
        try:
            return int((self.root / "max_bytes").read_text(encoding="ascii"))
        except (FileNotFoundError, ValueError):
            return defaults.store_max_bytes()

    def set_max_bytes(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise StoreError(f"the store's cap must be a positive number of bytes, got {max_bytes}")
        write_atomically(self.root / "max_bytes", str(int(max_bytes)).encode("ascii"))

    def pin(self, owner: str, keys: Iterable[str], ttl: float | None, replace: bool = False) -> None:
        chosen = {check_key(key) for key in keys}
        path = self._pin_path(check_owner(owner))
        with self._pin_lock():
            if not replace:
                chosen |= set(self._read_pin(path).get("keys", []))
            if not chosen:
                path.unlink(missing_ok=True)
                return
            pin = {"owner": owner, "expires": None if ttl is None else time.time() + ttl, "keys": sorted(chosen)}
            write_atomically(path, json.dumps(pin).encode())

    def unpin(self, owner: str, keys: Iterable[str] | None = None) -> None:
        path = self._pin_path(check_owner(owner))
        with self._pin_lock():
            pin = self._read_pin(path)
            left = set() if keys is None else set(pin.get("keys", [])) - set(keys)
            if left:
                write_atomically(path, json.dumps({**pin, "keys": sorted(left)}).encode())
            else:
                path.unlink(missing_ok=True)

    def pin_owners(self) -> list[str]:
        return sorted(self._live_pins())

    def stats(self) -> StoreStats:
        entries = list(self._entries())
        pinned = self._pinned_keys(self._live_pins())
        pinned_sizes = [size for _, size, key, _ in entries if key in pinned]
        return StoreStats(
            len(entries),
            sum(size for _, size, _, _ in entries),
            self.max_bytes,
            len(pinned_sizes),
            sum(pinned_sizes),
            self.pin_owners(),
        )

    def evict(self) -> Eviction:
        """Delete the least recently used unpinned entries until the entries' bytes are within the cap (pins
        can't change meanwhile: this holds the pin lock)."""
        cap, freed_entries, freed_bytes = self.max_bytes, 0, 0
        with self._pin_lock():
            self._delete_expired_pins()
            pinned = self._pinned_keys(self._live_pins())
            entries = sorted(self._entries())
            left = sum(size for _, size, _, _ in entries)
            for _, size, key, path in entries:
                if left <= cap:
                    break
                if key not in pinned:
                    path.unlink(missing_ok=True)
                    left, freed_entries, freed_bytes = left - size, freed_entries + 1, freed_bytes + size
        return Eviction(freed_entries, freed_bytes, left)

    def _entries(self) -> Iterator[tuple[int, int, str, Path]]:
        """(last use in ns, size, key, path) of every entry (temporary files of puts under way are left out)."""
        if not self.objects.is_dir():
            return
        for folder in self.objects.iterdir():
            for path in folder.iterdir() if folder.is_dir() else ():
                with contextlib.suppress(FileNotFoundError):
                    if is_key(path.name):
                        info = path.stat()
                        yield info.st_mtime_ns, info.st_size, path.name, path

    def _pin_path(self, owner: str) -> Path:
        return self.pins / f"{hashlib.sha256(owner.encode()).hexdigest()}.json"

    @contextlib.contextmanager
    def _pin_lock(self) -> Iterator[None]:
        """One writer of pins at a time, and none while an eviction pass decides what to delete."""
        self.pins.mkdir(parents=True, exist_ok=True)
        with open(self.pins / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @staticmethod
    def _read_pin(path: Path) -> dict:
        """A pin file's contents; {} when it is missing or unreadable (a damaged pin protects nothing)."""
        try:
            pin = json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return {}
        return pin if isinstance(pin, dict) else {}

    def _live_pins(self) -> dict[str, list[str]]:
        """Owner -> pinned keys of every pin that hasn't expired."""
        live, now = {}, time.time()
        for path in self.pins.glob("*.json") if self.pins.is_dir() else ():
            pin = self._read_pin(path)
            expires = pin.get("expires")
            if isinstance(pin.get("owner"), str) and (expires is None or expires > now):
                live[pin["owner"]] = [key for key in pin.get("keys", []) if is_key(key)]
        return live

    def _delete_expired_pins(self) -> None:
        now = time.time()
        for path in self.pins.glob("*.json"):
            expires = self._read_pin(path).get("expires")
            if isinstance(expires, (int, float)) and expires <= now:
                path.unlink(missing_ok=True)

    @staticmethod
    def _pinned_keys(pins: dict[str, list[str]]) -> set[str]:
        return {key for keys in pins.values() for key in keys}

    @staticmethod
    def _mark_used(path: Path) -> None:
        """A use moves the entry's mtime to now (eviction's order); a file this process may not touch keeps its
        old one."""
        with contextlib.suppress(OSError):
            os.utime(path)

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
