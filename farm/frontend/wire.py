"""Find the bytes of a model's big initializers in the file itself, so that import maps them instead of copying.

Parsing a ModelProto copies every initializer's raw_data out of the file into the message, and reading it as an
array copies it again: a 430 MB BERT-base took 0.18 s to read, 0.06 s to parse and 0.12 s to convert, a third of
its plan, with the weights in memory twice. `cut_raw_initializers` walks the protobuf wire format of the file's
top two levels (ModelProto.graph, GraphProto.initializer) and returns the model's bytes with the raw_data of each
big plain-numeric initializer cut out, and where in the file each one was; import parses the small remainder and
views each initializer's bytes in a read-only map of the file (farm.frontend.onnx_import).

Only what protobuf's own parse would accept is cut: a malformed varint, a length past its message's end or a group
raises WireError, and the caller parses the whole file the usual way, whose error names the problem. A field
repeated in one message keeps protobuf's rule (the last raw_data wins; every copy is cut)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

from farm.errors import ModelLoadError

MODEL_GRAPH = 7  # ModelProto.graph
GRAPH_INITIALIZER = 5  # GraphProto.initializer
TENSOR_DATA_TYPE = 2  # TensorProto.data_type
TENSOR_RAW_DATA = 9  # TensorProto.raw_data
TENSOR_DATA_LOCATION = 14  # TensorProto.data_location
VARINT, FIXED64, LENGTH_DELIMITED, START_GROUP, END_GROUP, FIXED32 = 0, 1, 2, 3, 4, 5

CUT_MIN_BYTES = 64 * 1024
"""Initializers smaller than this stay in the parsed message: mapping pays off for weights, not for shapes."""


class WireError(ValueError):
    """The bytes are not a protobuf message this reader can walk."""


@dataclass(frozen=True)
class RawSpan:
    """Where an initializer's raw_data lies in the file: its data_type (TensorProto.DataType) and byte range."""

    data_type: int
    offset: int
    length: int


def cut_raw_initializers(data: memoryview, min_bytes: int = CUT_MIN_BYTES) -> tuple[bytes, dict[int, RawSpan]]:
    """(the ModelProto's bytes without the raw_data of initializers of at least `min_bytes`, initializer index ->
    its RawSpan in `data`); the index counts GraphProto.initializer entries in file order, as the parse keeps them
    (a graph field given twice merges: its initializers append)."""
    cutter = _Cutter(data, min_bytes)
    pieces = [
        delimited(field, cutter.graph(body, end))
        if field == MODEL_GRAPH and wire == LENGTH_DELIMITED
        else bytes(data[start:end])
        for field, wire, start, body, end in fields(data, 0, len(data))
    ]
    return b"".join(pieces), cutter.spans


class _Cutter:
    def __init__(self, data: memoryview, min_bytes: int) -> None:
        self.data, self.min_bytes = data, min_bytes
        self.spans: dict[int, RawSpan] = {}
        self.initializers = 0

    def graph(self, begin: int, end: int) -> bytes:
        pieces: list[bytes] = []
        for field, wire, start, body, stop in fields(self.data, begin, end):
            if field == GRAPH_INITIALIZER and wire == LENGTH_DELIMITED:
                pieces.append(delimited(field, self.tensor(body, stop)))
                self.initializers += 1
            else:
                pieces.append(bytes(self.data[start:stop]))
        return b"".join(pieces)

    def tensor(self, begin: int, end: int) -> bytes:
        data = self.data
        tensor_fields = list(fields(data, begin, end))
        data_type, external, raw = 0, False, None
        for field, wire, _, body, stop in tensor_fields:
            if field == TENSOR_DATA_TYPE and wire == VARINT:
                data_type = varint(data, body)[0]
            elif field == TENSOR_DATA_LOCATION and wire == VARINT:
                external = varint(data, body)[0] != 0
            elif field == TENSOR_RAW_DATA and wire == LENGTH_DELIMITED:
                raw = (body, stop - body)
        if raw is None or external or raw[1] < self.min_bytes:
            return bytes(data[begin:end])
        self.spans[self.initializers] = RawSpan(data_type, *raw)
        return b"".join(
            bytes(data[start:stop])
            for field, wire, start, _, stop in tensor_fields
            if not (field == TENSOR_RAW_DATA and wire == LENGTH_DELIMITED)
        )


def fields(data: memoryview, begin: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, body start, field end) of each field of the message in [begin, end);
    a varint's or fixed field's body is its value. A group is a WireError: the cutter only walks what it can cut."""
    position = begin
    while position < end:
        field, wire, body, stop = _field_at(data, position, end)
        if wire == START_GROUP:
            raise WireError(f"wire type {wire} (a group) at byte {position}")
        yield field, wire, position, body, stop
        position = stop


def check_message(data: memoryview | bytes) -> None:
    """WireError unless `data` walks as a protobuf message at its top level: every tag and varint well formed,
    every length within the data, every group closed by its own end. Only the top level is walked (a length-delimited
    field is skipped, whatever it holds), so it costs a few reads per top-level field whatever the file's size; and
    it refuses only what protobuf's parse refuses too, so a command can refuse a file that is not a model (a text
    file, an image) before it imports the parser (farm.cli.submit)."""
    position, end = 0, len(data)
    while position < end:
        position = _field_at(data, position, end)[3]


def check_model_file(path: str | os.PathLike[str]) -> None:
    """ModelLoadError naming the file when it is not a protobuf message at all (check_message), read through a map:
    what a model file can be is then left to the parse."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as data:
            problem = _wire_problem(data)
    if problem:
        raise ModelLoadError(f"can't read ONNX model {path}: not a protobuf message ({problem})")


def _wire_problem(data: memoryview) -> str | None:
    try:
        check_message(data)
    except WireError as error:
        return str(error)
    return None


def _field_at(data: memoryview | bytes, position: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, body start, field end) of the field at `position`; a group is skipped whole, its
    end not a field of its own (_skip_group looks for it)."""
    tag, body = varint(data, position)
    field, wire = tag >> 3, tag & 7
    if field == 0:
        raise WireError(f"field number 0 at byte {position}")
    if wire == VARINT:
        stop = varint(data, body)[1]
    elif wire in (FIXED64, FIXED32):
        stop = body + (8 if wire == FIXED64 else 4)
    elif wire == LENGTH_DELIMITED:
        length, body = varint(data, body)
        stop = body + length
    elif wire == START_GROUP:
        stop = _skip_group(data, body, end, field)
    elif wire == END_GROUP:
        raise WireError(f"wire type {wire} at byte {position} closes no group")
    else:
        raise WireError(f"wire type {wire} at byte {position}")
    if stop > end:
        raise WireError(f"field {field} at byte {position} runs past its message's end")
    return field, wire, body, stop


def _skip_group(data: memoryview | bytes, position: int, end: int, field: int) -> int:
    """The position after the end of group `field` that starts at `position`."""
    while position < end:
        tag, after = varint(data, position)
        if tag & 7 == END_GROUP:
            if tag >> 3 != field:
                raise WireError(f"group {field} closed by the end of group {tag >> 3} at byte {position}")
            return after
        position = _field_at(data, position, end)[3]
    raise WireError(f"group {field} is never closed")


def varint(data: memoryview | bytes, position: int) -> tuple[int, int]:
    """(value, position after it)."""
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise WireError(f"malformed varint at byte {position}")
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            return value, position
        shift += 7


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def delimited(field: int, body: bytes) -> bytes:
    return encode_varint(field << 3 | LENGTH_DELIMITED) + encode_varint(len(body)) + body
