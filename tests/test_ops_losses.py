"""farm.ops.losses against onnxruntime: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss over reductions,
weights, ignore_index (negative, inside and outside the classes) and N-D targets, SCE's log_prob output; targets
outside the classes (ONNX leaves them undefined) read clamped classes; a sample on OpenCL; refusals."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
    rand,
    single_op_model,
)

OPSET = 13  # both ops' first opset (SoftmaxCrossEntropyLoss and NegativeLogLikelihoodLoss)


def targets(shape: Sequence[int], classes: int, ignore: int | None = None, seed: int = 0) -> np.ndarray:
    """Targets in [0, classes), about a quarter of them set to `ignore` when given."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, classes, shape).astype(np.int64)
    if ignore is not None:
        values[rng.random(shape) < 0.25] = ignore
    return values


def _loss(
    id: str,
    op: str,
    x_shape: Sequence[int],
    attrs: Mapping[str, object] | None = None,
    *,
    weight: bool = False,
    ignore: int | None = None,
    log_prob: bool = False,
    target_dtype: str = "int64",
    feeds: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
) -> OpCase:
    """A loss case on input x of `x_shape` (N, C, d...), targets t and optionally a weight input w."""
    classes, t_shape = x_shape[1], (x_shape[0], *x_shape[2:])
    attrs = {**(attrs or {}), **({"ignore_index": ignore} if ignore is not None else {})}
    inputs = [("x", x_shape, "float32"), ("t", t_shape, target_dtype)] + (
        [("w", (classes,), "float32")] if weight else []
    )
    outputs = ("y", "log_prob") if log_prob else ("y",)
    feed = {
        "x": rand(*x_shape, seed=1),
        "t": targets(t_shape, classes, ignore).astype(target_dtype),
        **({"w": rand(classes, seed=2, positive=True)} if weight else {}),
        **(feeds or {}),
    }
    return case(f"{op}-{id}", single_op_model(op, inputs, attrs, opset=opset, outputs=outputs), feed)


def _nll(id: str, x_shape: Sequence[int], reduction: str | None = None, **kwargs) -> OpCase:
    return _loss(id, "NegativeLogLikelihoodLoss", x_shape, {"reduction": reduction} if reduction else {}, **kwargs)


def _sce(id: str, x_shape: Sequence[int], reduction: str | None = None, **kwargs) -> OpCase:
    return _loss(id, "SoftmaxCrossEntropyLoss", x_shape, {"reduction": reduction} if reduction else {}, **kwargs)


NLL_CASES: list[OpCase] = [
    _nll("NC-default-mean", (4, 5)),
    _nll("NC-none", (4, 5), "none"),
    _nll("NC-sum-weight", (4, 5), "sum", weight=True),
    _nll("NCd1-mean-weight-ii", (3, 5, 6), "mean", weight=True, ignore=2),
    _nll("NCd1-mean-negative-ii", (3, 5, 6), "mean", ignore=-1),
    _nll("NCd1d2-none-weight-negative-ii", (2, 4, 3, 5), "none", weight=True, ignore=-3),
    _nll("NCd1d2-sum-ii-outside-classes", (2, 4, 3, 5), "sum", ignore=10),
    _nll("NCd1d2d3-mean-weight", (2, 3, 2, 3, 4), "mean", weight=True),
    _nll("int32-targets", (3, 5, 2), "mean", weight=True, ignore=0, target_dtype="int32"),
    _nll("opset22", (3, 5, 2), "sum", ignore=1, opset=22),
]

SCE_CASES: list[OpCase] = [
    _sce("NC-default-mean", (4, 5)),
    _sce("NC-none-log-prob", (4, 5), "none", log_prob=True),
    _sce("NC-sum-weight", (4, 5), "sum", weight=True),
    _sce("NCd1-mean-weight-ii-log-prob", (3, 5, 6), "mean", weight=True, ignore=1, log_prob=True),
    _sce("NCd1d2-none-negative-ii", (2, 4, 3, 5), "none", ignore=-2),
    _sce("NCd1d2d3-mean-weight-log-prob", (2, 3, 2, 3, 4), "mean", weight=True, log_prob=True),
    _sce("large-logits", (3, 6), "mean", feeds={"x": rand(3, 6, seed=4, scale=300.0)}),
    _sce("int32-targets-sum", (3, 5, 2), "sum", ignore=4, target_dtype="int32"),
]

CASES: list[OpCase] = NLL_CASES + SCE_CASES


@pytest.mark.parametrize("c", params(CASES))
def test_matches_onnxruntime(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


def _clamped_nll(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The documented behaviour for targets outside [0, C): the class is clamped into range."""
    picked = np.take_along_axis(x, np.clip(t, 0, x.shape[1] - 1)[:, None], axis=1)[:, 0]
    return -picked


def test_targets_outside_the_classes_read_clamped_classes(tmp_path) -> None:
    """ONNX leaves such targets undefined; farm reads the nearest class rather than memory outside the input."""
    t = np.array([[-7, 0, 4], [2**40, 3, -1]], np.int64)
    x = rand(2, 4, 3, seed=3)
    model = single_op_model(
        "NegativeLogLikelihoodLoss", [("x", (2, 4, 3)), ("t", (2, 3), "int64")], {"reduction": "none"}, opset=OPSET
    )
    check_case(
        case(
            "nll-out-of-range",
            model,
            {"x": x, "t": t},
            reference=lambda feeds: {"y": _clamped_nll(feeds["x"], feeds["t"])},
        ),
        tmp_path,
    )


def test_mean_over_only_ignored_targets_is_nan(tmp_path) -> None:
    """Nothing to average: 0 / 0, as ONNX's reference gives."""
    model = single_op_model(
        "SoftmaxCrossEntropyLoss", [("x", (2, 3)), ("t", (2,), "int64")], {"ignore_index": 1}, opset=OPSET
    )
    feeds = {"x": rand(2, 3), "t": np.array([1, 1], np.int64)}
    check_case(case("sce-all-ignored", model, feeds, reference=lambda _: {"y": np.float32(np.nan)}), tmp_path)


# A case per kernel shape: a parallel per-element loss, a serial weighted mean, SCE with its log_prob output.
OPENCL_SAMPLE = [
    "NegativeLogLikelihoodLoss-NCd1d2-none-weight-negative-ii",
    "NegativeLogLikelihoodLoss-NCd1-mean-weight-ii",
    "SoftmaxCrossEntropyLoss-NCd1-mean-weight-ii-log-prob",
]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_onnxruntime(c: OpCase, fingerprint: str, tmp_path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


def test_opencl_sample_names_cases() -> None:
    assert set(OPENCL_SAMPLE) <= {c.id for c in CASES}


UNSUPPORTED = [
    pytest.param(
        single_op_model(
            "NegativeLogLikelihoodLoss", [("x", (3, 4)), ("t", (3,), "int64")], {"reduction": "max"}, opset=OPSET
        ),
        "reduction 'max' is not supported",
        id="nll-reduction",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)


HOSTILE = [
    pytest.param(
        hostile_op_model(
            "SoftmaxCrossEntropyLoss",
            {"reduction": "none"},
            {"t": np.zeros((2, 5), np.int64)},
            x=(2, 4, 3),
            opset=OPSET,
        ),
        "does not match|inconsistent",
        id="sce-target-shape",
    ),
    pytest.param(
        hostile_op_model(
            "NegativeLogLikelihoodLoss",
            {},
            {"t": np.zeros(2, np.int64), "w": np.ones(5, np.float32)},
            x=(2, 4),
            opset=OPSET,
        ),
        "does not match|inconsistent",
        id="nll-weight-shape",
    ),
]


@pytest.mark.parametrize("model, message", HOSTILE)
def test_hostile_attributes_are_refused(model, message: str, tmp_path) -> None:
    assert_refused(model, message, tmp_path)
