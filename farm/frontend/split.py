"""A model split for the farm: its graph, and each weight as a blob named by its sha256.

A farm moves a weight's bytes once (docs/architecture.md, "Submitting by digest"): the submitting client sends the
graph and only the weights the farm's store lacks, each under its sha256, and the workers read them by key. The
client stays light (this module imports neither onnx nor numpy): it walks the protobuf wire format of the
ModelProto (farm.frontend.wire) and rewrites each of the main graph's initializers whose bytes are a blob into an
external-data reference whose location is the blob's sha256 (`STORED_LOCATION`), with its length. A blob is an
initializer's raw_data of at least wire.CUT_MIN_BYTES, or an initializer whose data is external already (read from
its file, which must lie inside the model's folder, as a local build reads it). Nothing else of the graph changes,
so the worker's import (farm.frontend.onnx_import with farm.frontend.external.StoredBlobs) sees the same tensors as
a local build's import of the file, and builds the same artifact.

External data anywhere else (a Constant node's tensor, a subgraph's initializer) is not uploaded; the worker's
import names such a tensor.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from farm.frontend import wire
from farm.frontend.external import STORED_LOCATION, STORED_PREFIX, external_path

TENSOR_NAME = 8  # TensorProto.name
TENSOR_EXTERNAL_DATA = 13  # TensorProto.external_data (StringStringEntryProto: key = 1, value = 2)
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


class SplitError(ValueError):
    """The model can't be split: an external data reference that is malformed or leaves the model's folder."""


@dataclass(frozen=True)
class BlobSource:
    """Where a blob's bytes are on the submitting machine: a file and a byte range of it."""

    path: str
    offset: int
    length: int

    def read(self) -> bytes:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(self.length)
        if len(data) != self.length:
            raise OSError(f"{self.path}: {len(data)} bytes at offset {self.offset}, expected {self.length}")
        return data

    def chunks(self, size: int) -> Iterator[memoryview]:
        """The bytes in pieces of at most `size` (one piece in memory at a time)."""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.length
            while left > 0:
                piece = f.read(min(size, left))
                if not piece:
                    raise OSError(f"{self.path} ended {left} bytes early")
                left -= len(piece)
                yield memoryview(piece)


@dataclass
class SplitModel:
    """The graph's bytes (the ModelProto with blob references), the sha256 of the model file as submitted, and each
    blob's source by its sha256."""

    graph: bytes
    model_sha256: str
    blobs: dict[str, BlobSource] = field(default_factory=dict)

    @property
    def graph_key(self) -> str:
        return hashlib.sha256(self.graph).hexdigest()

    @property
    def blob_bytes(self) -> int:
        return sum(source.length for source in self.blobs.values())


def split_model(path: str | os.PathLike[str], min_bytes: int = wire.CUT_MIN_BYTES) -> SplitModel:
    """Split the model file at `path`; SplitError names an external reference that can't be followed. A file that
    isn't a protobuf message this reader can walk is sent whole, for the worker's import to say what is wrong."""
    path = os.path.abspath(path)
    folder = os.path.realpath(os.path.dirname(path))
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else memoryview(b"")
    try:
        try:
            sources = _Splitter(data, path, folder, min_bytes).sources()
        except wire.WireError:
            return SplitModel(bytes(data), _sha256(data))
        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1))) as pool:
            file_digest = pool.submit(_sha256, data)
            keys = list(pool.map(_source_digest, sources))
        graph = _Splitter(data, path, folder, min_bytes, keys).model()
        return SplitModel(graph, file_digest.result(), dict(zip(keys, sources)))
    finally:
        data.release()


def _sha256(data: memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def _source_digest(source: BlobSource) -> str:
    """The sha256 of a blob's bytes, read through a map of its file (hashlib releases the GIL on big buffers)."""
    if source.length == 0:
        return hashlib.sha256(b"").hexdigest()
    with open(source.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return hashlib.sha256(view[source.offset : source.offset + source.length]).hexdigest()
        finally:
            view.release()


class _Splitter:
    """One walk of a model's wire format. `sources()` lists the blobs' sources in file order; `model()` writes the
    ModelProto with each one's bytes replaced by a reference to `keys[i]`, its sha256."""

    def __init__(self, data: memoryview, path: str, folder: str, min_bytes: int, keys: list[str] | None = None) -> None:
        self.data, self.path, self.folder, self.min_bytes, self.keys = data, path, folder, min_bytes, keys
        self.found: list[BlobSource] = []

    def sources(self) -> list[BlobSource]:
        self.model()
        return self.found

    def model(self) -> bytes:
        pieces = [
            wire.delimited(number, self.graph(body, end))
            if number == wire.MODEL_GRAPH and kind == wire.LENGTH_DELIMITED
            else bytes(self.data[start:end])
            for number, kind, start, body, end in wire.fields(self.data, 0, len(self.data))
        ]
        return b"".join(pieces)

    def graph(self, begin: int, end: int) -> bytes:
        pieces = [
            wire.delimited(number, self.tensor(body, stop))
            if number == wire.GRAPH_INITIALIZER and kind == wire.LENGTH_DELIMITED
            else bytes(self.data[start:stop])
            for number, kind, start, body, stop in wire.fields(self.data, begin, end)
        ]
        return b"".join(pieces)

    def tensor(self, begin: int, end: int) -> bytes:
        data = self.data
        fields = list(wire.fields(data, begin, end))
        source = self._source(fields)
        if source is None:
            return bytes(data[begin:end])
        key = self.keys[len(self.found)] if self.keys is not None else "0" * 64
        self.found.append(source)
        replaced = (TENSOR_EXTERNAL_DATA, wire.TENSOR_DATA_LOCATION, wire.TENSOR_RAW_DATA)
        return b"".join(
            bytes(data[start:stop]) for number, _, start, _, stop in fields if number not in replaced
        ) + _reference(key, source.length)

    def _source(self, fields: list[tuple[int, int, int, int, int]]) -> BlobSource | None:
        """Where the tensor's bytes are, when they make a blob: its raw_data in this file, or its external data."""
        data = self.data
        raw, external, entries, name = None, False, {}, ""
        for number, kind, _, body, stop in fields:
            if number == wire.TENSOR_RAW_DATA and kind == wire.LENGTH_DELIMITED:
                raw = (body, stop - body)
            elif number == wire.TENSOR_DATA_LOCATION and kind == wire.VARINT:
                external = wire.varint(data, body)[0] == EXTERNAL
            elif number == TENSOR_EXTERNAL_DATA and kind == wire.LENGTH_DELIMITED:
                key, value = _entry(data, body, stop)
                entries[key] = value
            elif number == TENSOR_NAME and kind == wire.LENGTH_DELIMITED:
                name = bytes(data[body:stop]).decode("utf-8", "replace")
        if external:
            return self._external(name, entries)
        if raw is None or raw[1] < self.min_bytes:
            return None
        return BlobSource(self.path, *raw)

    def _external(self, name: str, entries: dict[str, str]) -> BlobSource:
        """The external data's file range, checked as a local build's import checks it (inside the model's
        folder, within the file)."""
        try:
            resolved = external_path(name, entries.get("location", ""), self.folder)
            offset = int(entries.get("offset", "0"))
            size = os.path.getsize(resolved)
            length = int(entries["length"]) if "length" in entries else size - offset
        except (ValueError, OSError) as error:
            raise SplitError(f"{self.path}: initializer {name!r}: {error}") from None
        if offset < 0 or length < 0 or offset + length > size:
            raise SplitError(
                f"{self.path}: initializer {name!r}: external data {resolved} holds {size} bytes, "
                f"not {length} at offset {offset}"
            )
        return BlobSource(resolved, offset, length)


def _entry(data: memoryview, begin: int, end: int) -> tuple[str, str]:
    """A StringStringEntryProto's key and value."""
    found = {1: "", 2: ""}
    for number, kind, _, body, stop in wire.fields(data, begin, end):
        if number in found and kind == wire.LENGTH_DELIMITED:
            found[number] = bytes(data[body:stop]).decode("utf-8", "replace")
    return found[1], found[2]


def _reference(key: str, length: int) -> bytes:
    """The fields that make a tensor's data the blob `key`: external_data location and length, data_location."""
    entries = b"".join(
        wire.delimited(TENSOR_EXTERNAL_DATA, wire.delimited(1, name.encode()) + wire.delimited(2, value.encode()))
        for name, value in (("location", STORED_PREFIX + key), ("length", str(length)))
    )
    return entries + wire.encode_varint(wire.TENSOR_DATA_LOCATION << 3 | wire.VARINT) + wire.encode_varint(EXTERNAL)


def stored_blobs(graph: bytes) -> dict[str, int]:
    """The blobs a split graph's main-graph initializers name, each once in file order, with the length the
    reference gives (-1 when it gives none): what a worker reads (and a job pins) to plan it, and what the job
    holds in the store. Locations that aren't blob references are left to the import, which names them."""
    data, blobs = memoryview(graph), {}
    for number, kind, _, body, end in wire.fields(data, 0, len(data)):
        if number != wire.MODEL_GRAPH or kind != wire.LENGTH_DELIMITED:
            continue
        for field_number, field_kind, _, tensor, stop in wire.fields(data, body, end):
            if field_number == wire.GRAPH_INITIALIZER and field_kind == wire.LENGTH_DELIMITED:
                blobs.update(_stored_reference(data, tensor, stop))
    return blobs


def stored_blob_keys(graph: bytes) -> list[str]:
    """The keys of stored_blobs(graph)."""
    return list(stored_blobs(graph))


def _stored_reference(data: memoryview, begin: int, end: int) -> dict[str, int]:
    """{key: length} of a tensor whose external data is a blob; {} for any other tensor."""
    entries = dict(
        _entry(data, body, stop)
        for number, kind, _, body, stop in wire.fields(data, begin, end)
        if number == TENSOR_EXTERNAL_DATA and kind == wire.LENGTH_DELIMITED
    )
    match = STORED_LOCATION.fullmatch(entries.get("location", ""))
    if match is None:
        return {}
    length = entries.get("length", "")
    return {match.group(1): int(length) if length.isdigit() and len(length) < 20 else -1}
