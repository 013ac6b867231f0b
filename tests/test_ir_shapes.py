"""Pinned shapes' value (farm.ir.shapes): parsing `--shape`, the limits, and their JSON form in job records and
manifests."""

from __future__ import annotations

import pytest

from farm.errors import BadInputError
from farm.ir.shapes import (
    MAX_PINS,
    MAX_SIZES,
    describe_size,
    parse_sizes,
    shapes_from_json,
    shapes_to_json,
    sizes_from_json,
    sizes_to_json,
)


def test_parse_sizes_takes_dimensions_and_whole_inputs():
    assert parse_sizes(["batch=2", "input_ids=1x128"]) == [{"batch": (2,), "input_ids": (1, 128)}]
    assert parse_sizes([]) == [{}]


def test_parse_sizes_builds_every_combination_of_the_values_first_pin_slowest():
    assert parse_sizes(["batch=1,8", "seq=64,128"]) == [
        {"batch": (1,), "seq": (64,)},
        {"batch": (1,), "seq": (128,)},
        {"batch": (8,), "seq": (64,)},
        {"batch": (8,), "seq": (128,)},
    ]
    assert parse_sizes(["input_ids=1x128,8x128"]) == [{"input_ids": (1, 128)}, {"input_ids": (8, 128)}]
    assert describe_size({"batch": (8,), "input_ids": (8, 128)}) == "batch=8 input_ids=8x128"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("batch", "expected NAME=SIZE"),
        ("=3", "expected NAME=SIZE"),
        ("batch=", "positive integers"),
        ("batch=two", "positive integers"),
        ("batch=-1", "positive integers"),
        ("batch=0", "from 1 to"),
        ("x=1x0x3", "from 1 to"),
        ("batch=1,,32", "positive integers"),
        ("batch=1,8,1", "a size is given twice"),
        ("x=1x２", "positive integers"),
        (f"batch={1 << 40}", "from 1 to"),
        ("bad\nname=1", "printable"),
    ],
)
def test_parse_sizes_names_the_malformed_spec(spec, message):
    with pytest.raises(BadInputError, match=message):
        parse_sizes([spec])


def test_parse_sizes_refuses_a_name_pinned_twice_too_many_pins_and_too_many_sizes():
    with pytest.raises(BadInputError, match="'batch' is pinned twice"):
        parse_sizes(["batch=1", "batch=2"])
    with pytest.raises(BadInputError, match=f"at most {MAX_PINS}"):
        parse_sizes([f"d{i}=1" for i in range(MAX_PINS + 1)])
    with pytest.raises(BadInputError, match=f"20 sizes .* at most {MAX_SIZES}"):
        parse_sizes(["batch=1,2,3,4,5", "seq=1,2,3,4"])


def test_shapes_json_round_trips_in_name_order_and_refuses_what_a_job_record_must_not_hold():
    shapes = {"seq": (128,), "batch": (1,), "x": (1, 3, 8, 8)}
    data = shapes_to_json(shapes)
    assert list(data) == ["batch", "seq", "x"] and shapes_from_json(data) == shapes
    for bad in ([1], {"batch": 1}, {"batch": [1.5]}, {"batch": [0]}, {"": [1]}, {"batch": [True]}):
        with pytest.raises(BadInputError):
            shapes_from_json(bad)


def test_sizes_json_round_trips_and_refuses_duplicates_mixed_names_and_too_many():
    sizes = parse_sizes(["batch=1,8", "seq=16"])
    assert sizes_from_json(sizes_to_json(sizes)) == sizes
    for bad in (
        [],
        {"batch": [1]},
        [{"batch": [1]}, {"batch": [1]}],
        [{"batch": [1]}, {"seq": [1]}],
        [{"batch": [n]} for n in range(1, MAX_SIZES + 2)],
    ):
        with pytest.raises(BadInputError):
            sizes_from_json(bad)
