"""Pinned shapes (`farm submit --shape`) as a value every stage shares: the sizes a build fixes for a model's
dynamic dimensions, their limits, their parsing and their JSON form.

Exporters leave a model's batch or sequence length symbolic (`[batch, 3, 224, 224]`, `input_ids: [batch, seq]`).
A pin names either a symbolic dimension (`batch=1`: every input dimension of that name) or a whole input
(`input_ids=1x128`). Pins come from the command line and, on the farm, from a job record; an artifact's manifest
lists its sizes: all are untrusted, so every name and size is checked where it is read (parse_sizes,
sizes_from_json). The frontend writes them into a model (farm.frontend.shapes); the protocol, the runtime and the
CLI read and show them, which is why they live here, below every stage, without onnx.

A pin may give several sizes (`batch=1,8,32`, `input_ids=1x128,8x128`): the build then plans the model once per
combination (a *size*: one PinnedShapes each, the product of every pin's values) and the artifact holds a schedule
per size over the same weight members; the runtime runs the size whose inputs match the feeds
(farm.build.assembly, farm.runtime.sized).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from farm.errors import BadInputError

MAX_PINS = 64
"""The most pins one build takes (a model has a handful of symbolic dimensions)."""
MAX_PIN_NAME = 256
"""The longest input or dimension name a pin may give."""
MAX_PIN_SIZE = 1 << 31
"""The largest size a pinned dimension may have (tensor sizes are checked against farm's limit afterwards)."""
MAX_SIZES = 16
"""The most sizes one artifact holds (the product of every pin's values): each is a whole plan and library."""

PinnedShapes = dict[str, tuple[int, ...]]
"""Pinned sizes by name: one size for a symbolic dimension or a one-dimensional input, several for an input."""


def parse_sizes(specs: Iterable[str]) -> list[PinnedShapes]:
    """`--shape` values (NAME=SIZE or NAME=AxBxC, several separated by commas) as the sizes to build: one
    PinnedShapes per combination of the values, the first pin's varying slowest ([{}] without any). BadInputError
    naming the spec that is malformed, a name given twice, a value given twice, or more than MAX_SIZES sizes."""
    choices: dict[str, list[tuple[int, ...]]] = {}
    for spec in specs:
        name, sep, values = spec.partition("=")
        if not sep or not name:
            raise BadInputError(
                f"--shape {spec!r}: expected NAME=SIZE (a symbolic dimension, e.g. batch=1) or "
                f"INPUT=AxBxC (a whole input, e.g. input_ids=1x128), several separated by commas"
            )
        if name in choices:
            raise BadInputError(
                f"--shape {spec!r}: {name!r} is pinned twice (give its sizes in one --shape, "
                f"separated by commas: {name}=1,8)"
            )
        choices[name] = [_sizes(spec, value) for value in values.split(",")]
        if len(set(choices[name])) != len(choices[name]):
            raise BadInputError(f"--shape {spec!r}: a size is given twice")
    count = 1
    for options in choices.values():
        count *= len(options)
    if count > MAX_SIZES:
        raise BadInputError(
            f"--shape: {count} sizes (every combination of the values given); one artifact holds at most {MAX_SIZES}"
        )
    return [_checked(dict(zip(choices, combination))) for combination in itertools.product(*choices.values())]


def _sizes(spec: str, text: str) -> tuple[int, ...]:
    parts = text.split("x")
    if not all(part.isdigit() and part.isascii() for part in parts):
        raise BadInputError(
            f"--shape {spec!r}: sizes are positive integers separated by 'x' (1x128), values by ',' (1,8,32)"
        )
    return tuple(int(part) for part in parts)


def describe_size(pins: Mapping[str, tuple[int, ...]]) -> str:
    """One size as --shape spells it: `batch=8 seq=128` (`static` without pins)."""
    return " ".join(f"{name}={'x'.join(map(str, pins[name]))}" for name in pins) or "static"


def shapes_to_json(pins: Mapping[str, tuple[int, ...]]) -> dict[str, list[int]]:
    """Pins as JSON, in name order (they are part of a build's identity)."""
    return {name: list(pins[name]) for name in sorted(pins)}


def shapes_from_json(data: object) -> PinnedShapes:
    """Pins read back from a job record or a message; BadInputError unless they are {name: [sizes]} within the
    limits parse_sizes enforces."""
    if not isinstance(data, dict) or not all(
        isinstance(sizes, list) and all(type(s) is int for s in sizes) for sizes in data.values()
    ):
        raise BadInputError(f"pinned shapes are {{name: [sizes]}}, got {str(data)[:200]!r}")
    return _checked({name: tuple(sizes) for name, sizes in data.items()})


def sizes_to_json(sizes: Sequence[Mapping[str, tuple[int, ...]]]) -> list[dict[str, list[int]]]:
    """Sizes as JSON (each as shapes_to_json), in build order (which is the artifact's order of sizes)."""
    return [shapes_to_json(pins) for pins in sizes]


def sizes_from_json(data: object) -> list[PinnedShapes]:
    """Sizes read back from a job record or a manifest; BadInputError unless they are a list of 1 to MAX_SIZES
    distinct pins (each as shapes_from_json), all pinning the same names."""
    if not isinstance(data, list) or not 1 <= len(data) <= MAX_SIZES:
        raise BadInputError(f"sizes are a list of 1 to {MAX_SIZES} pinned shapes, got {str(data)[:200]!r}")
    sizes = [shapes_from_json(pins) for pins in data]
    if (
        len({tuple(sorted(pins.items())) for pins in sizes}) != len(sizes)
        or len({tuple(sorted(pins)) for pins in sizes}) != 1
    ):
        raise BadInputError(f"sizes must be distinct and pin the same names, got {str(data)[:200]!r}")
    return sizes


def _checked(pins: PinnedShapes) -> PinnedShapes:
    if len(pins) > MAX_PINS:
        raise BadInputError(f"{len(pins)} pinned shapes; at most {MAX_PINS}")
    for name, sizes in pins.items():
        if not isinstance(name, str) or not name or len(name) > MAX_PIN_NAME or not name.isprintable():
            raise BadInputError(f"pinned shape name {str(name)[:80]!r}: 1 to {MAX_PIN_NAME} printable characters")
        if not sizes or not all(1 <= size <= MAX_PIN_SIZE for size in sizes):
            raise BadInputError(
                f"--shape {name}={'x'.join(map(str, sizes))}: every size is an integer from 1 to {MAX_PIN_SIZE}"
            )
    return pins
