"""Transformer ops: ONNX's Attention (opsets 23-25) and RotaryEmbedding (opset 23).

Attention computes what onnx's reference implementation (onnx/reference/ops/op_attention.py) computes, which is
where the conformance cases' expected outputs come from: Q and K are each scaled by sqrt(scale) before Q @ K^T,
softcap (tanh) comes before the additive bias, qk_matmul_output modes 0 and 1 both give the softcapped scores, and
a query row whose bias is -inf everywhere (every key masked by the mask, causality, the window or padding) gives
zero probabilities, so zeros in Y. It runs as one kernel of four phases: the scaled Q and K^T (and the key/value
caches) copied into scratch, one Gemm per (batch, head) for the scores, one work-item per query row for the bias and
softmax, and one Gemm per (batch, head) for probabilities @ V, written straight into Y.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops import mathfns as M
from farm.ops.registry import NodeContext, register, shape_of

ATTENTION_INPUTS = ("q", "k", "v", "mask", "past_key", "past_value", "nonpad")
"""Attention's inputs by position; the kernel gets the present ones, in this order."""
ATTENTION_OUTPUTS = ("y", "present_key", "present_value", "qk")
"""Attention's outputs by position; the kernel writes the present ones, in this order."""
QK_STAGES = {0: "scores", 1: "scores", 2: "biased", 3: "probabilities"}
"""What qk_matmul_output holds for each qk_matmul_output_mode, as the reference computes it: the (softcapped)
scaled scores for 0 and 1, the scores plus the bias for 2, the softmax for 3."""
SOFTMAX_PRECISIONS = {1: "float", 11: "double"}
"""softmax_precision values computed in float32: float itself, and double, whose softmax the float32 one matches to
float32 rounding once the reference casts it back. float16 and bfloat16 would round visibly: refused."""
NEG_INF = -math.inf


# ------------------------------------------------------------------------------------------------ Attention


@dataclass(frozen=True)
class AttentionDims:
    """The sizes of one Attention node: `packed` inputs are 3-D (batch, sequence, heads * head size), others 4-D
    (batch, heads, sequence, head size). The caches (past and present) are always 4-D."""

    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    past_len: int
    head_size: int
    v_head_size: int
    packed: bool

    @property
    def total(self) -> int:
        """Keys attended to: the past ones, then the new ones."""
        return self.past_len + self.kv_len

    @property
    def group(self) -> int:
        """Query heads per key/value head (grouped-query attention repeats each kv head this many times)."""
        return self.q_heads // self.kv_heads


def _role_map(names: list[str], roles: tuple[str, ...], prefix: str) -> dict[str, str]:
    """The kernel buffer of each present input or output role: in0, in1, ... in the order they are present."""
    present = [role for role, name in zip(roles, names) if name]
    return {role: f"{prefix}{i}" for i, role in enumerate(present)}


def _attention_dims(ctx: NodeContext) -> AttentionDims:
    """The sizes, refusing shapes the reference would reject or broadcast in ways this kernel doesn't."""
    q, k, v = (ctx.input_info(i).shape for i in range(3))
    if not len(q) == len(k) == len(v) or len(q) not in (3, 4):
        raise ctx.unsupported(f"Q, K and V must all be 3-D or all 4-D, got {list(q)}, {list(k)}, {list(v)}")
    q_heads, kv_heads = _heads(ctx, q, k, v)
    packed = len(q) == 3
    if packed:
        dims = AttentionDims(q[0], q_heads, kv_heads, q[1], k[1], 0, q[2] // q_heads, v[2] // kv_heads, True)
        key_size = k[2] // kv_heads
    else:
        dims = AttentionDims(q[0], q_heads, kv_heads, q[2], k[2], 0, q[3], v[3], False)
        key_size = k[3]
    v_len = v[1] if packed else v[2]
    if k[0] != dims.batch or v[0] != dims.batch or key_size != dims.head_size or v_len != dims.kv_len:
        raise ctx.unsupported(f"Q {list(q)}, K {list(k)} and V {list(v)} disagree on batch, key length or head size")
    dims = _with_past(ctx, dims)
    if min(dims.batch, dims.q_heads, dims.q_len, dims.total, dims.head_size, dims.v_head_size) == 0:
        raise ctx.unsupported("empty Attention inputs are not supported")
    return dims


def _heads(ctx: NodeContext, q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...]) -> tuple[int, int]:
    """(query heads, key/value heads): from the attributes for 3-D inputs (which must split evenly), from the shapes
    for 4-D ones; the kv heads must divide the query heads."""
    attrs = ctx.node.attrs
    q_given, kv_given = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
    given = [q_given, kv_given]
    if len(q) == 3:
        if q_given is None or kv_given is None or min(int(q_given), int(kv_given)) <= 0:
            raise ctx.unsupported("3-D inputs need positive q_num_heads and kv_num_heads")
        q_heads, kv_heads = int(q_given), int(kv_given)
        if q[2] % q_heads or k[2] % kv_heads or v[2] % kv_heads:
            raise ctx.unsupported(f"hidden sizes {q[2]}, {k[2]}, {v[2]} don't split into {q_heads} / {kv_heads} heads")
    else:
        q_heads, kv_heads = q[1], k[1]
        if v[1] != kv_heads:
            raise ctx.unsupported(f"K has {kv_heads} heads but V {v[1]}")
        if given != [None, None] and (ctx.opset >= 25 or given != [q_heads, kv_heads]):
            raise ctx.unsupported(
                "q_num_heads/kv_num_heads on 4-D inputs (opset 25 forbids them; earlier opsets "
                "only when they match the shapes)"
            )
    if kv_heads == 0 or q_heads % kv_heads:
        raise ctx.unsupported(f"{kv_heads} key/value heads don't divide {q_heads} query heads")
    return q_heads, kv_heads


def _with_past(ctx: NodeContext, dims: AttentionDims) -> AttentionDims:
    """`dims` with the past length: past_key (B, kv heads, P, head size) and past_value (..., v head size) come
    together, and not with nonpad_kv_seqlen (the reference rejects both)."""
    present = [i < len(ctx.node.inputs) and bool(ctx.node.inputs[i]) for i in (4, 5, 6)]
    if present[0] != present[1]:
        raise ctx.unsupported("past_key and past_value must be given together")
    if not present[0]:
        return dims
    if present[2]:
        raise ctx.unsupported("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    past_key, past_value = ctx.input_info(4).shape, ctx.input_info(5).shape
    past_len = past_key[2] if len(past_key) == 4 else -1
    expected_key = (dims.batch, dims.kv_heads, past_len, dims.head_size)
    if past_key != expected_key or past_value != (*expected_key[:3], dims.v_head_size):
        raise ctx.unsupported(
            f"past_key {list(past_key)} / past_value {list(past_value)} don't match K and V "
            f"(expected [{dims.batch}, {dims.kv_heads}, P, {dims.head_size} / {dims.v_head_size}])"
        )
    return dataclasses.replace(dims, past_len=past_len)


def _mask_attrs(ctx: NodeContext, dims: AttentionDims) -> dict[str, Any]:
    """The mask's kind ("float": added, "bool": True keeps) and its shape as 4-D (leading ones added): the first
    three axes broadcast to (batch, query heads, query length); the last may be shorter than the keys, the rest
    counting as masked (the reference pads it with -inf or False)."""
    info = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    if info is None:
        return {"mask": "", "mask_shape": []}
    if info.dtype not in ("float32", "bool") or not 1 <= len(info.shape) <= 4:
        raise ctx.unsupported(
            f"attn_mask must be a 1-D to 4-D float32 or bool tensor, got {info.dtype} {list(info.shape)}"
        )
    shape = (1,) * (4 - len(info.shape)) + tuple(info.shape)
    targets = (dims.batch, dims.q_heads, dims.q_len)
    if any(d not in (1, t) for d, t in zip(shape, targets)) or not 0 < shape[3] <= dims.total:
        raise ctx.unsupported(
            f"attn_mask {list(info.shape)} doesn't broadcast to [{dims.batch}, {dims.q_heads}, "
            f"{dims.q_len}, {dims.total}]"
        )
    return {"mask": "float" if info.dtype == "float32" else "bool", "mask_shape": list(shape)}


def _root_scale(ctx: NodeContext, head_size: int) -> float:
    """sqrt(scale) in float32, which the reference multiplies Q and K by (scale defaults to 1/sqrt(head size))."""
    scale = ctx.node.attrs.get("scale")
    scale = 1 / np.sqrt(head_size) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ctx.unsupported(f"scale {scale} must be positive and finite")
    return float(np.float32(np.sqrt(scale)))


def _window(ctx: NodeContext) -> list[int]:
    """[left, right] window sizes (opset 25; -1: unbounded on that side)."""
    if ctx.opset < 25:
        return [-1, -1]
    window = [int(ctx.node.attrs.get(f"{side}_window_size", -1)) for side in ("left", "right")]
    if min(window) < -1:
        raise ctx.unsupported(f"window sizes {window} must be -1 or nonnegative")
    return window


def _check_dtypes(ctx: NodeContext) -> None:
    """Q, K, V and the caches float32, nonpad_kv_seqlen int64 (the mask is checked with its shape)."""
    for index in (0, 1, 2, 4, 5):
        info = ctx.inputs[index] if index < len(ctx.inputs) else None
        if info is not None and info.dtype != "float32":
            raise ctx.unsupported(f"input {index} is {info.dtype}; only float32 is supported")
    nonpad = ctx.inputs[6] if len(ctx.inputs) > 6 else None
    if nonpad is not None and (nonpad.dtype != "int64" or len(nonpad.shape) != 1):
        raise ctx.unsupported(f"nonpad_kv_seqlen must be 1-D int64, got {nonpad.dtype} {list(nonpad.shape)}")


def _check_outputs(ctx: NodeContext, dims: AttentionDims, roles: list[str]) -> None:
    """Each present output must have the shape the kernel writes (Y in Q's layout, the caches 4-D with every key,
    qk_matmul_output one score per query and key): the kernel indexes them by these sizes."""
    d = dims
    y = (d.batch, d.q_len, d.q_heads * d.v_head_size) if d.packed else (d.batch, d.q_heads, d.q_len, d.v_head_size)
    expected = {
        "y": y,
        "present_key": (d.batch, d.kv_heads, d.total, d.head_size),
        "present_value": (d.batch, d.kv_heads, d.total, d.v_head_size),
        "qk": (d.batch, d.q_heads, d.q_len, d.total),
    }
    for role, info in zip(roles, ctx.outputs):
        if info.shape != expected[role] or info.dtype != "float32":
            raise ctx.unsupported(
                f"output {role} is {info.dtype} {list(info.shape)}, expected float32 {list(expected[role])}"
            )


def _attention_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Sizes, scale, masking and which inputs and outputs are present, all the kernel needs."""
    _check_dtypes(ctx)
    dims = _attention_dims(ctx)
    attrs = ctx.node.attrs
    precision = attrs.get("softmax_precision")
    if precision is not None and int(precision) not in SOFTMAX_PRECISIONS:
        raise ctx.unsupported(f"softmax_precision {precision} is not supported (float and double are)")
    mode = int(attrs.get("qk_matmul_output_mode", 0))
    if mode not in QK_STAGES:
        raise ctx.unsupported(f"qk_matmul_output_mode {mode} is not one of 0-3")
    nonpad = ctx.inputs[6] if len(ctx.inputs) > 6 else None
    if nonpad is not None and nonpad.shape[0] != dims.batch:
        raise ctx.unsupported(f"nonpad_kv_seqlen has {nonpad.shape[0]} entries for a batch of {dims.batch}")
    outputs = _role_map(ctx.node.outputs, ATTENTION_OUTPUTS, "out")
    _check_outputs(ctx, dims, list(outputs))
    softcap = float(attrs.get("softcap", 0.0))
    return {
        **dataclasses.asdict(dims),
        **_mask_attrs(ctx, dims),
        "root_scale": _root_scale(ctx, dims.head_size),
        "causal": bool(int(attrs.get("is_causal", 0))),
        "softcap": softcap if softcap > 0 else 0.0,
        "window": _window(ctx),
        "qk_stage": QK_STAGES[mode] if "qk" in outputs else "",
        "inputs": _role_map(ctx.node.inputs, ATTENTION_INPUTS, "in"),
        "outputs": outputs,
    }


@dataclass(frozen=True)
class ScratchLayout:
    """Where each phase's intermediate lives in scratch (float offsets): Q * sqrt(scale) as (B, Hq, Sq, D), K^T *
    sqrt(scale) as (B, Hkv, D, T), the scores and then probabilities as (B, Hq, Sq, T), and the concatenated values
    (B, Hkv, T, Dv) when there is a past but no present_value output to hold them."""

    queries: int
    keys: int
    scores: int
    values: int
    size: int


def _scratch_layout(attrs: dict[str, Any]) -> ScratchLayout:
    d = _dims(attrs)
    keys = d.batch * d.q_heads * d.q_len * d.head_size
    scores = keys + d.batch * d.kv_heads * d.head_size * d.total
    values = scores + d.batch * d.q_heads * d.q_len * d.total
    own_values = d.past_len > 0 and "present_value" not in attrs["outputs"]
    size = values + (d.batch * d.kv_heads * d.total * d.v_head_size if own_values else 0)
    return ScratchLayout(0, keys, scores, values, size)


def _dims(attrs: dict[str, Any]) -> AttentionDims:
    return AttentionDims(**{name: attrs[name] for name in AttentionDims.__dataclass_fields__})


def _attention_scratch(spec: KernelSpec) -> int:
    return _scratch_layout(spec.attrs).size


@dataclass(frozen=True)
class Destination:
    """A buffer that a cache copy writes: value * factor at index(b, kv head, key position, feature)."""

    buf: str
    index: Callable[[L.Expr, L.Expr, L.Expr, L.Expr], L.Expr]
    factor: float = 1.0


def _new_index(d: AttentionDims, size: int) -> Callable[[L.Expr, L.Expr, L.Expr, L.Expr], L.Expr]:
    """Index of (b, kv head, new key t, feature) in K or V (size features per head), packed or not."""
    if d.packed:
        return lambda b, g, t, f: ((b * d.kv_len + t) * d.kv_heads + g) * size + f
    return lambda b, g, t, f: ((b * d.kv_heads + g) * d.kv_len + t) * size + f


def _cache_index(d: AttentionDims, length: int, size: int, base: int = 0) -> Callable[..., L.Expr]:
    """Index of (b, kv head, t, feature) in a 4-D cache of `length` positions (past or present)."""
    return lambda b, g, t, f: base + ((b * d.kv_heads + g) * length + t) * size + f


def _append(
    names: L.Names, d: AttentionDims, size: int, past: str | None, new: str, destinations: list[Destination]
) -> list[L.Stmt]:
    """Copy the past positions then the new ones of one cache (keys or values) into every destination, at key
    positions [0, P) and [P, T)."""
    if not destinations:
        return []
    sources = [(new, d.kv_len, d.past_len, _new_index(d, size))]
    if past is not None:
        sources.insert(0, (past, d.past_len, 0, _cache_index(d, d.past_len, size)))
    stmts: list[L.Stmt] = []
    for buf, length, start, index in sources:

        def copy(v: list[L.Var], buf=buf, start=start, index=index) -> list[L.Stmt]:
            value = L.Load(buf, index(*v))
            return [
                L.Store(
                    dest.buf,
                    dest.index(v[0], v[1], v[2] + start, v[3]),
                    value * dest.factor if dest.factor != 1.0 else value,
                )
                for dest in destinations
            ]

        stmts += L.loop_nest(names, (d.batch, d.kv_heads, length, size), copy, parallel=True)[0]
    return stmts


ValueSource = tuple[str, Callable[[L.Expr, L.Expr], tuple[L.Expr, int]]]
"""Where phase 4's Gemm reads the values: a buffer and, for (batch, kv head), the block's offset and row stride."""


def _copies(
    names: L.Names, a: dict[str, Any], d: AttentionDims, scratch: ScratchLayout
) -> tuple[list[L.Stmt], ValueSource]:
    """Phase 1: scaled Q and K^T into scratch, the caches into present_key/present_value (or scratch). Also returns
    where the Gemm of phase 4 reads the values: buffer and (offset, ldb) of a (b, kv head)."""
    ins, outs, root = a["inputs"], a["outputs"], a["root_scale"]
    q_shape = (d.batch, d.q_heads, d.q_len, d.head_size)
    if d.packed:
        q_at = lambda v: ((v[0] * d.q_len + v[2]) * d.q_heads + v[1]) * d.head_size + v[3]  # noqa: E731
    else:
        q_at = lambda v: L.flat_index(q_shape, v)  # noqa: E731
    stmts = L.loop_nest(
        names,
        q_shape,
        lambda v: [L.Store("scratch", scratch.queries + L.flat_index(q_shape, v), L.Load(ins["q"], q_at(v)) * root)],
        parallel=True,
    )[0]
    transposed = lambda b, g, t, f: scratch.keys + ((b * d.kv_heads + g) * d.head_size + f) * d.total + t  # noqa: E731
    keys = [Destination("scratch", transposed, root)]
    if "present_key" in outs:
        keys.append(Destination(outs["present_key"], _cache_index(d, d.total, d.head_size)))
    stmts += _append(names, d, d.head_size, ins.get("past_key"), ins["k"], keys)
    values, source = _value_destinations(a, d, scratch)
    stmts += _append(names, d, d.v_head_size, ins.get("past_value"), ins["v"], values)
    return stmts, source


def _value_destinations(
    a: dict[str, Any], d: AttentionDims, scratch: ScratchLayout
) -> tuple[list[Destination], ValueSource]:
    """Where the values are copied (present_value if requested, else scratch when a past must be prepended,
    else nowhere) and where the final Gemm reads them: (buffer, (b, g) -> (offset, ldb))."""
    outs = a["outputs"]
    cache = lambda b, g: (((b * d.kv_heads + g) * d.total) * d.v_head_size, d.v_head_size)  # noqa: E731
    if "present_value" in outs:
        return [Destination(outs["present_value"], _cache_index(d, d.total, d.v_head_size))], (
            outs["present_value"],
            cache,
        )
    if d.past_len:
        at = lambda b, g: (scratch.values + cache(b, g)[0], d.v_head_size)  # noqa: E731
        return [Destination("scratch", _cache_index(d, d.total, d.v_head_size, scratch.values))], ("scratch", at)
    if d.packed:
        return [], (
            a["inputs"]["v"],
            lambda b, g: ((b * d.kv_len * d.kv_heads + g) * d.v_head_size, d.kv_heads * d.v_head_size),
        )
    return [], (a["inputs"]["v"], cache)


def _per_head_gemms(names: L.Names, d: AttentionDims, gemm: Callable[[L.Expr, L.Expr, L.Expr], L.Gemm]) -> L.Loop:
    """One parallel loop over (batch, query head), a Gemm each: gemm(b, h, kv head)."""
    bh = names.var("bh")
    h = bh % d.q_heads
    return L.Loop(bh, d.batch * d.q_heads, [gemm(bh // d.q_heads, h, h // d.group)], parallel=True)


def _scores_gemm(d: AttentionDims, scratch: ScratchLayout) -> Callable[[L.Expr, L.Expr, L.Expr], L.Gemm]:
    """Phase 2: scores[b, h] (Sq x T) = Q[b, h] (Sq x D) @ K^T[b, g] (D x T), all in scratch."""

    def gemm(b: L.Expr, h: L.Expr, g: L.Expr) -> L.Gemm:
        bh = b * d.q_heads + h
        return L.Gemm(
            "scratch",
            scratch.queries + bh * (d.q_len * d.head_size),
            d.head_size,
            "scratch",
            scratch.keys + (b * d.kv_heads + g) * (d.head_size * d.total),
            d.total,
            "scratch",
            scratch.scores + bh * (d.q_len * d.total),
            d.total,
            d.q_len,
            d.total,
            d.head_size,
        )

    return gemm


def _output_gemm(
    d: AttentionDims, scratch: ScratchLayout, y: str, source: ValueSource
) -> Callable[[L.Expr, L.Expr, L.Expr], L.Gemm]:
    """Phase 4: Y[b, h] (Sq x Dv) = probabilities[b, h] (Sq x T) @ V[b, g] (T x Dv), stored in Y's layout."""
    values, value_at = source

    def gemm(b: L.Expr, h: L.Expr, g: L.Expr) -> L.Gemm:
        if d.packed:
            y_offset, ldc = (b * (d.q_len * d.q_heads) + h) * d.v_head_size, d.q_heads * d.v_head_size
        else:
            y_offset, ldc = (b * d.q_heads + h) * (d.q_len * d.v_head_size), d.v_head_size
        v_offset, ldb = value_at(b, g)
        return L.Gemm(
            "scratch",
            scratch.scores + (b * d.q_heads + h) * (d.q_len * d.total),
            d.total,
            values,
            v_offset,
            ldb,
            y,
            y_offset,
            ldc,
            d.q_len,
            d.v_head_size,
            d.total,
        )

    return gemm


@dataclass(frozen=True)
class Row:
    """One query row of the scores: batch b, query head h, query position i, scores from `base` in scratch, and
    qk_matmul_output's row from `qk_base`."""

    b: L.Expr
    h: L.Expr
    i: L.Expr
    base: L.Expr
    qk_base: L.Expr


def _bias(s: M.Scope, a: dict[str, Any], d: AttentionDims, row: Row, j: L.Expr) -> L.Expr | None:
    """The additive bias of key j for `row`, as the reference builds it: the float mask's value (-inf past its
    length) plus 0 where every constraint (causal, window, padding, bool mask) allows the key, -inf where one
    doesn't. None when nothing masks at all."""
    allowed = _allowed(a, d, row, j)
    mask_value = None
    if a["mask"] == "float":
        mask_value = _mask_load(a, d, row, j, L.F32)
        if a["mask_shape"][3] < d.total:
            mask_value = L.select(L.compare("lt", j, a["mask_shape"][3]), mask_value, NEG_INF)
    structural = None if not allowed else L.select(L.logical_and(*allowed), 0.0, NEG_INF)
    if mask_value is None or structural is None:
        return mask_value if structural is None else s.bind(structural, "bias")
    return s.bind(mask_value + structural, "bias")


def _mask_load(a: dict[str, Any], d: AttentionDims, row: Row, j: L.Expr, dtype: str) -> L.Expr:
    """attn_mask at (b, h, i, j), broadcast on its first three axes, j clamped into its length."""
    shape = a["mask_shape"]
    column = L.minimum(j, shape[3] - 1) if shape[3] < d.total else j
    indices = [L.const(0) if extent == 1 else var for extent, var in zip(shape[:3], (row.b, row.h, row.i))]
    return L.Load(a["inputs"]["mask"], L.flat_index(tuple(shape), [*indices, column]), dtype)


def _allowed(a: dict[str, Any], d: AttentionDims, row: Row, j: L.Expr) -> list[L.Expr]:
    """The conditions key j must meet for `row` (an empty list: every key is allowed)."""
    conds: list[L.Expr] = []
    nonpad = L.Load(a["inputs"]["nonpad"], row.b, L.I64) if "nonpad" in a["inputs"] else None
    # The query's position among the keys: after the past (internal cache) or nonpad - Sq (external cache).
    position = row.i + (nonpad - d.q_len if nonpad is not None else d.past_len)
    if a["causal"]:
        conds.append(L.compare("le", j, position))
    left, right = a["window"]
    if left >= 0:
        conds.append(L.compare("le", position - j, left))
    if right >= 0:
        conds.append(L.compare("le", j - position, right))
    if nonpad is not None:
        conds.append(L.compare("lt", j, nonpad))
    if a["mask"] == "bool":
        conds.append(_mask_load(a, d, row, j, L.BOOL))
        if a["mask_shape"][3] < d.total:
            conds.append(L.compare("lt", j, a["mask_shape"][3]))
    return conds


def _softmax_row(names: L.Names, a: dict[str, Any], d: AttentionDims, row: Row) -> list[L.Stmt]:
    """Phase 3 for one row: softcap and bias the scores (keeping the row's largest value and largest bias),
    softmax them as the reference does (a row that is -inf everywhere gives zeros, not NaN), and zero the row
    when its bias is -inf everywhere. qk_matmul_output gets the stage its mode asks for."""
    j, top, bias_top, total = names.var("j"), names.local("top"), names.local("btop"), names.local("sum")
    s = M.Scope(names)
    score = s.bind(L.Load("scratch", row.base + j), "score")  # a local: the row's slot is overwritten with x
    if a["softcap"]:
        score = s.bind(M.tanh(s, score / a["softcap"]) * a["softcap"], "capped")
    bias = _bias(s, a, d, row, j)
    x = score if bias is None else s.bind(score + bias, "x")
    qk = a["outputs"].get("qk")
    first = [*s.stmts, L.Store("scratch", row.base + j, x), L.Assign(top, L.maximum(top, x))]
    if bias is not None:
        first.append(L.Assign(bias_top, L.maximum(bias_top, bias)))
    if a["qk_stage"] in ("scores", "biased"):
        first.append(L.Store(qk, row.qk_base + j, score if a["qk_stage"] == "scores" else x))
    exponential = L.call("exp", L.Load("scratch", row.base + j) - top)
    probability: L.Expr = L.Load("scratch", row.base + j) / total
    if bias is not None:
        probability = L.select(L.compare("eq", bias_top, NEG_INF), 0.0, probability)
    last: list[L.Stmt] = [L.Store("scratch", row.base + j, probability)]
    if a["qk_stage"] == "probabilities":
        last.append(L.Store(qk, row.qk_base + j, L.Load("scratch", row.base + j)))
    return [
        L.Assign(top, L.const(NEG_INF)),
        L.Assign(bias_top, L.const(NEG_INF)),
        L.Loop(j, d.total, first),
        L.Assign(top, L.select(L.compare("eq", top, NEG_INF), 0.0, top)),
        L.Assign(total, L.const(0.0)),
        L.Loop(
            j,
            d.total,
            [L.Store("scratch", row.base + j, exponential), L.Assign(total, total + L.Load("scratch", row.base + j))],
        ),
        L.Assign(total, L.select(L.compare("eq", total, 0.0), 1.0, total)),
        L.Loop(j, d.total, last),
    ]


def _softmax_rows(names: L.Names, a: dict[str, Any], d: AttentionDims, scratch: ScratchLayout) -> L.Loop:
    """Phase 3: one work-item per (batch, query head, query position)."""
    r = names.var("r")
    row = Row(
        r // (d.q_heads * d.q_len), r // d.q_len % d.q_heads, r % d.q_len, scratch.scores + r * d.total, r * d.total
    )
    return L.Loop(r, d.batch * d.q_heads * d.q_len, _softmax_row(names, a, d, row), parallel=True)


@register("Attention", normalize=_attention_attrs, scratch_floats=_attention_scratch)
def _lower_attention(spec: KernelSpec) -> list[L.Stmt]:
    """softmax(softcap(Q K^T * scale) + bias) @ V per (batch, head), in the four phases of the module docstring."""
    names, a = L.Names(), spec.attrs
    d, scratch = _dims(a), _scratch_layout(a)
    copies, values = _copies(names, a, d, scratch)
    return [
        *copies,
        _per_head_gemms(names, d, _scores_gemm(d, scratch)),
        _softmax_rows(names, a, d, scratch),
        _per_head_gemms(names, d, _output_gemm(d, scratch, "out0", values)),
    ]


# ------------------------------------------------------------------------------------------ RotaryEmbedding


def _rotary_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Heads, rotated features, interleaving and how the caches are read: by position_ids (caches of shape
    (positions, rotary_dim / 2)) or directly (caches (batch or 1, sequence or 1, rotary_dim / 2))."""
    x, cos, sin = (ctx.input_info(i) for i in range(3))
    positions = ctx.inputs[3] if len(ctx.inputs) > 3 else None
    if any(info.dtype != "float32" for info in (x, cos, sin)):
        raise ctx.unsupported("RotaryEmbedding supports float32 input and caches only")
    batch, seq, heads, head_size = _rotary_shape(ctx, x.shape)
    rotary = int(ctx.node.attrs.get("rotary_embedding_dim", 0)) or head_size
    if rotary % 2 or not 0 < rotary <= head_size:
        raise ctx.unsupported(f"rotary_embedding_dim {rotary} must be even and at most the head size {head_size}")
    _check_caches(ctx, cos.shape, sin.shape, positions is not None, (batch, seq, rotary // 2))
    if positions is not None and (
        positions.dtype != "int64"
        or len(positions.shape) != 2
        or any(dim not in (1, want) for dim, want in zip(positions.shape, (batch, seq)))
    ):
        raise ctx.unsupported(
            f"position_ids must be int64 broadcasting to [{batch}, {seq}], got "
            f"{positions.dtype} {list(positions.shape)}"
        )
    return {
        "heads": heads,
        "head_size": head_size,
        "rotary": rotary,
        "interleaved": bool(int(ctx.node.attrs.get("interleaved", 0))),
        "packed": len(x.shape) == 3,
    }


def _check_caches(
    ctx: NodeContext, cos: tuple[int, ...], sin: tuple[int, ...], by_position: bool, sizes: tuple[int, int, int]
) -> None:
    """The caches must be alike and (positions, rotary_dim / 2) when read by position_ids, else (batch or 1,
    sequence or 1, rotary_dim / 2): a 2-D cache without position_ids broadcasts in the reference along axes that
    make no rotation (it gets its ones appended), and a 3-D one with them gathers a 4-D cache."""
    batch, seq, half = sizes
    if by_position:
        fits = len(cos) == 2 and cos[1] == half
    else:
        fits = len(cos) == 3 and cos[0] in (1, batch) and cos[1] in (1, seq) and cos[2] == half
    if cos != sin or not fits:
        raise ctx.unsupported(
            f"cos/sin caches {list(cos)} / {list(sin)} must be alike and "
            f"{'[positions' if by_position else f'[{batch} or 1, {seq} or 1'}, {half}]"
        )


def _rotary_shape(ctx: NodeContext, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(batch, sequence, heads, head size) of a 4-D (B, H, S, D) or 3-D (B, S, H * D) input."""
    if len(shape) == 4:
        return shape[0], shape[2], shape[1], shape[3]
    heads = int(ctx.node.attrs.get("num_heads", 0))
    if len(shape) != 3 or heads <= 0 or shape[2] % heads:
        raise ctx.unsupported(f"input {list(shape)} must be 4-D, or 3-D with num_heads dividing its last axis")
    return shape[0], shape[1], heads, shape[2] // heads


def _cache_row(spec: KernelSpec, b: L.Expr, s: L.Expr, batch: int, seq: int) -> L.Expr:
    """The row of the cos/sin caches for (b, s): position_ids[b, s] wrapped and clamped into the caches (an
    out-of-range id reads a valid row, never memory past them), or (b, s) broadcast into (B, S) caches."""
    cache = shape_of(spec, 1)
    if len(spec.inputs) > 3:
        ids = shape_of(spec, 3)
        position = L.Load("in3", L.broadcast_index(ids, (batch, seq), [b, s]), L.I64)
        wrapped = L.select(L.compare("lt", position, 0), position + cache[0], position)
        return L.minimum(L.maximum(wrapped, 0), cache[0] - 1)
    return L.broadcast_index(cache[:2], (batch, seq), [b, s])


@register("RotaryEmbedding", normalize=_rotary_attrs)
def _lower_rotary(spec: KernelSpec) -> list[L.Stmt]:
    """Each pair (x1, x2) of the first rotary_dim features rotated by its position's angle, as the reference does:
    (cos x1 - sin x2, sin x1 + cos x2); pairs are (k, k + rotary_dim / 2), or (2k, 2k + 1) interleaved. The other
    features are copied. One work-item per (batch, sequence, head) row."""
    a, names, shape = spec.attrs, L.Names(), shape_of(spec)
    heads, size, half = a["heads"], a["head_size"], a["rotary"] // 2
    batch, seq = shape[0], shape[1] if a["packed"] else shape[2]
    pair = (lambda k: (2 * k, 2 * k + 1)) if a["interleaved"] else (lambda k: (k, k + half))

    def row(v: list[L.Var]) -> list[L.Stmt]:
        b, s, h = v
        base = ((b * seq + s) * heads + h) * size if a["packed"] else ((b * heads + h) * seq + s) * size
        cache = _cache_row(spec, b, s, batch, seq) * half
        k, f = names.var("k"), names.var("f")
        first, second = pair(k)
        x1, x2 = L.Load("in0", base + first), L.Load("in0", base + second)
        cos, sin = L.Load("in1", cache + k), L.Load("in2", cache + k)
        rotate: list[L.Stmt] = [
            L.Store("out0", base + first, cos * x1 - sin * x2),
            L.Store("out0", base + second, sin * x1 + cos * x2),
        ]
        copy: list[L.Stmt] = [L.Store("out0", base + f + 2 * half, L.Load("in0", base + f + 2 * half))]
        return [L.Loop(k, half, rotate), *([L.Loop(f, size - 2 * half, copy)] if size > 2 * half else [])]

    return L.loop_nest(names, (batch, seq, heads), row, parallel=True)[0]
