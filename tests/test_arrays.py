"""Tests of farm.cli.arrays: `farm run`'s inputs read from .npy files safely, its outputs written as .npz."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from farm.cli.arrays import parse_inputs, save_outputs, summary
from farm.errors import BadInputError


def test_inputs_are_read_by_name(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    feeds = parse_inputs((f"x={tmp_path / 'x.npy'}",))
    np.testing.assert_array_equal(feeds["x"], np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize(
    "pair, message",
    [
        ("x.npy", "expected NAME=FILE.npy"),
        ("x=", "expected NAME=FILE.npy"),
    ],
)
def test_malformed_pairs_are_refused(pair, message):
    with pytest.raises(BadInputError, match=message):
        parse_inputs((pair,))


def test_an_input_given_twice_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(2, np.float32))
    with pytest.raises(BadInputError, match="--input x is given twice"):
        parse_inputs((f"x={tmp_path / 'x.npy'}", f"x={tmp_path / 'x.npy'}"))


def test_a_pickle_is_never_loaded(tmp_path):
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(BadInputError, match="can't read .* as a .npy array") as error:
        parse_inputs((f"x={tmp_path / 'objects.npy'}",))
    assert "unsafely" not in str(error.value)


def test_outputs_are_written_under_the_name_given(tmp_path):
    save_outputs(str(tmp_path / "y.txt"), {"file": np.ones(3, np.float32)})
    assert zipfile.ZipFile(tmp_path / "y.txt").namelist() == ["file.npy"]
    assert summary("y", np.float32([1, 5, 2])) == "y: shape [3] float32 argmax 1 [1, 5, 2]"
