"""farm.ops.indexing against onnxruntime: Gather, GatherElements, GatherND, OneHot, the generators (Shape, Size,
Range, ConstantOfShape, EyeLike) and Resize/Upsample, one op per model, on float32, int64, int32 and bool data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest
from numerics import (
    OPSET,
    OpCase,
    TypedInput,
    assert_refused,
    assert_unsupported,
    case,
    check_case,
    graph_model,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)
from onnx import helper, numpy_helper
from test_ops_tensor import (
    OTHER_DTYPES,
    i64,
    onnx_reference,
    sample,
    typed_case,
)


def indices(shape: Sequence[int], size: int, dtype: str = "int64", seed: int = 0, negative: bool = True) -> np.ndarray:
    """Valid indices into an axis of `size`: in [-size, size) (or [0, size) without `negative`)."""
    rng = np.random.default_rng(seed)
    return rng.integers(-size if negative else 0, size, shape).astype(dtype)


def _fed(
    id: str,
    op: str,
    inputs: Sequence[TypedInput],
    feeds: Mapping[str, np.ndarray],
    attrs: Mapping[str, object] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
    **kwargs,
) -> OpCase:
    """A one-op case with explicit feeds for the inputs that need valid values (indices); others get `sample`."""
    all_feeds = {
        name: feeds[name] if name in feeds else sample(shape, dtype, seed)
        for seed, (name, shape, dtype) in enumerate(inputs)
    }
    return case(id, single_op_model(op, inputs, attrs, initializers, opset, **kwargs), all_feeds)


# ----------------------------------------------------------------------------------------------------- Gather


def _gather(
    id: str,
    data_shape,
    index_shape,
    axis: int | None = None,
    dtype: str = "float32",
    index_dtype: str = "int64",
    opset: int = OPSET,
) -> OpCase:
    size = data_shape[axis if axis is not None else 0]
    attrs = {} if axis is None else {"axis": axis}
    inputs = [("data", data_shape, dtype), ("indices", index_shape, index_dtype)]
    feeds = {"indices": indices(index_shape, size, index_dtype, negative=opset >= 11)}
    return _fed(f"gather-{id}", "Gather", inputs, feeds, attrs, opset=opset)


GATHER_CASES: list[OpCase] = [
    _gather("axis0-default", (5, 4, 3), (2, 3)),
    _gather("axis1", (5, 4, 3), (2, 3), 1),
    _gather("axis-last", (5, 4, 3), (6,), -1),
    _gather("axis-minus2", (5, 4, 3), (2, 2, 2), -2),
    _gather("scalar-index", (5, 4, 3), (), 1),
    _gather("scalar-index-axis0", (7,), (), 0),
    _gather("1d", (9,), (4,)),
    _gather("int32-indices", (5, 4), (3,), 1, index_dtype="int32"),
    _gather("opset9", (5, 4), (3,), 1, opset=9),
    _gather("opset11", (5, 4), (2, 3), 0, opset=11),
    *[_gather(f"{dtype}-data", (4, 3, 2), (2, 5), 1, dtype=dtype) for dtype in OTHER_DTYPES],
    case(
        "gather-embedding",
        single_op_model(
            "Gather", [("ids", (2, 7), "int64")], {}, {"table": rand(50, 16)}, node_inputs=["table", "ids"]
        ),
        {"ids": indices((2, 7), 50, negative=False)},
    ),
    case(
        "gather-constant-scalar-index",
        single_op_model("Gather", [("x", (2, 5, 8), "float32")], {"axis": 1}, {"i": np.int64(0)}),
    ),
    case(
        "gather-constant-indices",
        single_op_model("Gather", [("x", (6, 4), "float32")], {"axis": 0}, {"i": i64([[5, -1], [0, 2]])}),
    ),
]

# ------------------------------------------------------------------------------------------------ generators


def _shape(id: str, shape, dtype: str = "float32", opset: int = OPSET, **attrs) -> OpCase:
    return typed_case(f"shape-{id}", "Shape", [("x", shape, dtype)], attrs, opset=opset)


def _folded_shape_chain() -> OpCase:
    """The BERT/ViT pattern Shape -> Gather -> Unsqueeze -> Concat -> Reshape, which folding removes."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node("Unsqueeze", ["batch", "axes"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    model = graph_model(
        nodes, [("x", (3, 4, 5), "float32")], initializers={"zero": np.int64(0), "axes": i64([0]), "minus1": i64([-1])}
    )
    return case("shape-folded-into-reshape", model, schedule=("Reshape",))


def _constant_of_shape(id: str, shape, value: np.ndarray | None = None) -> OpCase:
    attrs = {} if value is None else {"value": numpy_helper.from_array(np.asarray(value).reshape(1))}
    model = single_op_model("ConstantOfShape", [], attrs, {"shape": i64(shape)})
    return case(f"constant-of-shape-{id}", model, {})


def _range(id: str, start, limit, delta, dtype: str) -> OpCase:
    inits = {name: np.asarray(v, dtype) for name, v in (("start", start), ("limit", limit), ("delta", delta))}
    return case(f"range-{id}", single_op_model("Range", [], {}, inits), {})


GENERATOR_CASES: list[OpCase] = [
    _shape("4d", (2, 3, 4, 5)),
    _shape("int64-input", (3, 1), "int64"),
    _shape("bool-input", (2, 2, 2), "bool"),
    _shape("opset15-start", (2, 3, 4, 5), opset=15, start=1),
    _shape("opset15-end", (2, 3, 4, 5), opset=15, end=-1),
    _shape("opset15-start-end-negative", (2, 3, 4, 5), opset=15, start=-3, end=-1),
    _shape("opset15-clamped", (2, 3, 4), opset=15, start=-10, end=10),
    _shape("opset9", (2, 3), opset=9),
    _folded_shape_chain(),
    typed_case("size-4d", "Size", [("x", (2, 3, 4, 5), "float32")]),
    typed_case("size-int32", "Size", [("x", (7,), "int32")]),
    typed_case("size-scalar", "Size", [("x", (), "float32")]),
    typed_case("size-opset9", "Size", [("x", (3, 2), "float32")], opset=9),
    _constant_of_shape("default", (2, 3)),
    _constant_of_shape("float", (4,), np.float32(1.5)),
    _constant_of_shape("int64", (2, 1, 3), np.int64(-7)),
    _constant_of_shape("int32", (3, 3), np.int32(5)),
    _constant_of_shape("bool", (2, 5), np.bool_(True)),
    _range("float", 1.0, 4.2, 0.4, "float32"),
    _range("float-negative-delta", 2.5, -3.0, -0.5, "float32"),
    _range("int64", 3, 30, 4, "int64"),
    _range("int32-negative-delta", 10, -6, -3, "int32"),
]

# -------------------------------------------------------------------------------- GatherElements, GatherND


def _gather_elements(
    id: str, data_shape, index_shape, axis: int | None = None, dtype: str = "float32", index_dtype: str = "int64"
) -> OpCase:
    size = data_shape[axis if axis is not None else 0]
    inputs = [("data", data_shape, dtype), ("indices", index_shape, index_dtype)]
    feeds = {"indices": indices(index_shape, size, index_dtype)}
    return _fed(f"gather-elements-{id}", "GatherElements", inputs, feeds, {} if axis is None else {"axis": axis})


def _gather_nd(
    id: str, data_shape, index_shape, batch_dims: int = 0, dtype: str = "float32", index_dtype: str = "int64"
) -> OpCase:
    depth = index_shape[-1]
    rng = np.random.default_rng(1)
    picked = [
        rng.integers(-data_shape[batch_dims + k], data_shape[batch_dims + k], index_shape[:-1]) for k in range(depth)
    ]
    feeds = {"indices": np.stack(picked, axis=-1).astype(index_dtype)}
    inputs = [("data", data_shape, dtype), ("indices", index_shape, index_dtype)]
    attrs = {"batch_dims": batch_dims} if batch_dims else {}
    return _fed(f"gather-nd-{id}", "GatherND", inputs, feeds, attrs)


GATHER_ELEMENTS_ND_CASES: list[OpCase] = [
    _gather_elements("axis0-default", (3, 4), (2, 4)),
    _gather_elements("axis1", (3, 4), (3, 6), 1),
    _gather_elements("axis-last-3d", (2, 3, 5), (2, 3, 2), -1),
    _gather_elements("axis1-smaller-indices", (4, 5, 2), (2, 3, 1), 1),
    _gather_elements("int32-indices", (3, 3), (3, 3), 0, index_dtype="int32"),
    *[_gather_elements(f"{dtype}-data", (4, 3), (2, 3), 0, dtype=dtype) for dtype in OTHER_DTYPES],
    _gather_nd("full-index", (3, 4), (5, 2)),
    _gather_nd("row-index", (3, 4, 2), (2, 1)),
    _gather_nd("slices", (2, 3, 4), (2, 2, 2)),
    _gather_nd("batch-dims1", (2, 3, 4), (2, 5, 1), batch_dims=1),
    _gather_nd("batch-dims1-full", (2, 3, 4), (2, 1, 2), batch_dims=1),
    _gather_nd("batch-dims2", (2, 3, 4, 5), (2, 3, 2, 1), batch_dims=2),
    *[_gather_nd(f"{dtype}-data", (3, 4), (2, 1), dtype=dtype) for dtype in OTHER_DTYPES],
]

# ----------------------------------------------------------------------------------------- OneHot, EyeLike


def _one_hot(
    id: str,
    index_shape,
    depth: int,
    axis: int | None = None,
    values=(0.0, 1.0),
    dtype: str = "float32",
    index_dtype: str = "int64",
) -> OpCase:
    rng = np.random.default_rng(2)
    feeds = {"indices": rng.integers(-depth - 1, depth + 1, index_shape).astype(index_dtype)}
    inits = {"depth": np.int64(depth), "values": np.asarray(values, dtype)}
    model = single_op_model(
        "OneHot", [("indices", index_shape, index_dtype)], {} if axis is None else {"axis": axis}, inits
    )
    # onnxruntime has OneHot kernels for some (indices, values, depth) dtype triples only.
    reference = None if (index_dtype, dtype) in (("int64", "float32"), ("int64", "int64")) else onnx_reference(model)
    return case(f"one-hot-{id}", model, feeds, reference=reference)


def _eye_like(id: str, shape, dtype: str = "float32", k: int | None = None, out_dtype: int | None = None) -> OpCase:
    attrs = {k_: v for k_, v in (("k", k), ("dtype", out_dtype)) if v is not None}
    return typed_case(f"eye-like-{id}", "EyeLike", [("x", shape, dtype)], attrs)


ONE_HOT_EYE_CASES: list[OpCase] = [
    _one_hot("default-axis", (2, 3), 5),
    _one_hot("axis0", (4,), 3, axis=0),
    _one_hot("axis1", (2, 3), 4, axis=1),
    _one_hot("axis-minus2", (2, 3), 4, axis=-2),
    _one_hot("values", (5,), 6, values=(-2.0, 3.5)),
    _one_hot("int64-values", (3, 2), 3, values=(0, 9), dtype="int64"),
    _one_hot("int32-indices", (4,), 4, index_dtype="int32"),
    _one_hot("float-indices", (3,), 5, index_dtype="float32"),
    case(
        "one-hot-computed-values",
        single_op_model(
            "OneHot",
            [("indices", (3,), "int64"), ("values", (2,), "float32")],
            {},
            {"depth": np.int64(4)},
            node_inputs=["indices", "depth", "values"],
        ),
        {"indices": i64([0, 3, -1]), "values": rand(2)},
    ),
    _eye_like("square", (4, 4)),
    _eye_like("wide-k1", (3, 5), k=1),
    _eye_like("tall-k-negative", (5, 3), k=-2),
    _eye_like("k-outside", (3, 3), k=4),
    _eye_like("int64", (3, 4), "int64"),
    _eye_like("int32", (2, 2), "int32"),
    _eye_like("dtype-attr-int64", (3, 3), out_dtype=7),
    _eye_like("dtype-attr-float-from-int", (2, 3), "int64", out_dtype=1),
]

# ------------------------------------------------------------------------------------------ Resize, Upsample

IMAGE = (1, 2, 4, 6)
EMPTY = np.zeros(0, np.float32)


def _resize(
    id: str,
    attrs: Mapping[str, object],
    *,
    scales=None,
    sizes=None,
    roi=None,
    shape=IMAGE,
    dtype: str = "float32",
    opset: int = 19,
) -> OpCase:
    """Resize with constant roi/scales/sizes inputs in the node's opset layout (opset 10: X, scales)."""
    if opset < 11:
        inits = {"scales": np.asarray(scales, np.float32)}
    else:
        inits = {
            "roi": EMPTY if roi is None else np.asarray(roi, np.float32),
            "scales": EMPTY if scales is None else np.asarray(scales, np.float32),
        }
        if sizes is not None:
            inits["sizes"] = i64(sizes)
    model = single_op_model("Resize", [("x", shape, dtype)], attrs, inits, opset)
    # onnxruntime's Resize has no int64 kernel.
    reference = onnx_reference(model) if dtype == "int64" else None
    return case(f"resize-{id}", model, {"x": sample(shape, dtype)}, reference=reference)


def _nearest(mode: str, transform: str, **kwargs) -> dict:
    return {"mode": "nearest", "nearest_mode": mode, "coordinate_transformation_mode": transform}


def _linear(transform: str) -> dict:
    return {"mode": "linear", "coordinate_transformation_mode": transform}


RESIZE_CASES: list[OpCase] = [
    # nearest: every rounding under every coordinate transform, up and down, sizes chosen so that ties occur
    *[
        _resize(
            f"nearest-{mode}-{transform}-{'sizes' if sizes else 'scales'}",
            _nearest(mode, transform),
            **({"sizes": [1, 2, 6, 5]} if sizes else {"scales": [1, 1, 2.0, 0.5]}),
            shape=(1, 2, 3, 10),
        )
        for mode in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
        for transform in ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric")
        for sizes in (False, True)
    ],
    _resize("nearest-ties-7-to-6", _nearest("round_prefer_ceil", "asymmetric"), sizes=[1, 1, 6, 6], shape=(1, 1, 7, 7)),
    _resize(
        "nearest-tf-half-pixel-for-nn",
        _nearest("round_prefer_floor", "tf_half_pixel_for_nn"),
        scales=[1, 1, 1.5, 2.5],
        opset=11,
    ),
    _resize("nearest-default-attrs", {}, scales=[1, 1, 2, 2]),
    _resize(
        "nearest-yolo-upsample",
        {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
        scales=[1, 1, 2, 2],
        shape=(1, 3, 5, 5),
    ),
    _resize("nearest-int64", _nearest("round_prefer_floor", "half_pixel"), scales=[1, 1, 2, 1.5], dtype="int64"),
    _resize("nearest-int32", _nearest("round_prefer_ceil", "asymmetric"), scales=[1, 1, 0.5, 2], dtype="int32"),
    _resize("nearest-3d", _nearest("round_prefer_floor", "half_pixel"), scales=[1, 2, 3], shape=(2, 3, 4)),
    _resize("nearest-all-axes", _nearest("round_prefer_ceil", "asymmetric"), sizes=[2, 3, 6, 4]),
    # linear (bilinear over NCHW and NHWC, trilinear)
    *[
        _resize(
            f"linear-{transform}-{'sizes' if sizes else 'scales'}",
            _linear(transform),
            **({"sizes": [1, 2, 7, 4]} if sizes else {"scales": [1, 1, 1.75, 0.5]}),
            shape=(1, 2, 4, 8),
        )
        for transform in ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric")
        for sizes in (False, True)
    ],
    _resize("linear-pytorch-half-pixel-to-1", _linear("pytorch_half_pixel"), sizes=[1, 2, 1, 3]),
    _resize("linear-align-corners-to-1", _linear("align_corners"), sizes=[1, 2, 1, 3]),
    _resize("linear-nhwc", _linear("half_pixel"), scales=[1, 2, 1.5, 1], shape=(1, 4, 6, 3)),
    _resize("linear-2d", _linear("half_pixel"), scales=[2.5, 0.5], shape=(4, 6)),
    _resize("linear-trilinear", _linear("half_pixel"), scales=[1, 1, 2, 1.5, 0.5], shape=(1, 2, 3, 4, 6)),
    _resize("linear-upsample-x2", _linear("half_pixel"), scales=[1, 1, 2, 2], shape=(1, 3, 5, 7)),
    # tf_crop_and_resize: roi, extrapolation outside it
    _resize(
        "tf-crop-nearest",
        {**_nearest("round_prefer_floor", "tf_crop_and_resize")},
        roi=[0, 0, 0.2, 0.1, 1, 1, 0.8, 0.9],
        sizes=[1, 2, 3, 5],
    ),
    _resize(
        "tf-crop-linear", _linear("tf_crop_and_resize"), roi=[0, 0, 0.25, 0.4, 1, 1, 0.75, 0.9], sizes=[1, 2, 3, 3]
    ),
    _resize(
        "tf-crop-linear-extrapolation",
        {**_linear("tf_crop_and_resize"), "extrapolation_value": 10.0},
        roi=[0, 0, -0.5, 0.4, 1, 1, 1.2, 1.5],
        sizes=[1, 2, 5, 4],
    ),
    _resize(
        "tf-crop-nearest-extrapolation",
        {**_nearest("ceil", "tf_crop_and_resize"), "extrapolation_value": -2.0},
        roi=[0, 0, -0.5, 0.4, 1, 1, 1.2, 1.5],
        sizes=[1, 2, 5, 4],
    ),
    # opsets: 10 (scales only, asymmetric), 11 and 13 (roi, scales, sizes), 18 (axes, aspect-ratio policy)
    _resize("opset10-nearest-up", {"mode": "nearest"}, scales=[1, 1, 2, 3], opset=10),
    _resize("opset10-nearest-down", {"mode": "nearest"}, scales=[1, 1, 0.5, 0.5], opset=10),
    _resize("opset10-linear", {"mode": "linear"}, scales=[1, 1, 1.5, 0.5], opset=10),
    _resize("opset11-linear-sizes", _linear("align_corners"), sizes=[1, 2, 6, 3], opset=11),
    _resize("opset13-nearest", _nearest("round_prefer_ceil", "half_pixel"), scales=[1, 1, 1.5, 0.7], opset=13),
    _resize("opset18-axes-scales", {**_nearest("floor", "half_pixel"), "axes": [2, 3]}, scales=[2, 0.5], opset=18),
    _resize("opset18-axes-reversed", {**_linear("half_pixel"), "axes": [3, 2]}, scales=[0.5, 2], opset=18),
    _resize("opset18-axes-sizes", {**_nearest("round_prefer_floor", "asymmetric"), "axes": [-1]}, sizes=[9], opset=18),
    _resize(
        "opset18-not-larger",
        {**_nearest("round_prefer_floor", "half_pixel"), "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
        sizes=[6, 6],
        opset=18,
    ),
    _resize(
        "opset18-not-smaller",
        {**_linear("half_pixel"), "axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"},
        sizes=[6, 6],
        opset=18,
    ),
    _resize(
        "opset18-not-larger-all-axes",
        {**_nearest("floor", "asymmetric"), "keep_aspect_ratio_policy": "not_larger"},
        sizes=[3, 4, 7, 9],
        opset=18,
    ),
    _resize("opset19-half-pixel-symmetric", _linear("half_pixel_symmetric"), scales=[1, 1, 1.6, 0.6]),
    case(
        "upsample-opset9-nearest",
        single_op_model(
            "Upsample",
            [("x", IMAGE, "float32")],
            {"mode": "nearest"},
            {"scales": np.array([1, 1, 2, 2], np.float32)},
            opset=9,
        ),
    ),
    case(
        "upsample-opset9-nearest-int32",
        single_op_model("Upsample", [("x", (2, 3), "int32")], {}, {"scales": np.array([1.5, 2], np.float32)}, opset=9),
        {"x": sample((2, 3), "int32")},
    ),
    case(
        "upsample-opset9-linear",
        single_op_model(
            "Upsample",
            [("x", (1, 1, 3, 4), "float32")],
            {"mode": "linear"},
            {"scales": np.array([1, 1, 2.5, 1.5], np.float32)},
            opset=9,
        ),
    ),
]

CASES: list[OpCase] = GATHER_CASES + GENERATOR_CASES + GATHER_ELEMENTS_ND_CASES + ONE_HOT_EYE_CASES + RESIZE_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


UNSUPPORTED = [
    pytest.param(
        single_op_model(
            "Resize",
            [("x", IMAGE, "float32")],
            {"mode": "cubic"},
            {"roi": EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)},
        ),
        "mode 'cubic' is not supported",
        id="resize-cubic",
    ),
    pytest.param(
        single_op_model(
            "Resize",
            [("x", IMAGE, "float32")],
            {"mode": "linear", "antialias": 1},
            {"roi": EMPTY, "scales": np.array([1, 1, 0.5, 0.5], np.float32)},
            opset=18,
        ),
        "antialias=1 is not supported",
        id="resize-antialias",
    ),
    pytest.param(
        single_op_model(
            "Resize",
            [("x", IMAGE, "int32")],
            {"mode": "linear"},
            {"roi": EMPTY, "scales": np.array([1, 1, 2, 2], np.float32)},
        ),
        "linear mode on int32 data is not supported",
        id="resize-linear-int",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)


# Hostile attributes and shape inputs (issue 13): each is refused with one line naming the node, before anything is
# built or allocated (a size past farm's per-tensor limit, or a shape inference can't give).
_EMPTY = np.zeros(0, np.float32)
HOSTILE = [
    pytest.param(
        hostile_op_model("Resize", {}, {"roi": _EMPTY, "scales": np.array([1, 1, 1e12, 1e12], np.float32)}),
        "over farm's limit",
        id="resize-scales-huge",
    ),
    pytest.param(
        hostile_op_model("Resize", {}, {"roi": _EMPTY, "scales": np.array([1, 1, np.inf, 1], np.float32)}),
        "negative dim",
        id="resize-scales-inf",
    ),
    pytest.param(
        hostile_op_model("Resize", {}, {"roi": _EMPTY, "scales": _EMPTY, "sizes": np.array([1, 2, 2**40, 2**40])}),
        "over farm's limit",
        id="resize-sizes-huge",
    ),
    pytest.param(
        hostile_op_model("Resize", {"axes": [2**40]}, {"roi": _EMPTY, "scales": np.array([2], np.float32)}, opset=18),
        "out of range|shape",
        id="resize-axes",
    ),
    pytest.param(
        hostile_op_model(
            "OneHot",
            {},
            {"indices": np.array([0, 1]), "depth": np.array(2**40), "values": np.array([0, 1], np.float32)},
            x=None,
        ),
        "over farm's limit|constant",
        id="onehot-depth",
    ),
    pytest.param(
        hostile_op_model("Gather", {"axis": 2**40}, {"i": np.array([0])}),
        "axis 1099511627776 is out of range",
        id="gather-axis",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
