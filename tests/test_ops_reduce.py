"""farm.ops.reduce against onnxruntime: the Reduce* ops over axis sets (attribute or input axes by opset, keepdims,
noop_with_empty_axes, negative axes, integer and bool inputs), ArgMax/ArgMin and TopK, one op per model; a sample
also on OpenCL, and reductions over nothing through the kernel directly."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from native_helpers import run_kernel
from numerics import (
    OPSET,
    OpCase,
    assert_refused,
    case,
    check_case,
    check_case_on_opencl,
    hostile_op_model,
    params,
    rand,
    random_feeds,
    run_onnxruntime,
    single_op_model,
)
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import farm.runtime
from farm.backends.llvm.target import host_target
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.ir.graph import TensorInfo
from farm.ir.specs import KernelSpec, canonical_json
from farm.ops import lower_kernel

X3 = (3, 4, 5)
X4 = (2, 3, 4, 5)


def _i64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64)


def typed_model(
    op: str,
    x_shape: tuple[int, ...],
    dtype: int,
    attrs: dict | None = None,
    initializers: dict | None = None,
    opset: int = OPSET,
    outputs: tuple[str, ...] = ("y",),
) -> onnx.ModelProto:
    """single_op_model on one graph input x of ONNX element type `dtype` (then the initializers)."""
    x = ("x", x_shape, helper.tensor_dtype_to_np_dtype(dtype))
    return single_op_model(op, [x], attrs, initializers, opset, outputs=outputs)


def _ints(*shape: int, seed: int = 0, low: int = -9, high: int = 10, dtype=np.int64) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high, shape).astype(dtype)


# ------------------------------------------------------------------------------------------------- reductions

REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]


def _axes_input_opset(op: str) -> int:
    return 13 if op == "ReduceSum" else 18


def _reduce(
    op: str,
    id: str,
    shape: tuple[int, ...],
    axes: list[int] | None,
    keepdims: int | None = None,
    legacy: bool = False,
    noop: int | None = None,
    feeds: dict | None = None,
) -> OpCase:
    """op over `axes` (None: absent), as an attribute (legacy: the opset before axes became an input) or as a
    constant input."""
    attrs = {} if keepdims is None else {"keepdims": keepdims}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    initializers = {}
    opset = _axes_input_opset(op) - 2 if legacy else _axes_input_opset(op)
    if axes is not None and legacy:
        attrs["axes"] = axes
    elif axes is not None:
        initializers["axes"] = _i64(axes)
    model = single_op_model(op, [("x", shape)], attrs, initializers, opset)
    return case(f"{op}-{id}", model, feeds)


def _positive(shape: tuple[int, ...]) -> dict:
    return {"x": rand(*shape, positive=True)}


def _reduce_cases(op: str) -> list[OpCase]:
    feeds = _positive if op == "ReduceLogSum" else lambda shape: None
    return [
        _reduce(op, "axis1-keepdims", X3, [1], feeds=feeds(X3)),
        _reduce(op, "axes-0-2-no-keepdims", X3, [0, 2], keepdims=0, feeds=feeds(X3)),
        _reduce(op, "all-default", X3, None, feeds=feeds(X3)),
        _reduce(op, "all-default-no-keepdims", X3, None, keepdims=0, feeds=feeds(X3)),
        _reduce(op, "negative-axes", X4, [-1, -2], feeds=feeds(X4)),
        _reduce(op, "middle-axis", X4, [1], keepdims=0, feeds=feeds(X4)),
        _reduce(op, "attribute-axes", X4, [0, -1], legacy=True, feeds=feeds(X4)),
        _reduce(op, "attribute-all", X3, None, keepdims=0, legacy=True, feeds=feeds(X3)),
        _reduce(op, "noop-empty-axes", X3, None, noop=1, feeds=feeds(X3)),
        _reduce(op, "rank1", (7,), [0], keepdims=0, feeds=feeds((7,))),
    ]


def _typed_reduce(op: str, dtype: int, x: np.ndarray, axes: list[int], keepdims: int = 1, opset: int = 18) -> OpCase:
    model = typed_model(op, x.shape, dtype, {"keepdims": keepdims}, {"axes": _i64(axes)}, opset)
    return case(f"{op}-{np.dtype(x.dtype).name}-{'-'.join(map(str, axes))}-k{keepdims}", model, {"x": x})


REDUCE_CASES: list[OpCase] = [c for op in REDUCE_OPS for c in _reduce_cases(op)] + [
    _reduce("ReduceMean", "gap-like", (2, 8, 7, 7), [2, 3]),
    _reduce("ReduceMean", "last-of-3d", (2, 16, 64), [-1]),
    _reduce("ReduceSum", "ones-in-shape", (1, 3, 1, 4), [0, 3], keepdims=0),
    _reduce("ReduceSum", "size-1-axis", (3, 1, 4), [1]),
    _reduce("ReduceMax", "scattered-axes", (2, 3, 4, 5, 2), [0, 2, 4], keepdims=0),
    _reduce("ReduceSum", "long-row", (3, 3000), [1]),
    case(
        "ReduceLogSumExp-large-values",
        single_op_model("ReduceLogSumExp", [("x", X3)], {}, {"axes": _i64([2])}, opset=18),
        {"x": rand(*X3, scale=100.0)},
    ),
    case("ReduceMean-opset11", single_op_model("ReduceMean", [("x", X4)], {"axes": [1, 2]}, opset=11)),
    case("ReduceMax-opset9", single_op_model("ReduceMax", [("x", X4)], {"axes": [3], "keepdims": 0}, opset=9)),
    _typed_reduce("ReduceSum", TensorProto.INT64, _ints(3, 4, 5), [1]),
    _typed_reduce("ReduceSum", TensorProto.INT32, _ints(3, 4, 5, dtype=np.int32), [0, 2], keepdims=0),
    _typed_reduce("ReduceMax", TensorProto.INT64, _ints(3, 4, 5, seed=1), [2]),
    _typed_reduce("ReduceMin", TensorProto.INT64, _ints(3, 4, 5, seed=2), [0]),
    _typed_reduce("ReduceMax", TensorProto.INT64, np.full((2, 3), np.iinfo(np.int64).min, np.int64), [1]),
    _typed_reduce("ReduceProd", TensorProto.INT64, _ints(3, 4, 2, seed=3, low=-3, high=4), [1, 2], keepdims=0),
    _typed_reduce("ReduceMax", TensorProto.BOOL, _ints(4, 3, seed=4, low=0, high=2).astype(bool), [1], opset=20),
    _typed_reduce("ReduceMin", TensorProto.BOOL, _ints(4, 3, seed=5, low=0, high=2).astype(bool), [1], opset=20),
]

# ------------------------------------------------------------------------------------------ ArgMax and ArgMin


def _arg(
    op: str, id: str, shape: tuple[int, ...], attrs: dict, x: np.ndarray | None = None, dtype: int = TensorProto.FLOAT
) -> OpCase:
    return case(f"{op}-{id}", typed_model(op, shape, dtype, attrs), None if x is None else {"x": x})


TIES = np.array([[1, 3, 3, 0], [2, 2, 1, 2], [5, 5, 5, 5]], np.float32)

ARG_CASES: list[OpCase] = [
    case
    for op in ("ArgMax", "ArgMin")
    for case in (
        _arg(op, "default", X3, {}),
        _arg(op, "axis1", X3, {"axis": 1}),
        _arg(op, "last-axis-no-keepdims", X3, {"axis": 2, "keepdims": 0}),
        _arg(op, "negative-axis", X4, {"axis": -3}),
        _arg(op, "ties-first", TIES.shape, {"axis": 1}, TIES),
        _arg(op, "ties-last", TIES.shape, {"axis": 1, "select_last_index": 1}, TIES),
        _arg(op, "ties-last-axis0", TIES.shape, {"axis": 0, "select_last_index": 1, "keepdims": 0}, TIES),
        _arg(op, "int32", (3, 6), {"axis": 1}, _ints(3, 6, dtype=np.int32), TensorProto.INT32),
    )
]

# -------------------------------------------------------------------------------------------------------- TopK


def _topk(
    id: str, x: np.ndarray, k: int, attrs: dict | None = None, dtype: int = TensorProto.FLOAT, opset: int = OPSET
) -> OpCase:
    if opset < 10:
        model = typed_model("TopK", x.shape, dtype, {**(attrs or {}), "k": k}, opset=opset, outputs=("v", "i"))
    else:
        model = typed_model("TopK", x.shape, dtype, attrs, {"k": _i64([k])}, opset, outputs=("v", "i"))
    return case(f"TopK-{id}", model, {"x": x})


def _sorted_topk_reference(k: int, axis: int):
    """numpy's stable sort: what farm returns for sorted=0 too (onnxruntime's order is then unspecified)."""

    def reference(feeds):
        order = np.argsort(-feeds["x"], axis=axis, kind="stable")
        indices = np.take(order, np.arange(k), axis=axis)
        return {"v": np.take_along_axis(feeds["x"], indices, axis=axis), "i": indices.astype(np.int64)}

    return reference


TOPK_TIES = np.array([[3, 1, 3, 2, 3, 1], [0, 0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6]], np.float32)

TOPK_CASES: list[OpCase] = [
    _topk("k3-last-axis", rand(3, 4, 6), 3),
    _topk("k1", rand(5, 7), 1),
    _topk("k-all", rand(2, 5), 5),
    _topk("axis1", rand(3, 4, 6), 2, {"axis": 1}),
    _topk("axis0", rand(5, 3), 4, {"axis": 0}),
    _topk("negative-axis", rand(3, 4, 6), 2, {"axis": -2}),
    _topk("smallest", rand(3, 4, 6), 3, {"largest": 0}),
    _topk("smallest-axis1", rand(3, 6, 2), 4, {"largest": 0, "axis": 1}),
    _topk("ties", TOPK_TIES, 4),
    _topk("ties-smallest", TOPK_TIES, 4, {"largest": 0}),
    _topk("int64", _ints(3, 8, low=-3, high=3), 3, dtype=TensorProto.INT64),
    _topk("int64-smallest", _ints(3, 8, low=-3, high=3, seed=1), 5, {"largest": 0}, dtype=TensorProto.INT64),
    _topk("opset9-k-attribute", rand(3, 6), 2, opset=9),
    _topk("rank1", rand(9), 4),
    case(
        "TopK-unsorted",
        typed_model("TopK", (3, 7), TensorProto.FLOAT, {"sorted": 0}, {"k": _i64([3])}, outputs=("v", "i")),
        {"x": rand(3, 7)},
        reference=_sorted_topk_reference(3, -1),
    ),
]


def _empty_reduce(
    op: str, dtype: int = TensorProto.FLOAT, axes: list[int] | None = (1,), shape=(2, 0, 4), opset: int = 18, **attrs
) -> OpCase:
    """op over an empty graph input (constant axes, or none)."""
    initializers = {} if axes is None else {"axes": _i64(axes)}
    model = typed_model(op, shape, dtype, attrs, initializers, _axes_input_opset(op) if opset == 18 else opset)
    return _over_nothing_case(
        f"{op}-empty-{np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).name}-{axes}-{shape}", model
    )


def _runtime_axes(op: str, shape, out_shape, axes: list[int], dtype: int = TensorProto.FLOAT, **attrs) -> OpCase:
    """op over an empty input x with its axes a graph input, fed at run time, and the output shape the model
    declares (inference can't give it): whatever the axes, a reduction of an empty tensor reduces nothing."""
    node = helper.make_node(op, ["x", "axes"], ["y"], name="reduce", **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", dtype, shape),
            helper.make_tensor_value_info("axes", TensorProto.INT64, [len(axes)]),
        ],
        [helper.make_tensor_value_info("y", dtype, out_shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    feeds = {"x": np.zeros(shape, helper.tensor_dtype_to_np_dtype(dtype)), "axes": _i64(axes)}
    return _over_nothing_case(f"{op}-empty-run-time-axes-{axes}-{shape}", model, feeds)


def _over_nothing_case(name: str, model: onnx.ModelProto, feeds: dict | None = None) -> OpCase:
    """Against onnxruntime, or ONNX's reference evaluator where onnxruntime differs: it refuses a max or min of no
    bools, and gives 0 for a mean of nothing, which ONNX leaves undefined (farm gives numpy's and the ONNX
    reference's NaN)."""
    op, dtype = model.graph.node[0].op_type, model.graph.input[0].type.tensor_type.elem_type
    if op != "ReduceMean" and dtype != TensorProto.BOOL:
        return case(name, model, feeds)
    evaluator = ReferenceEvaluator(model)
    return case(name, model, feeds, reference=lambda feeds: {"y": evaluator.run(None, dict(feeds))[0]})


EMPTY_CASES: list[OpCase] = [
    *[_empty_reduce(op) for op in REDUCE_OPS],
    *[_empty_reduce(op, TensorProto.INT64) for op in ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin")],
    _empty_reduce("ReduceSum", TensorProto.INT32, [0], shape=(0, 3), keepdims=0),
    *[_empty_reduce(op, TensorProto.BOOL, opset=20) for op in ("ReduceMax", "ReduceMin")],
    _empty_reduce("ReduceSum", axes=None, keepdims=0),
    _empty_reduce("ReduceMax", axes=[2]),  # an empty output: the node needs no kernel
    _empty_reduce("ReduceSum", axes=[0, 1], shape=(3, 0, 2)),
    _runtime_axes("ReduceSum", (2, 0, 4), (2, 1, 4), [1]),
    _runtime_axes("ReduceMean", (2, 0, 4), (2, 4), [-2], keepdims=0),
    _runtime_axes("ReduceLogSumExp", (0, 3), (1, 1), [0, 1]),
    _runtime_axes("ReduceMax", (2, 0), (2, 1), [1], TensorProto.BOOL),
    _runtime_axes("ReduceMin", (2, 0), (2, 1), [1], TensorProto.INT64),
    _runtime_axes("ReduceSum", (2, 0, 4), (2, 0, 1), [2]),  # an empty output: no kernel at all
]

CASES: list[OpCase] = REDUCE_CASES + ARG_CASES + TOPK_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


EMPTY_REDUCTIONS = {
    "ReduceSum": 0.0,
    "ReduceMean": np.nan,
    "ReduceProd": 1.0,
    "ReduceMax": -np.inf,
    "ReduceMin": np.inf,
    "ReduceL1": 0.0,
    "ReduceL2": 0.0,
    "ReduceSumSquare": 0.0,
    "ReduceLogSum": -np.inf,
    "ReduceLogSumExp": -np.inf,
}


@pytest.mark.parametrize("op", sorted(EMPTY_REDUCTIONS))
def test_reduction_over_nothing_gives_the_onnx_value(op: str, tmp_path) -> None:
    """An axis of extent 0 reduces to ONNX's value for a reduction over nothing."""
    spec = KernelSpec(op, canonical_json({"axes": [1]}), (TensorInfo((2, 0, 4)),), (TensorInfo((2, 1, 4)),), None, "")
    out, _ = run_kernel(
        lower_kernel(spec), [np.full((2, 1, 4), 7.0, np.float32), np.zeros((2, 0, 4), np.float32)], tmp_path
    )
    np.testing.assert_array_equal(out, np.full((2, 1, 4), EMPTY_REDUCTIONS[op], np.float32))


def _check_exactly(c: OpCase, tmp_path, device: str = "cpu", targets=()) -> None:
    """Build and run `c` on `device` and compare with its reference exactly, dtype, NaN and the infinities' signs
    included (compare_outputs checks only where the reference is finite)."""
    path = tmp_path / "model.onnx"
    onnx.save(c.model, path)
    artifact = build_model(path, tmp_path, [host_target(), *targets], executor=LocalExecutor(1)).artifact
    feeds = dict(c.feeds) if c.feeds is not None else random_feeds(c.model)
    expected = c.reference(feeds) if c.reference is not None else run_onnxruntime(path, feeds)
    outputs = farm.runtime.load(artifact, device=device, cache_dir=tmp_path / "cache").run(feeds)
    for name, want in expected.items():
        assert outputs[name].dtype == want.dtype
        np.testing.assert_array_equal(outputs[name], want)


@pytest.mark.parametrize("c", params(EMPTY_CASES))
def test_reductions_over_nothing_match_exactly(c: OpCase, tmp_path) -> None:
    _check_exactly(c, tmp_path)


# ------------------------------------------------------------------------------------------------- OpenCL

# A case per kind of kernel: merged axis runs with div/mod decomposition, integer and bool reductions, the
# two-pass log-sum-exp, the arg and TopK selection loops, rendered as OpenCL C and run on this host's device.
OPENCL_SAMPLE = [
    "ReduceSum-axis1-keepdims",
    "ReduceMean-middle-axis",
    "ReduceMax-scattered-axes",
    "ReduceL2-negative-axes",
    "ReduceLogSumExp-large-values",
    "ReduceProd-noop-empty-axes",
    "ReduceSum-int64-1-k1",
    "ReduceMax-bool-1-k1",
    "ArgMax-ties-last",
    "ArgMin-int32",
    "TopK-ties",
    "TopK-axis1",
    "TopK-int64-smallest",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


@pytest.mark.parametrize(
    "c",
    params(
        c
        for c in EMPTY_CASES
        if c.id
        in (
            "ReduceMean-empty-float32-(1,)-(2, 0, 4)",
            "ReduceMin-empty-int64-(1,)-(2, 0, 4)",
            "ReduceMax-empty-float32-[2]-(2, 0, 4)",
        )
    ),
)
def test_opencl_reductions_over_nothing_match_exactly(c: OpCase, fingerprint: str, tmp_path) -> None:
    _check_exactly(c, tmp_path, "opencl", [OpenClTarget(fingerprint)])


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


# Hostile attributes (issue 13): each is refused with one line naming the node, before anything is built.
HOSTILE = [
    pytest.param(
        hostile_op_model("ArgMax", {"axis": 2**40}), "out of range for rank 4|unknown shape", id="argmax-axis"
    ),
    pytest.param(
        hostile_op_model("TopK", {"axis": -(2**40)}, {"k": np.array([1])}, outputs=("y", "i")),
        "out of range for rank 4|unknown shape",
        id="topk-axis",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
