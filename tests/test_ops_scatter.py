"""farm.ops.scatter against onnxruntime: ScatterElements (every axis, negative indices, the reductions), Scatter
(opsets 9 and 10) and ScatterND (element and slice updates, the reductions), on float32, int64, int32 and bool data.
Duplicate indices under reduction "none" are undefined in ONNX; farm applies the updates in order (the last one
wins), as ONNX's reference evaluator does, which those cases are compared with."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from numerics import (
    OpCase,
    assert_refused,
    assert_unsupported,
    case,
    check_case,
    check_case_on_opencl,
    hostile_op_model,
    params,
    single_op_model,
)
from test_ops_tensor import i64, onnx_reference, sample

OPSET = 18
DATA = (4, 5, 3)


def unique_indices(
    data_shape: Sequence[int], index_shape: Sequence[int], axis: int, seed: int = 0, dtype: str = "int64"
) -> np.ndarray:
    """Indices along `axis` without a repeat in any fibre (so that reduction "none" is defined), half of them
    negative (counted from the end)."""
    rng = np.random.default_rng(seed)
    fibres = list(index_shape)
    fibres[axis] = data_shape[axis]
    order = np.argsort(rng.random(fibres), axis=axis)
    picked = np.take(order, np.arange(index_shape[axis]), axis=axis)
    flip = rng.random(picked.shape) < 0.5
    return np.where(flip, picked - data_shape[axis], picked).astype(dtype)


def repeating_indices(index_shape: Sequence[int], size: int, seed: int = 0) -> np.ndarray:
    """Indices into an axis of `size` drawn with repeats from [-size, size)."""
    return np.random.default_rng(seed).integers(-size, size, index_shape).astype(np.int64)


def _elements(
    id: str,
    data_shape,
    index_shape,
    indices: np.ndarray,
    axis: int | None = None,
    reduction: str | None = None,
    dtype: str = "float32",
    op: str = "ScatterElements",
    opset: int = OPSET,
    reference: bool = False,
) -> OpCase:
    attrs = {k: v for k, v in (("axis", axis), ("reduction", reduction)) if v is not None}
    inputs = [
        ("data", data_shape, dtype),
        ("indices", index_shape, str(indices.dtype)),
        ("updates", index_shape, dtype),
    ]
    model = single_op_model(op, inputs, attrs, opset=opset)
    feeds = {"data": sample(data_shape, dtype, 1), "indices": indices, "updates": sample(index_shape, dtype, 2)}
    return case(f"{op.lower()}-{id}", model, feeds, reference=onnx_reference(model) if reference else None)


def _unique_elements(
    id: str,
    index_shape,
    axis: int,
    reduction: str | None = None,
    dtype: str = "float32",
    index_dtype: str = "int64",
    **kwargs,
) -> OpCase:
    indices = unique_indices(DATA, index_shape, axis, dtype=index_dtype)
    return _elements(id, DATA, index_shape, indices, axis, reduction, dtype, **kwargs)


SCATTER_ELEMENTS_CASES: list[OpCase] = [
    _unique_elements("axis0", (3, 5, 3), 0),
    _unique_elements("axis1-smaller-indices", (2, 4, 3), 1),
    _unique_elements("axis-last", (4, 5, 2), -1),
    _unique_elements("axis-minus2-int32-indices", (4, 3, 3), -2, index_dtype="int32"),
    _unique_elements("int64-data", (3, 5, 3), 0, dtype="int64"),
    _unique_elements("int32-data", (4, 2, 3), 1, dtype="int32"),
    _unique_elements("bool-data", (4, 5, 2), 2, dtype="bool", reference=True),
    _elements("default-axis", (3, 3), (2, 3), i64([[1, 0, 2], [0, 2, 1]])),
    _elements("duplicates-last-wins", (3, 4), (5, 4), repeating_indices((5, 4), 3), 0, reference=True),
    _elements("duplicates-add", (3, 4), (5, 4), repeating_indices((5, 4), 3), 0, "add"),
    _elements("duplicates-mul", (3, 4), (6, 4), repeating_indices((6, 4), 3, seed=1), 0, "mul"),
    _elements("duplicates-max", DATA, (4, 7, 3), repeating_indices((4, 7, 3), 5), 1, "max"),
    _elements("duplicates-min", DATA, (4, 5, 6), repeating_indices((4, 5, 6), 3), -1, "min"),
    _elements("add-int64", DATA, (4, 7, 3), repeating_indices((4, 7, 3), 5), 1, "add", dtype="int64"),
    _elements("max-int32", DATA, (4, 7, 3), repeating_indices((4, 7, 3), 5), 1, "max", dtype="int32"),
    _elements("opset11", (3, 4), (2, 4), i64([[0, -1, 2, 1], [2, 0, -3, 0]]), 0, opset=11),
    _elements("opset16-add", (3, 4), (2, 4), i64([[0, -1, 2, 1], [0, 0, -3, 0]]), 0, "add", opset=16),
]

SCATTER_CASES: list[OpCase] = [
    _elements("opset9-default-axis", (3, 3), (2, 3), i64([[1, 0, 2], [0, 2, 1]]), op="Scatter", opset=9),
    _elements("opset9-axis1", (2, 5), (2, 2), i64([[1, 3], [0, 4]]), 1, op="Scatter", opset=9),
    _elements("opset10-axis-last", DATA, (4, 5, 2), unique_indices(DATA, (4, 5, 2), 2) % 3, -1, op="Scatter", opset=10),
]


def _nd(
    id: str,
    data_shape,
    indices: np.ndarray,
    reduction: str | None = None,
    dtype: str = "float32",
    reference: bool = False,
) -> OpCase:
    updates_shape = indices.shape[:-1] + tuple(data_shape[indices.shape[-1] :])
    inputs = [("data", data_shape, dtype), ("indices", indices.shape, "int64"), ("updates", updates_shape, dtype)]
    model = single_op_model("ScatterND", inputs, {} if reduction is None else {"reduction": reduction}, opset=OPSET)
    feeds = {"data": sample(data_shape, dtype, 1), "indices": indices, "updates": sample(updates_shape, dtype, 2)}
    return case(f"scatternd-{id}", model, feeds, reference=onnx_reference(model) if reference else None)


def _tuples(count: int, shape: Sequence[int], seed: int = 0, unique: bool = True) -> np.ndarray:
    """`count` index tuples into the leading axes `shape` (some negative), without repeats when `unique`."""
    rng = np.random.default_rng(seed)
    flat = rng.permutation(int(np.prod(shape)))[:count] if unique else rng.integers(0, int(np.prod(shape)), count)
    tuples = np.stack(np.unravel_index(flat, tuple(shape)), axis=-1)
    return np.where(rng.random(tuples.shape) < 0.3, tuples - np.asarray(shape), tuples).astype(np.int64)


SCATTER_ND_CASES: list[OpCase] = [
    _nd("elements", DATA, _tuples(7, DATA)),
    _nd("rows", DATA, _tuples(3, DATA[:2])),
    _nd("planes", DATA, _tuples(2, DATA[:1])),
    _nd("batched-tuples", DATA, _tuples(6, DATA[:2]).reshape(2, 3, 2)),
    _nd("int64-data", DATA, _tuples(3, DATA[:2]), dtype="int64"),
    _nd("bool-data", DATA, _tuples(5, DATA), dtype="bool", reference=True),
    _nd("duplicates-last-wins", DATA, _tuples(9, DATA[:2], unique=False), reference=True),
    *[
        _nd(f"duplicates-{reduction}", DATA, _tuples(9, DATA[:2], seed=1, unique=False), reduction)
        for reduction in ("add", "mul", "max", "min")
    ],
    _nd("add-int32", DATA, _tuples(9, DATA[:1], unique=False), "add", dtype="int32"),
    _nd("vector-data", (8,), _tuples(5, (8,), unique=False), "add"),
]

CASES: list[OpCase] = SCATTER_ELEMENTS_CASES + SCATTER_CASES + SCATTER_ND_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


# The serial update loops and the reductions rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "scatterelements-duplicates-add",
    "scatterelements-axis-minus2-int32-indices",
    "scatter-opset9-axis1",
    "scatternd-duplicates-last-wins",
    "scatternd-duplicates-max",
    "scatternd-int64-data",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


UNSUPPORTED = [
    pytest.param(
        single_op_model(
            "ScatterElements",
            [("x", (3, 3), "bool"), ("i", (2, 3), "int64"), ("u", (2, 3), "bool")],
            {"reduction": "add"},
            opset=OPSET,
        ),
        "reduction 'add' on bool data is not supported",
        id="scatterelements-bool-add",
    ),
    pytest.param(
        single_op_model(
            "ScatterND",
            [("x", (3, 3), "bool"), ("i", (2, 1), "int64"), ("u", (2, 3), "bool")],
            {"reduction": "max"},
            opset=OPSET,
        ),
        "reduction 'max' on bool data is not supported",
        id="scatternd-bool-max",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)


# Shapes that would make the kernel write outside its output, and unknown reductions: refused before any build.
_F = np.float32
HOSTILE = [
    pytest.param(
        hostile_op_model(
            "ScatterElements",
            {"axis": 0},
            {"i": np.zeros((1, 2, 5, 4), np.int64), "u": np.zeros((1, 2, 5, 4), _F)},
            opset=OPSET,
        ),
        "don't fit data",
        id="scatterelements-indices-too-wide",
    ),
    pytest.param(
        hostile_op_model(
            "ScatterElements",
            {"axis": 1},
            {"i": np.zeros((1, 2, 4, 4), np.int64), "u": np.zeros((1, 2, 4, 3), _F)},
            opset=OPSET,
        ),
        "don't fit data",
        id="scatterelements-updates-shape",
    ),
    pytest.param(
        hostile_op_model(
            "ScatterElements",
            {"axis": 2**40},
            {"i": np.zeros((1, 1, 1, 1), np.int64), "u": np.zeros((1, 1, 1, 1), _F)},
            opset=OPSET,
        ),
        "axis 1099511627776 is out of range",
        id="scatterelements-axis",
    ),
    pytest.param(
        hostile_op_model(
            "ScatterElements",
            {"reduction": "xor"},
            {"i": np.zeros((1, 1, 1, 1), np.int64), "u": np.zeros((1, 1, 1, 1), _F)},
            opset=OPSET,
        ),
        "reduction 'xor' is not supported",
        id="scatterelements-reduction",
    ),
    pytest.param(
        hostile_op_model("ScatterND", {}, {"i": np.zeros((2, 5), np.int64), "u": np.zeros((2,), _F)}, opset=OPSET),
        "don't fit data",
        id="scatternd-tuple-too-long",
    ),
    pytest.param(
        hostile_op_model("ScatterND", {}, {"i": np.zeros((2, 2), np.int64), "u": np.zeros((2, 5, 4), _F)}, opset=OPSET),
        "don't fit data",
        id="scatternd-updates-shape",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
