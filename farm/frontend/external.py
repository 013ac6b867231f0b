"""Where a model's external data comes from: files beside the model (a local build, the submitting client), or the
farm's store by sha256 (a worker planning a split model: farm.frontend.split).

Models are untrusted input, and an external-data location is a string the model chose: `ModelFolder` reads only
files inside the model's folder (after resolving links and `..`), `StoredBlobs` only blobs named by a digest. This
module imports nothing heavy, since the submitting client checks locations with it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Protocol, Union

Buffer = Union[bytes, memoryview]
STORED_PREFIX = "sha256:"
STORED_LOCATION = re.compile(STORED_PREFIX + r"([0-9a-f]{64})")
"""A split graph's external-data location: the blob's sha256 (farm.frontend.split writes them)."""
DEFERRED_MIN_BYTES = 1 << 16
"""A farm job's external weights this big or bigger may be read only when their values are asked for
(StoredBlobs.deferrable): smaller ones (biases, norms' scales, shapes) are read at once, as passes and lowerings
often look at them."""


class ExternalDataError(ValueError):
    """An external-data reference that can't be followed; the message names the tensor."""


class ExternalData(Protocol):
    """Reads the bytes an external-data reference names."""

    def read(self, name: str, info: dict[str, str]) -> tuple[Buffer, str]:
        """(the bytes of tensor `name`'s external data described by `info` (location, offset, length), where they
        came from, for messages); ExternalDataError naming the tensor when they can't be read."""

    def digest(self, info: dict[str, str]) -> str | None:
        """The sha256 of the bytes `read` gives for `info`, when known without hashing them."""

    def deferrable(self, name: str, info: dict[str, str]) -> str | None:
        """The digest of tensor `name`'s bytes when their read may wait until something asks for their values (then
        `read` reads them), else None; ExternalDataError naming the tensor when they are known to be missing."""


def external_path(name: str, location: str, model_dir: str) -> str:
    """Resolve `location` inside model_dir; symlinks and '..' are resolved before the containment check."""
    if "\x00" in location:
        raise ExternalDataError(f"initializer {name!r}: external data path {location!r} contains a NUL byte")
    if not location or os.path.isabs(location):
        raise ExternalDataError(f"initializer {name!r}: external data path {location!r} must be relative to the model")
    resolved = os.path.realpath(os.path.join(model_dir, location))
    if os.path.commonpath([resolved, model_dir]) != model_dir:
        raise ExternalDataError(
            f"initializer {name!r}: external data path {location!r} resolves to {resolved}, outside the model's "
            f"folder {model_dir}"
        )
    if not os.path.isfile(resolved):
        raise ExternalDataError(f"initializer {name!r}: external data file {resolved} does not exist")
    return resolved


def _range(name: str, info: dict[str, str]) -> tuple[int, int]:
    """(offset, length; -1 for "to the end") of a reference."""
    try:
        offset, length = int(info.get("offset", 0)), int(info["length"]) if "length" in info else -1
    except ValueError as error:
        raise ExternalDataError(
            f"initializer {name!r}: external data offset or length is not a number ({error})"
        ) from None
    if offset < 0:
        raise ExternalDataError(f"initializer {name!r}: external data offset {offset} is negative")
    return offset, length


def _end(name: str, where: str, size: int, offset: int, length: int) -> int:
    """Where a reference's bytes end in a file or blob of `size` bytes (`length` -1: at its end). The offset and the
    length are the model's word, so they are checked against what is there before anything is read: a model that
    claims 2**62 bytes of a 24-byte file is refused naming both, not answered with a MemoryError."""
    end = size if length < 0 else offset + length
    if offset > size or end > size:
        claimed = f"{length} bytes" if length >= 0 else "anything"
        raise ExternalDataError(
            f"initializer {name!r}: external data {where} holds {size} bytes, not {claimed} at offset {offset}"
        )
    return end


class ModelFolder:
    """External data in files inside the model's folder, as exporters write it (`model.onnx.data`)."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir

    def read(self, name: str, info: dict[str, str]) -> tuple[Buffer, str]:
        file_path = external_path(name, info.get("location", ""), self.model_dir)
        offset, length = _range(name, info)
        try:
            with open(file_path, "rb") as f:
                end = _end(name, file_path, os.fstat(f.fileno()).st_size, offset, length)
                f.seek(offset)
                data = f.read(end - offset)
        except OSError as error:
            raise ExternalDataError(f"initializer {name!r}: can't read external data {file_path}: {error}") from error
        if len(data) != end - offset:  # the file shrank since its size was taken
            raise ExternalDataError(
                f"initializer {name!r}: external data {file_path} holds {len(data)} bytes at "
                f"offset {offset}, expected {end - offset}"
            )
        return data, file_path

    def digest(self, info: dict[str, str]) -> str | None:
        return None

    def deferrable(self, name: str, info: dict[str, str]) -> str | None:
        """Never: a file beside the model is mapped or read at once (cheap, and its bytes are already here)."""
        return None


class StoredBlobs:
    """External data that the submitting client uploaded as blobs (farm.frontend.split): a location is a blob's
    sha256, read with `read_blob(key)` (which checks the bytes against it); any other location is a file on the
    submitter's machine that was never uploaded, named as such."""

    def __init__(
        self, read_blob: Callable[[str, str], Buffer], present: Callable[[str, str], bool] | None = None
    ) -> None:
        """`present(key, name)`: whether blob `key` can be read (then a whole-blob reference may be deferred: read
        when its values are asked for); it raises, naming the tensor, when the blob is known to be missing."""
        self.read_blob, self.present = read_blob, present

    def read(self, name: str, info: dict[str, str]) -> tuple[Buffer, str]:
        location = info.get("location", "")
        match = STORED_LOCATION.fullmatch(location)
        if match is None:
            raise ExternalDataError(
                f"tensor {name!r}: external data {location[:200]!r} was not uploaded (farm submit "
                "uploads the external data of the main graph's initializers; save other "
                "tensors inside the model)"
            )
        offset, length = _range(name, info)
        data = self.read_blob(match.group(1), name)
        end = _end(name, f"blob {match.group(1)}", len(data), offset, length)
        return memoryview(data)[offset:end], f"blob {match.group(1)}"

    def digest(self, info: dict[str, str]) -> str | None:
        """The blob's key, when the reference is the whole blob (what farm.frontend.split writes)."""
        match = STORED_LOCATION.fullmatch(info.get("location", ""))
        return match.group(1) if match and info.get("offset", "0") == "0" else None

    def deferrable(self, name: str, info: dict[str, str]) -> str | None:
        """The blob's key when the reference is the whole blob and `present` says it can be read."""
        key = self.digest(info)
        return key if key is not None and self.present is not None and self.present(key, name) else None
