"""farm.ops.tensor against onnxruntime: reshapes (Reshape, Flatten, Squeeze, Unsqueeze), Identity, Dropout,
Transpose, Concat, Pad, Expand, Tile, Slice, Split, Trilu, DepthToSpace, SpaceToDepth, ReverseSequence and Einsum,
one op per model, on every dtype the kernels hold (float32, int64, int32, bool); then MatMul's batching paths and a
small attention block that chains them. The typed-case helpers here serve test_ops_indexing too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest
from numerics import (
    OPSET,
    OpCase,
    Reference,
    TypedInput,
    assert_refused,
    case,
    check_case,
    graph_model,
    hostile_op_model,
    params,
    rand,
    single_op_model,
)
from onnx import helper
from onnx.reference import ReferenceEvaluator

X4 = [("x", (2, 3, 4, 5))]


def i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def sample(shape: Sequence[int], dtype: str, seed: int = 0) -> np.ndarray:
    """Deterministic data of any dtype: small signed ints, booleans or standard-normal floats."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def onnx_reference(model: onnx.ModelProto) -> Reference:
    """ONNX's reference evaluator as the reference, for dtypes onnxruntime has no kernel for."""
    evaluator = ReferenceEvaluator(model)
    names = [o.name for o in model.graph.output]
    return lambda feeds: dict(zip(names, evaluator.run(None, dict(feeds))))


def typed_case(
    id: str,
    op: str,
    inputs: Sequence[TypedInput],
    attrs: Mapping[str, object] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
    *,
    onnxruntime: bool = True,
    **kwargs,
) -> OpCase:
    """A one-op case whose graph inputs are fed `sample` data of their dtype; against ONNX's reference evaluator
    instead of onnxruntime where `onnxruntime` is False (it lacks the kernel)."""
    feeds = {name: sample(shape, dtype, seed) for seed, (name, shape, dtype) in enumerate(inputs)}
    model = single_op_model(op, inputs, attrs, initializers, opset, **kwargs)
    return case(id, model, feeds, reference=None if onnxruntime else onnx_reference(model))


OTHER_DTYPES = ("int64", "int32", "bool")


# ---------------------------------------------------------------------------------------------------- reshapes

RESHAPE_CASES: list[OpCase] = [
    *[case(f"flatten-axis{axis}", single_op_model("Flatten", X4, {"axis": axis})) for axis in range(5)],
    case("flatten-default-axis", single_op_model("Flatten", X4)),
    case("flatten-axis-1", single_op_model("Flatten", X4, {"axis": -1})),
    case("flatten-axis-4", single_op_model("Flatten", X4, {"axis": -4})),
    case("flatten-opset9", single_op_model("Flatten", X4, {"axis": 2}, opset=9)),
    case("reshape", single_op_model("Reshape", X4, {}, {"shape": i64([6, 20])})),
    case("reshape-minus1", single_op_model("Reshape", X4, {}, {"shape": i64([-1, 5])})),
    case("reshape-0", single_op_model("Reshape", X4, {}, {"shape": i64([0, 0, 20])})),
    case("reshape-0-and-minus1", single_op_model("Reshape", X4, {}, {"shape": i64([0, -1, 2])})),
    case("reshape-to-1d", single_op_model("Reshape", X4, {}, {"shape": i64([-1])})),
    case("reshape-add-axes", single_op_model("Reshape", [("x", (6,))], {}, {"shape": i64([1, 2, 1, 3])})),
    case("reshape-opset9", single_op_model("Reshape", X4, {}, {"shape": i64([2, -1])}, opset=9)),
    case("squeeze-opset11-axes", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {"axes": [0, 2]}, opset=11)),
    case("squeeze-opset11-negative-axis", single_op_model("Squeeze", [("x", (2, 3, 1))], {"axes": [-1]}, opset=11)),
    case("squeeze-opset11-all", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], opset=11)),
    case("squeeze-opset9-axes", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {"axes": [2]}, opset=9)),
    case(
        "squeeze-opset13-input", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {}, {"axes": i64([0, 2])}, opset=13)
    ),
    case(
        "squeeze-opset13-negative-input",
        single_op_model("Squeeze", [("x", (1, 3, 1, 5))], {}, {"axes": i64([-2])}, opset=13),
    ),
    case("squeeze-opset13-all", single_op_model("Squeeze", [("x", (1, 3, 1, 5))], opset=13)),
    case("unsqueeze-opset11-axes", single_op_model("Unsqueeze", [("x", (3, 5))], {"axes": [0, 3]}, opset=11)),
    case("unsqueeze-opset11-negative-axis", single_op_model("Unsqueeze", [("x", (3, 5))], {"axes": [-1]}, opset=11)),
    case("unsqueeze-opset9-axes", single_op_model("Unsqueeze", [("x", (3, 5))], {"axes": [1]}, opset=9)),
    case("unsqueeze-opset13-input", single_op_model("Unsqueeze", [("x", (3, 5))], {}, {"axes": i64([0, 2])}, opset=13)),
    case(
        "unsqueeze-opset13-negative-input",
        single_op_model("Unsqueeze", [("x", (3, 5))], {}, {"axes": i64([-1, 1])}, opset=13),
    ),
    case("unsqueeze-scalar", single_op_model("Unsqueeze", [("x", ())], {}, {"axes": i64([0])})),
    case("squeeze-to-scalar", single_op_model("Squeeze", [("x", (1, 1))])),
    case("reshape-to-scalar", single_op_model("Reshape", [("x", (1, 1))], {}, {"shape": i64([]).reshape(0)})),
    case("flatten-1d-axis0", single_op_model("Flatten", [("x", (5,))], {"axis": 0})),
]

# ---------------------------------------------------------------------------------------- Identity and Dropout

PASSTHROUGH_CASES: list[OpCase] = [
    # A pass-through from a graph input to a graph output can't be removed; it stays a copy kernel.
    case("identity-input-to-output", single_op_model("Identity", X4)),
    case("identity-opset9", single_op_model("Identity", [("x", (7,))], opset=9)),
    case(
        "identity-of-computed-value",
        graph_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])], X4),
        schedule=("Relu",),
    ),
    case(
        "identity-between-ops",
        graph_model(
            [
                helper.make_node("Relu", ["x"], ["r"]),
                helper.make_node("Identity", ["r"], ["i"]),
                helper.make_node("Sigmoid", ["i"], ["y"]),
            ],
            X4,
        ),
        schedule=("Relu", "Sigmoid"),
    ),
    case("dropout-input-to-output", single_op_model("Dropout", X4)),
    case("dropout-ratio-input", single_op_model("Dropout", X4, {}, {"ratio": np.float32(0.3)})),
    case("dropout-opset9-ratio-attr", single_op_model("Dropout", X4, {"ratio": 0.4}, opset=9)),
    case("dropout-unused-mask", graph_model([helper.make_node("Dropout", ["x"], ["y", "mask"])], X4)),
    case(
        "dropout-after-op",
        graph_model([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Dropout", ["t"], ["y"])], X4),
        schedule=("Tanh",),
    ),
]

# ------------------------------------------------------------------------------------------- Transpose, Concat

TRANSPOSE_CASES: list[OpCase] = [
    case("transpose-default-2d", single_op_model("Transpose", [("x", (3, 7))])),
    case("transpose-default-4d", single_op_model("Transpose", X4)),
    case("transpose-nchw-to-nhwc", single_op_model("Transpose", X4, {"perm": [0, 2, 3, 1]})),
    case("transpose-nhwc-to-nchw", single_op_model("Transpose", X4, {"perm": [0, 3, 1, 2]})),
    case("transpose-3d", single_op_model("Transpose", [("x", (2, 3, 4))], {"perm": [1, 0, 2]})),
    case("transpose-identity-perm", single_op_model("Transpose", [("x", (2, 3, 4))], {"perm": [0, 1, 2]})),
    case("transpose-5d", single_op_model("Transpose", [("x", (2, 1, 3, 2, 4))], {"perm": [4, 2, 0, 3, 1]})),
    case("transpose-1d", single_op_model("Transpose", [("x", (5,))])),
    case("transpose-opset9", single_op_model("Transpose", X4, {"perm": [1, 0, 3, 2]}, opset=9)),
]

CONCAT_CASES: list[OpCase] = [
    case("concat-axis0", single_op_model("Concat", [("a", (2, 3)), ("b", (4, 3))], {"axis": 0})),
    case("concat-axis1", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (2, 5, 4))], {"axis": 1})),
    case("concat-last-axis", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (2, 3, 1))], {"axis": 2})),
    case("concat-negative-axis", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (2, 3, 2))], {"axis": -1})),
    case("concat-negative-axis-3", single_op_model("Concat", [("a", (2, 3, 4)), ("b", (1, 3, 4))], {"axis": -3})),
    case(
        "concat-3-inputs",
        single_op_model("Concat", [("a", (1, 2, 3, 3)), ("b", (1, 4, 3, 3)), ("c", (1, 1, 3, 3))], {"axis": 1}),
    ),
    case(
        "concat-3-inputs-axis0", single_op_model("Concat", [("a", (1, 5)), ("b", (2, 5)), ("c", (3, 5))], {"axis": 0})
    ),
    case("concat-one-input", single_op_model("Concat", [("a", (2, 3))], {"axis": 1})),
    case("concat-initializer", single_op_model("Concat", [("a", (2, 3))], {"axis": 0}, {"c": rand(1, 3, seed=3)})),
    case(
        "concat-initializer-around-input",
        single_op_model("Concat", [("x", (2, 3))], {"axis": 0}, {"c": rand(1, 3, seed=4)}, node_inputs=["c", "x", "c"]),
    ),
    case("concat-same-input-twice", single_op_model("Concat", [("a", (2, 3))], {"axis": 1}, node_inputs=["a", "a"])),
    case("concat-opset9", single_op_model("Concat", [("a", (2, 3)), ("b", (2, 2))], {"axis": 1}, opset=9)),
    # Empty inputs copy nothing (the rest fill the output); empty outputs need no kernel at all.
    case("concat-empty-input", single_op_model("Concat", [("a", (2, 3)), ("e", (2, 0))], {"axis": 1})),
    typed_case(
        "concat-empty-inputs-around-int64",
        "Concat",
        [("a", (2, 0, 3), "int64"), ("b", (2, 4, 3), "int64"), ("c", (2, 0, 3), "int64")],
        {"axis": 1},
    ),
    case(
        "concat-empty-initializer",
        single_op_model("Concat", [("a", (2, 3))], {"axis": 0}, {"e": np.zeros((0, 3), np.float32)}),
    ),
    case("concat-all-empty", single_op_model("Concat", [("a", (0, 3)), ("b", (0, 2))], {"axis": 1})),
]

# -------------------------------------------------------------------------------------------------------- Pad

PAD_X = [("x", (1, 2, 5, 6))]
PADS = [0, 0, 1, 2, 0, 0, 2, 1]


def _pad(id: str, mode: str | None, pads=PADS, value: float | None = None, opset: int = 13, x=PAD_X) -> OpCase:
    """Pad with `pads` and `value` as inputs (opset >= 11) or attributes (opset < 11)."""
    attrs: dict = {} if mode is None else {"mode": mode}
    if opset < 11:
        attrs["pads"] = list(pads)
        if value is not None:
            attrs["value"] = value
        return case(f"pad-{id}-opset{opset}", single_op_model("Pad", x, attrs, opset=opset))
    initializers = {"pads": i64(pads)}
    if value is not None:
        initializers["value"] = np.float32(value)
    return case(f"pad-{id}-opset{opset}", single_op_model("Pad", x, attrs, initializers, opset=opset))


PAD_CASES: list[OpCase] = [
    *[
        _pad(id, mode, value=value, opset=opset)
        for opset in (9, 11, 13)
        for id, mode, value in (
            ("constant-default", None, None),
            ("constant-value", "constant", 1.5),
            ("reflect", "reflect", None),
            ("edge", "edge", None),
        )
    ],
    _pad("constant-negative-value", "constant", value=-3.0, opset=18),
    _pad("constant-batch-and-channel-axes", "constant", pads=[1, 0, 0, 0, 0, 2, 0, 0], value=0.5),
    _pad("reflect-2d", "reflect", pads=[1, 2, 2, 3], x=[("x", (4, 5))]),
    _pad("edge-wide", "edge", pads=[0, 0, 4, 5, 0, 0, 3, 6]),
    _pad("edge-wider-than-input", "edge", pads=[0, 0, 5, 7, 0, 0, 6, 4], x=[("x", (1, 1, 3, 2))]),
    _pad("reflect-1d", "reflect", pads=[2, 3], x=[("x", (5,))]),
    _pad("reflect-max-width", "reflect", pads=[0, 0, 4, 5, 0, 0, 4, 5]),
    _pad("constant-3d", "constant", pads=[0, 1, 2, 0, 1, 0], value=2.0, x=[("x", (2, 3, 4))]),
    _pad("zero-pads", "constant", pads=[0] * 8),
    _pad("constant-negative-pads", "constant", pads=[0, 0, -1, 2, 0, 0, 1, -2], value=0.25),
    case(
        "pad-opset13-absent-value",
        single_op_model("Pad", PAD_X, {}, {"pads": i64(PADS)}, opset=13, node_inputs=["x", "pads", ""]),
    ),
]

# ------------------------------------------------------------------------------- copies of int and bool data

DTYPE_CASES: list[OpCase] = [
    *[
        c
        for dtype in OTHER_DTYPES
        for c in (
            typed_case(f"reshape-{dtype}", "Reshape", [("x", (2, 3, 4), dtype)], {}, {"shape": i64([4, -1])}),
            typed_case(f"transpose-{dtype}", "Transpose", [("x", (2, 3, 4), dtype)], {"perm": [2, 0, 1]}),
            typed_case(f"concat-{dtype}", "Concat", [("a", (2, 3), dtype), ("b", (2, 2), dtype)], {"axis": 1}),
            typed_case(f"squeeze-{dtype}", "Squeeze", [("x", (1, 3, 1), dtype)], {}, {"axes": i64([0])}),
            typed_case(f"unsqueeze-{dtype}", "Unsqueeze", [("x", (3,), dtype)], {}, {"axes": i64([0, 2])}),
            typed_case(f"flatten-{dtype}", "Flatten", [("x", (2, 3, 4), dtype)], {"axis": 2}),
            typed_case(f"identity-{dtype}", "Identity", [("x", (5,), dtype)]),
        )
    ],
    typed_case(
        "pad-int64-constant", "Pad", [("x", (2, 3), "int64")], {}, {"pads": i64([1, 0, 0, 2]), "value": np.int64(7)}
    ),
    typed_case("pad-int32-reflect", "Pad", [("x", (3, 4), "int32")], {"mode": "reflect"}, {"pads": i64([0, 2, 1, 1])}),
    typed_case("pad-bool-edge", "Pad", [("x", (3, 4), "bool")], {"mode": "edge"}, {"pads": i64([1, 1, 1, 1])}),
]

# ------------------------------------------------------------------------------------------- Expand and Tile


def _expand(id: str, shape, target, dtype: str = "float32", opset: int = OPSET) -> OpCase:
    return typed_case(f"expand-{id}", "Expand", [("x", shape, dtype)], {}, {"shape": i64(target)}, opset)


def _tile(id: str, shape, repeats, dtype: str = "float32", opset: int = OPSET) -> OpCase:
    return typed_case(f"tile-{id}", "Tile", [("x", shape, dtype)], {}, {"repeats": i64(repeats)}, opset)


EXPAND_TILE_CASES: list[OpCase] = [
    _expand("column-to-matrix", (3, 1), (3, 4)),
    _expand("add-leading-axes", (3, 1), (2, 3, 4)),
    _expand("shape-smaller-than-input", (2, 3, 4), (3, 1)),
    _expand("shape-of-ones", (2, 1, 4), (1, 1, 1)),
    _expand("scalar", (), (2, 3)),
    _expand("middle-axis", (2, 1, 3), (2, 5, 3), "int64"),
    _expand("bool-mask", (1, 1, 1, 6), (2, 4, 6, 6), "bool"),
    _expand("int32", (4,), (3, 4), "int32"),
    _expand("opset9", (3, 1), (3, 2), opset=9),
    _tile("2d", (2, 3), (2, 3)),
    _tile("ones", (2, 3, 4), (1, 1, 1)),
    _tile("3d", (2, 3, 4), (1, 2, 3)),
    _tile("1d", (5,), (4,)),
    _tile("int64", (2, 3), (3, 1), "int64"),
    _tile("bool", (2, 2), (2, 2), "bool"),
    _tile("int32", (1, 3), (4, 2), "int32"),
]

# ------------------------------------------------------------------------------------------------------ Slice

INT_MAX, INT64_MIN = 2**63 - 1, -(2**63)


def _slice(
    id: str, starts, ends, axes=None, steps=None, shape=(5, 6, 7), dtype: str = "float32", opset: int = OPSET
) -> OpCase:
    """Slice with starts/ends/axes/steps as attributes (opset < 10) or constant inputs."""
    if opset < 10:
        attrs = {"starts": list(starts), "ends": list(ends), **({"axes": list(axes)} if axes is not None else {})}
        return typed_case(f"slice-{id}", "Slice", [("x", shape, dtype)], attrs, opset=opset)
    inits = {"starts": i64(starts), "ends": i64(ends)}
    names = ["x", "starts", "ends", "", ""]
    if axes is not None:
        inits["axes"], names[3] = i64(axes), "axes"
    if steps is not None:
        inits["steps"], names[4] = i64(steps), "steps"
    while not names[-1]:
        names.pop()
    return typed_case(f"slice-{id}", "Slice", [("x", shape, dtype)], {}, inits, opset, node_inputs=names)


SLICE_CASES: list[OpCase] = [
    _slice("opset9-attrs", [1, 0], [4, 3], [0, 2], opset=9),
    _slice("opset9-default-axes", [1, 2, 3], [3, 5, 7], opset=9),
    _slice("opset9-int-max-end", [2], [INT_MAX], [1], opset=9),
    _slice("opset10", [0, 1], [3, -1], [0, 1], opset=10),
    _slice("default-axes-and-steps", [1, 2, 0], [4, 5, 3]),
    _slice("negative-starts-ends", [-3, -4], [-1, -1], [1, 2]),
    _slice("negative-axes", [1], [3], [-1]),
    _slice("int-max-end", [2], [INT_MAX], [0]),
    _slice("clamped-start-and-end", [-100, 1], [100, 1000], [0, 2]),
    _slice("steps", [0, 1], [5, 7], [0, 2], [2, 3]),
    _slice("negative-step", [4], [0], [1], [-1]),
    _slice("negative-step-to-start", [-1], [INT64_MIN], [2], [-2]),
    _slice("negative-step-clamped", [100, -1], [-100, -8], [0, 1], [-1, -2]),
    _slice("all-axes-reversed", [-1, -1, -1], [INT64_MIN, INT64_MIN, INT64_MIN], [0, 1, 2], [-1, -1, -1]),
    _slice("int64", [1], [3], [1], [1], dtype="int64"),
    _slice("int32-negative-step", [3], [0], [0], [-2], dtype="int32"),
    _slice("bool", [0, 2], [2, 6], [0, 1], dtype="bool"),
    _slice("cls-token", [0], [1], [1], shape=(2, 5, 8)),
    _slice("1d", [2], [5], shape=(8,)),
]

# ------------------------------------------------------------------------------------------------------ Split


def _split(id: str, shape, outputs: int, attrs=None, split=None, dtype: str = "float32", opset: int = OPSET) -> OpCase:
    inits = {"split": i64(split)} if split is not None else {}
    names = [f"y{i}" for i in range(outputs)]
    return typed_case(f"split-{id}", "Split", [("x", shape, dtype)], attrs or {}, inits, opset, outputs=names)


SPLIT_CASES: list[OpCase] = [
    _split("equal-default-axis", (6, 4), 3),
    _split("equal-axis1", (2, 6, 3), 2, {"axis": 1}),
    _split("negative-axis", (2, 3, 8), 4, {"axis": -1}),
    _split("opset11-attr", (7, 2), 3, {"split": [2, 4, 1]}, opset=11),
    _split("opset9-attr", (2, 5), 2, {"axis": 1, "split": [3, 2]}, opset=9),
    _split("opset13-input", (2, 9), 3, {"axis": 1}, split=[1, 3, 5]),
    _split("opset18-num-outputs", (2, 7), 3, {"axis": 1, "num_outputs": 3}, opset=18),
    _split("opset18-num-outputs-even", (8, 2), 4, {"num_outputs": 4}, opset=18),
    _split("one-output", (3, 4), 1, {"axis": 1}),
    _split("qkv", (1, 4, 12), 3, {"axis": 2}, split=[4, 4, 4]),
    _split("int64", (4, 3), 2, dtype="int64"),
    _split("bool", (2, 4), 2, {"axis": 1}, dtype="bool"),
    _split("int32", (6,), 3, dtype="int32"),
    _split("zero-size-part", (2, 5), 3, {"axis": 1}, split=[2, 0, 3]),
    _split("zero-size-parts-bool", (4, 3), 3, split=[0, 4, 0], dtype="bool"),
    _split("empty-input", (0, 4), 2),
]

# ------------------------------------------------------------------------------------------------------ Trilu


def _trilu(id: str, shape, upper: int | None = None, k: int | None = None, dtype: str = "float32") -> OpCase:
    attrs = {} if upper is None else {"upper": upper}
    inits = {} if k is None else {"k": np.int64(k)}
    return typed_case(f"trilu-{id}", "Trilu", [("x", shape, dtype)], attrs, inits, opset=14)


TRILU_CASES: list[OpCase] = [
    _trilu("default-upper", (4, 5)),
    _trilu("lower", (5, 4), upper=0),
    _trilu("upper-k2", (3, 6), 1, 2),
    _trilu("upper-k-negative", (2, 5, 4), 1, -2),
    _trilu("lower-k1", (2, 3, 4, 4), 0, 1),
    _trilu("lower-k-negative", (6, 3), 0, -1),
    _trilu("k-beyond-matrix", (3, 3), 1, 5),
    _trilu("int64", (4, 4), 0, dtype="int64"),
    _trilu("bool-causal-mask", (1, 6, 6), 0, dtype="bool"),
    _trilu("int32", (3, 5), 1, 1, dtype="int32"),
    case(
        "trilu-computed-k",
        single_op_model("Trilu", [("x", (4, 6), "float32"), ("k", (), "int64")], {}, opset=14),
        {"x": rand(4, 6), "k": np.array(-1, np.int64)},
    ),
]

# ------------------------------------------------------------------------------------ DepthToSpace, SpaceToDepth


def _blocks(
    op: str, id: str, shape, blocksize: int, mode: str | None = None, dtype: str = "float32", opset: int = OPSET
) -> OpCase:
    attrs = {"blocksize": blocksize, **({"mode": mode} if mode else {})}
    return typed_case(
        f"{op.lower()}-{id}", op, [("x", shape, dtype)], attrs, opset=opset, onnxruntime=dtype == "float32"
    )


BLOCK_CASES: list[OpCase] = [
    _blocks("DepthToSpace", "dcr-default", (1, 8, 2, 3), 2),
    _blocks("DepthToSpace", "dcr", (2, 18, 2, 2), 3, "DCR"),
    _blocks("DepthToSpace", "crd", (2, 8, 3, 2), 2, "CRD"),
    _blocks("DepthToSpace", "opset11-crd", (1, 12, 2, 2), 2, "CRD", opset=11),
    _blocks("DepthToSpace", "opset9", (1, 4, 2, 3), 2, opset=9),
    _blocks("DepthToSpace", "int64", (1, 4, 2, 2), 2, "CRD", dtype="int64"),
    _blocks("DepthToSpace", "bool", (1, 4, 1, 3), 2, dtype="bool"),
    _blocks("SpaceToDepth", "2", (1, 3, 4, 6), 2),
    _blocks("SpaceToDepth", "3", (2, 2, 6, 3), 3),
    _blocks("SpaceToDepth", "blocksize1", (1, 2, 3, 3), 1),
    _blocks("SpaceToDepth", "opset9", (1, 1, 4, 4), 2, opset=9),
    _blocks("SpaceToDepth", "int32", (1, 2, 2, 4), 2, dtype="int32"),
]

# -------------------------------------------------------------------------------------------- ReverseSequence


def _reverse(
    id: str, shape, lens, batch_axis: int | None = None, time_axis: int | None = None, dtype: str = "float32"
) -> OpCase:
    attrs = {k: v for k, v in (("batch_axis", batch_axis), ("time_axis", time_axis)) if v is not None}
    inputs = [("x", shape, dtype), ("lens", (len(lens),), "int64")]
    feeds = {"x": sample(shape, dtype), "lens": i64(lens)}
    return case(f"reverse-sequence-{id}", single_op_model("ReverseSequence", inputs, attrs), feeds)


REVERSE_CASES: list[OpCase] = [
    _reverse("time-major", (4, 3, 2), [4, 1, 3]),
    _reverse("batch-major", (3, 5), [5, 2, 1], batch_axis=0, time_axis=1),
    _reverse("batch-major-3d", (2, 4, 3), [3, 4], batch_axis=0, time_axis=1),
    _reverse("int64", (3, 2), [2, 3], dtype="int64"),
    case(
        "reverse-sequence-constant-lens",
        single_op_model("ReverseSequence", [("x", (4, 2, 3), "float32")], {}, {"lens": i64([3, 4])}),
    ),
]

# ----------------------------------------------------------------------------------------------------- Einsum


def _einsum(id: str, equation: str, *shapes, dtype: str = "float32") -> OpCase:
    inputs = [(f"x{i}", shape, dtype) for i, shape in enumerate(shapes)]
    return typed_case(f"einsum-{id}", "Einsum", inputs, {"equation": equation})


EINSUM_CASES: list[OpCase] = [
    # Matmul-shaped: Gemm, with transposes into scratch where an operand or the output is not [batch, m, k/n].
    _einsum("matmul", "ij,jk->ik", (3, 4), (4, 5)),
    _einsum("batch-matmul", "bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
    _einsum("attention-scores", "bhid,bhjd->bhij", (2, 3, 5, 4), (2, 3, 6, 4)),
    _einsum("attention-context", "bhij,bhjd->bhid", (1, 2, 5, 6), (1, 2, 6, 4)),
    _einsum("ellipsis-matmul", "...ij,...jk->...ik", (2, 3, 4, 5), (2, 3, 5, 2)),
    _einsum("ellipsis-broadcast", "...ij,...jk->...ik", (2, 1, 3, 4), (1, 5, 4, 2)),
    _einsum("linear-transposed-weight", "ij,kj->ik", (3, 4), (6, 4)),
    _einsum("transposed-output", "ij,jk->ki", (3, 4), (4, 5)),
    _einsum("dot", "i,i->", (7,), (7,)),
    _einsum("matrix-vector", "ij,j->i", (4, 6), (6,)),
    _einsum("two-contracted-axes", "abc,bcd->ad", (2, 3, 4), (3, 4, 5)),
    _einsum("implicit-output", "ij,jk", (3, 4), (4, 2)),
    _einsum("spaces", "b i j , b j k -> b i k", (2, 2, 3), (2, 3, 2)),
    # Everything else: a loop nest.
    _einsum("transpose", "ij->ji", (3, 4)),
    _einsum("diagonal", "ii->i", (4, 4)),
    _einsum("batch-diagonal", "...ii->...i", (2, 3, 3)),
    _einsum("trace", "ii->", (5, 5)),
    _einsum("sum-axis", "ij->i", (3, 4)),
    _einsum("sum-all", "ij->", (3, 4)),
    _einsum("elementwise", "i,i->i", (5,), (5,)),
    _einsum("outer", "i,j->ij", (3,), (4,)),
    _einsum("summed-within-one-input", "ij,jk->i", (3, 4), (4, 2)),
    _einsum("three-inputs", "ij,jk,kl->il", (2, 3), (3, 4), (4, 2)),
    _einsum("implicit-transpose", "ba", (3, 2)),
    _einsum("int64-matmul", "ij,jk->ik", (3, 4), (4, 2), dtype="int64"),
    _einsum("int32-sum", "ij->j", (3, 4), dtype="int32"),
]

# MatMul is lowered in farm.ops.matmul; these cases cover its batching paths next to Einsum's: batches folded into
# the Gemm's rows, a flat parallel batch loop, broadcast batch dims, 1-D operands, integers.
MATMUL_CASES: list[OpCase] = [
    typed_case("matmul-linear-layer", "MatMul", [("x", (2, 8, 16), "float32")], {}, {"w": rand(16, 12)}),
    typed_case("matmul-attention-scores", "MatMul", [("q", (2, 4, 8, 16), "float32"), ("k", (2, 4, 16, 8), "float32")]),
    typed_case("matmul-shared-a", "MatMul", [("a", (5, 6), "float32"), ("b", (3, 6, 4), "float32")]),
    typed_case("matmul-broadcast-heads", "MatMul", [("a", (2, 1, 3, 4), "float32"), ("b", (1, 5, 4, 2), "float32")]),
    typed_case("matmul-vector-batched", "MatMul", [("a", (4,), "float32"), ("b", (2, 3, 4, 5), "float32")]),
    typed_case("matmul-batched-vector", "MatMul", [("a", (2, 3, 5, 4), "float32"), ("b", (4,), "float32")]),
    typed_case("matmul-int64", "MatMul", [("a", (2, 3, 4), "int64"), ("b", (4, 5), "int64")]),
    typed_case("matmul-int32-broadcast", "MatMul", [("a", (3, 4), "int32"), ("b", (2, 4, 2), "int32")]),
]


def _attention_block() -> OpCase:
    """A small BERT-style block: embedding Gather, fused QKV MatMul, Split, head reshapes (through a folded
    Shape -> Gather -> Concat chain), Q.K^T as Einsum, Softmax, context MatMul, merge heads."""
    batch, seq, hidden, heads = 2, 5, 16, 4
    head = hidden // heads
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"]),
        helper.make_node("Split", ["qkv", "split"], ["q", "k", "v"], axis=-1),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "zero", "two"], ["batch_seq"]),
        helper.make_node("Concat", ["batch_seq", "head_dims"], ["split_shape"], axis=0),
        *[helper.make_node("Reshape", [t, "split_shape"], [f"{t}4"]) for t in "qkv"],
        *[helper.make_node("Transpose", [f"{t}4"], [f"{t}h"], perm=[0, 2, 1, 3]) for t in "qkv"],
        helper.make_node("Einsum", ["qh", "kh"], ["scores"], equation="bhid,bhjd->bhij"),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vh"], ["context"]),
        helper.make_node("Transpose", ["context"], ["merged"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["merged", "out_shape"], ["y"]),
    ]
    inits = {
        "table": rand(30, hidden, seed=1),
        "w_qkv": rand(hidden, 3 * hidden, seed=2, scale=0.3),
        "split": i64([hidden] * 3),
        "zero": i64([0]),
        "two": i64([2]),
        "head_dims": i64([heads, head]),
        "out_shape": i64([batch, seq, hidden]),
    }
    model = graph_model(nodes, [("ids", (batch, seq), "int64")], initializers=inits)
    ids = np.random.default_rng(3).integers(0, 30, (batch, seq))
    return case("graph-attention-block", model, {"ids": ids})


GRAPH_CASES: list[OpCase] = [_attention_block()]

CASES: list[OpCase] = (
    RESHAPE_CASES
    + PASSTHROUGH_CASES
    + TRANSPOSE_CASES
    + CONCAT_CASES
    + PAD_CASES
    + DTYPE_CASES
    + EXPAND_TILE_CASES
    + SLICE_CASES
    + SPLIT_CASES
    + TRILU_CASES
    + BLOCK_CASES
    + REVERSE_CASES
    + EINSUM_CASES
    + MATMUL_CASES
    + GRAPH_CASES
)


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built.
HOSTILE = [
    pytest.param(
        hostile_op_model("Pad", {"mode": "reflect"}, {"pads": np.array([0, 0, 2**20, 0, 0, 0, 2**20, 0])}),
        "reflect pads 1048576, 1048576 of axis 2 exceed its size 4 less one",
        id="pad-reflect-huge",
    ),
    pytest.param(
        hostile_op_model("Pad", {"mode": "reflect"}, {"pads": np.array([0, 0, 4, 0, 0, 0, 0, 0])}),
        "reflect pads 4, 0 of axis 2 exceed",
        id="pad-reflect-dim",
    ),
    pytest.param(
        hostile_op_model("Flatten", {"axis": 2**40}),
        "axis 1099511627776 is out of range for Flatten",
        id="flatten-axis",
    ),
    pytest.param(
        hostile_op_model("Concat", {"axis": 2**40}), "axis 1099511627776 is out of range for rank 4", id="concat-axis"
    ),
    pytest.param(
        hostile_op_model("Transpose", {"perm": [0, 0, 1, 2]}), "not a permutation|unknown shape", id="transpose-perm"
    ),
    pytest.param(
        hostile_op_model(
            "ReverseSequence", {"batch_axis": 2**40, "time_axis": 0}, {"lens": np.array([1, 1])}, x=(4, 2)
        ),
        "batch_axis 1099511627776 and time_axis 0 must be 0 and 1",
        id="reversesequence-axes",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
