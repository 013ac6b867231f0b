"""farm.ops.attention against ONNX's reference evaluator (the ground truth the conformance cases come from):
Attention (opsets 23-25: 3-D and 4-D inputs, grouped-query heads, masks, caches, softcap, qk_matmul_output, padding
and windows) and RotaryEmbedding, on CPU and a sample on OpenCL, plus the variants farm refuses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from numerics import (
    OpCase,
    assert_unsupported,
    case,
    check_case,
    check_case_on_opencl,
    graph_model,
    params,
    single_op_model,
)
from onnx import helper
from test_ops_tensor import onnx_reference

ATTENTION_NODE_INPUTS = ("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
ATTENTION_NODE_OUTPUTS = ("Y", "present_key", "present_value", "qk_matmul_output")


def _feed(name: str, shape: Sequence[int], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.7
    return rng.standard_normal(shape).astype(dtype)


def _attention(
    id: str,
    q,
    k,
    v,
    attrs: Mapping[str, object] | None = None,
    *,
    mask=None,
    mask_dtype="float32",
    past: tuple[int, int] | None = None,
    nonpad: Sequence[int] | None = None,
    outputs: Sequence[str] = ("Y",),
    opset: int = 23,
    feeds: Mapping[str, np.ndarray] | None = None,
) -> OpCase:
    """An Attention case: Q, K, V shapes, an optional mask shape, a past of (length, v head size) for 4-D caches,
    nonpad_kv_seqlen values; the graph outputs are the named ones (the others left out of the node)."""
    kv_heads = k[1] if len(k) == 4 else attrs["kv_num_heads"]
    head = q[-1] if len(q) == 4 else q[2] // attrs["q_num_heads"]
    inputs = {"Q": (q, "float32"), "K": (k, "float32"), "V": (v, "float32")}
    if mask is not None:
        inputs["attn_mask"] = (mask, mask_dtype)
    if past is not None:
        inputs["past_key"] = ((k[0], kv_heads, past[0], head), "float32")
        inputs["past_value"] = ((k[0], kv_heads, past[0], past[1]), "float32")
    given = {name: _feed(name, shape, dtype, seed) for seed, (name, (shape, dtype)) in enumerate(inputs.items())}
    graph_inputs = [(name, shape, dtype) for name, (shape, dtype) in inputs.items()]
    if nonpad is not None:
        given["nonpad_kv_seqlen"] = np.array(nonpad, np.int64)
        graph_inputs.append(("nonpad_kv_seqlen", (len(nonpad),), "int64"))
    given.update(feeds or {})
    node_inputs = [name if name in given else "" for name in ATTENTION_NODE_INPUTS]
    while not node_inputs[-1]:
        node_inputs.pop()
    node_outputs = [name if name in outputs else "" for name in ATTENTION_NODE_OUTPUTS]
    while not node_outputs[-1]:
        node_outputs.pop()
    node = helper.make_node("Attention", node_inputs, node_outputs, name="victim", **dict(attrs or {}))
    model = graph_model([node], graph_inputs, outputs, opset=opset)
    return case(f"attention-{id}", model, given, reference=onnx_reference(model))


Q4, K4, V4 = (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5)
ALL_OUTPUTS = ATTENTION_NODE_OUTPUTS
ATTENTION_CASES = [
    _attention("4d", Q4, K4, V4),
    _attention("4d-scaled-softcap", Q4, K4, V4, {"scale": 0.3, "softcap": 1.5}),
    _attention("4d-causal-float-mask", Q4, K4, V4, {"is_causal": 1}, mask=(2, 1, 4, 6)),
    _attention("4d-bool-mask-short", Q4, K4, V4, mask=(4, 4), mask_dtype="bool"),
    _attention("4d-float-mask-3d-short", Q4, K4, V4, mask=(3, 4, 5)),
    _attention("4d-gqa", (2, 6, 4, 8), K4, V4, {"is_causal": 1}),
    _attention("3d-gqa-mask", (2, 4, 48), (2, 6, 16), (2, 6, 10), {"q_num_heads": 6, "kv_num_heads": 2}, mask=(4, 6)),
    _attention(
        "3d-past-all-outputs",
        (2, 4, 24),
        (2, 3, 24),
        (2, 3, 30),
        {"q_num_heads": 3, "kv_num_heads": 3, "is_causal": 1},
        mask=(4, 8),
        past=(5, 10),
        outputs=ALL_OUTPUTS,
    ),
    *[
        _attention(
            f"4d-past-qk-mode{mode}",
            Q4,
            K4,
            V4,
            {"qk_matmul_output_mode": mode, "softcap": 2.0},
            mask=(2, 3, 4, 9),
            past=(3, 5),
            outputs=ALL_OUTPUTS,
        )
        for mode in range(4)
    ],
    _attention("4d-past-no-present", Q4, K4, V4, {"is_causal": 1}, past=(2, 5)),
    _attention(
        "fully-masked-rows",
        (1, 2, 3, 8),
        (1, 2, 3, 8),
        (1, 2, 3, 8),
        {"qk_matmul_output_mode": 3},
        mask=(3, 3),
        mask_dtype="bool",
        outputs=("Y", "qk_matmul_output"),
        feeds={"attn_mask": np.array([[False] * 3, [True, False, True], [False] * 3])},
    ),
    _attention(
        "neginf-mask-row",
        (1, 1, 3, 8),
        (1, 1, 4, 8),
        (1, 1, 4, 8),
        {"softcap": 0.5},
        mask=(3, 4),
        feeds={"attn_mask": np.array([[0, -np.inf, 0, 1], [-np.inf] * 4, [2, 0, -np.inf, 0]], np.float32)},
    ),
    _attention(
        "nonpad-causal",
        (3, 2, 2, 8),
        (3, 2, 6, 8),
        (3, 2, 6, 8),
        {"is_causal": 1},
        nonpad=[6, 3, 1],
        mask=(3, 1, 2, 6),
        mask_dtype="bool",
        opset=24,
    ),
    _attention("nonpad-gqa-decode", (2, 4, 1, 8), (2, 2, 8, 8), (2, 2, 8, 8), nonpad=[5, 8], opset=24),
    _attention("window-left-causal", Q4, K4, V4, {"is_causal": 1, "left_window_size": 2}, opset=25),
    _attention(
        "window-both-past",
        Q4,
        K4,
        V4,
        {"left_window_size": 1, "right_window_size": 2},
        past=(3, 5),
        opset=25,
        outputs=("Y", "present_key", "present_value"),
    ),
    _attention(
        "window-rank1-mask-precision",
        Q4,
        K4,
        V4,
        {"left_window_size": 2, "softmax_precision": 11},
        mask=(6,),
        mask_dtype="bool",
        opset=25,
    ),
    _attention(
        "bert-base",
        (1, 128, 768),
        (1, 128, 768),
        (1, 128, 768),
        {"q_num_heads": 12, "kv_num_heads": 12},
        mask=(1, 1, 1, 128),
    ),
]


@pytest.mark.parametrize("c", params(ATTENTION_CASES))
def test_attention_matches_reference(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


# ------------------------------------------------------------------------------------------ RotaryEmbedding


def _rotary(
    id: str,
    x: Sequence[int],
    cache: Sequence[int],
    attrs: Mapping[str, object] | None = None,
    positions: Sequence[int] | None = None,
    max_position: int = 0,
) -> OpCase:
    inputs = [("input", x, "float32"), ("cos_cache", cache, "float32"), ("sin_cache", cache, "float32")]
    feeds = {name: _feed(name, shape, dtype, seed) for seed, (name, shape, dtype) in enumerate(inputs)}
    if positions is not None:
        inputs.append(("position_ids", positions, "int64"))
        feeds["position_ids"] = np.random.default_rng(9).integers(0, max_position, positions).astype(np.int64)
    model = single_op_model("RotaryEmbedding", inputs, attrs, opset=23)
    return case(f"rotary-{id}", model, feeds, reference=onnx_reference(model))


ROTARY_CASES = [
    _rotary("4d-positions", (2, 4, 3, 8), (20, 4), positions=(2, 3), max_position=20),
    _rotary(
        "4d-interleaved-partial",
        (2, 4, 3, 8),
        (20, 2),
        {"interleaved": 1, "rotary_embedding_dim": 4},
        positions=(2, 3),
        max_position=20,
    ),
    _rotary("3d-broadcast-positions", (2, 3, 24), (10, 3), {"num_heads": 4}, positions=(1, 3), max_position=10),
    _rotary("3d-no-positions-partial", (2, 3, 40), (2, 3, 2), {"num_heads": 4, "rotary_embedding_dim": 4}),
    _rotary("4d-no-positions-broadcast-cache", (2, 4, 3, 8), (1, 3, 4), {"interleaved": 1}),
]


@pytest.mark.parametrize("c", params(ROTARY_CASES))
def test_rotary_matches_reference(c: OpCase, tmp_path) -> None:
    check_case(c, tmp_path)


CASES: list[OpCase] = ATTENTION_CASES + ROTARY_CASES

OPENCL_SAMPLE = ["attention-3d-past-all-outputs", "attention-nonpad-causal", "rotary-4d-interleaved-partial"]


@pytest.mark.parametrize("c", params(c for c in CASES if c.id in OPENCL_SAMPLE))
def test_opencl_matches_reference(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    check_case_on_opencl(c, fingerprint, tmp_path)


# --------------------------------------------------------------------------------------------------- refusals


def _refused_attention(attrs: Mapping[str, object], q=Q4, k=K4, v=V4, **kwargs):
    return _attention("refused", q, k, v, attrs, **kwargs).model


UNSUPPORTED = [
    pytest.param(_refused_attention({"softmax_precision": 10}), "softmax_precision 10", id="float16-softmax"),
    pytest.param(
        _refused_attention({"qk_matmul_output_mode": 4}, outputs=("Y", "qk_matmul_output")),
        "qk_matmul_output_mode 4",
        id="qk-mode",
    ),
    pytest.param(_refused_attention({}, q=(2, 4, 4, 8)), "don't divide 4 query heads", id="heads-indivisible"),
    pytest.param(_refused_attention({"scale": -1.0}), "must be positive", id="negative-scale"),
    pytest.param(_refused_attention({}, mask=(4, 7)), "doesn't broadcast", id="mask-too-long"),
    pytest.param(_refused_attention({}, mask=(3, 6)), "doesn't broadcast", id="mask-rows"),
    pytest.param(
        _refused_attention({"q_num_heads": 6, "kv_num_heads": 3}),
        "only when they match the shapes",
        id="4d-heads-mismatch",
    ),
    pytest.param(
        single_op_model(
            "RotaryEmbedding",
            [("x", (2, 4, 3, 8)), ("c", (2, 3, 3)), ("s", (2, 3, 3))],
            {"rotary_embedding_dim": 5},
            opset=23,
        ),
        "must be even",
        id="rotary-odd-dim",
    ),
    pytest.param(
        single_op_model("RotaryEmbedding", [("x", (2, 4, 3, 8)), ("c", (3, 4)), ("s", (3, 4))], opset=23),
        "must be alike",
        id="rotary-2d-cache-without-positions",
    ),
]


@pytest.mark.parametrize("model, message", UNSUPPORTED)
def test_unsupported_variants_are_refused_clearly(model, message: str, tmp_path) -> None:
    assert_unsupported(model, message, tmp_path)
