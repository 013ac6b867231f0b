"""FileStore: entries as files under a folder (one machine, or a shared file system); the embedded default."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from farm.atomic import write_atomically
from farm.store.base import (
    EMPTY_KEY,
    BadStoreUrlError,
    CorruptEntryError,
    Data,
    MissingEntryError,
    Store,
    StoreError,
    as_bytes_view,
    check_key,
    is_key,
)

FILE_SCHEME = "file://"


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
        return FILE_SCHEME + str(self.root)

    def object_path(self, key: str) -> Path:
        """Where the entry of `key` lives (fan-out by the first two hex digits keeps folders small)."""
        check_key(key)
        return self.objects / key[:2] / key

    def ref_path(self, name: str) -> Path:
        """Where the ref `name` lives; hashing the name makes any string a safe file name."""
        return self.refs / hashlib.sha256(name.encode("utf-8")).hexdigest()

    def put(self, data: Data) -> str:
        view = as_bytes_view(data)
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
