"""The normalisations: LRN, BatchNormalization (inference form), LayerNormalization, InstanceNormalization,
GroupNormalization, MeanVarianceNormalization, LpNormalization and RMSNormalization (opset 23: LayerNormalization
without the mean, lowered the same way, one work-item per normalised row)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.reduce import ReduceLayout, absolute, axis_view, over_rows
from farm.ops.registry import NodeContext, activate, axis_in_range, prod, register, shape_of
from farm.ops.softmax import along


def _lrn_attrs(ctx: NodeContext) -> dict[str, Any]:
    """LRN's attributes; `size` (the channel window) must be at least 1, it divides alpha."""
    a = ctx.node.attrs
    if int(a.get("size", 0)) < 1:
        raise ctx.unsupported(f"attribute 'size' is {a.get('size')}; it must be at least 1")
    return {
        "size": int(a["size"]),
        "alpha": float(a.get("alpha", 1e-4)),
        "beta": float(a.get("beta", 0.75)),
        "bias": float(a.get("bias", 1.0)),
    }


def _lrn_window(size: int, channels: int) -> tuple[int, int]:
    """The channels before the centre and the loop's extent of LRN's window, the window clipped to the channels.

    ONNX sums channels max(0, c - floor((size-1)/2)) .. min(C-1, c + ceil((size-1)/2)); neither side reaches past
    C-1 channels, so clipping both to that gives the same sum for every c, and a hostile size (2**62) costs a loop
    of at most 2C-1 steps instead of a kernel that never ends. The divisor stays the model's `size`."""
    before = (size - 1) // 2
    after = size - 1 - before
    clipped_before, clipped_after = min(before, channels - 1), min(after, channels - 1)
    return clipped_before, clipped_before + clipped_after + 1


@register("LRN", normalize=_lrn_attrs)
def _lower_lrn(spec: KernelSpec) -> list[L.Stmt]:
    """y = x / (bias + alpha/size * sum of x^2 over the channel window)^beta."""
    names, a = L.Names(), spec.attrs
    n, c, h, w = shape_of(spec)
    hw = h * w
    b, ch, i, j, acc = names.var("b"), names.var("c"), names.var("i"), names.var("j"), names.local()
    before, window = _lrn_window(a["size"], c)
    other = ch - before + j
    inside = L.logical_and(L.compare("ge", other, 0), L.compare("lt", other, c))
    x_other = L.Load("in0", (b * c + L.minimum(L.maximum(other, 0), c - 1)) * hw + i)
    center = (b * c + ch) * hw + i
    base = a["bias"] + acc * (a["alpha"] / a["size"])
    value = L.Load("in0", center) * L.call("exp", L.call("log", base) * (-a["beta"]))
    return [
        L.Loop(
            b,
            n,
            [
                L.Loop(
                    ch,
                    c,
                    [
                        L.Loop(
                            i,
                            hw,
                            [
                                L.Assign(acc, L.const(0.0)),
                                L.Loop(j, window, [L.Assign(acc, acc + L.select(inside, x_other * x_other, 0.0))]),
                                L.Store("out0", center, activate(value, spec.activation)),
                            ],
                            True,
                        )
                    ],
                    True,
                )
            ],
            True,
        )
    ]


def _bn_attrs(ctx: NodeContext) -> dict[str, Any]:
    if len([o for o in ctx.node.outputs if o]) > 1:
        raise ctx.unsupported("BatchNormalization in training mode (extra outputs) is not supported")
    return {"epsilon": float(ctx.node.attrs.get("epsilon", 1e-5))}


@register("BatchNormalization", normalize=_bn_attrs)
def _lower_batchnorm(spec: KernelSpec) -> list[L.Stmt]:
    """y = (x - mean[c]) * scale[c] / sqrt(var[c] + eps) + bias[c] (inference form)."""
    names, shape = L.Names(), shape_of(spec)
    n, c, inner = shape[0], shape[1], prod(shape[2:])
    b, ch, i = names.var("b"), names.var("c"), names.var("i")
    index = (b * c + ch) * inner + i
    scale = L.Load("in1", ch) / L.call("sqrt", L.Load("in4", ch) + spec.attrs["epsilon"])
    value = (L.Load("in0", index) - L.Load("in3", ch)) * scale + L.Load("in2", ch)
    store = L.Store("out0", index, activate(value, spec.activation))
    return [L.Loop(b, n, [L.Loop(ch, c, [L.Loop(i, inner, [store], True)], True)], True)]


# Loops over the elements one statistic covers: over(body) calls body(input index) inside fresh loops.
Over = Callable[[Callable[[L.Expr], list[L.Stmt]]], list[L.Stmt]]


def _contiguous(names: L.Names, base: L.Expr, length: int) -> Over:
    """The `length` consecutive elements from `base`."""

    def over(body: Callable[[L.Expr], list[L.Stmt]]) -> list[L.Stmt]:
        i = names.var("i")
        return [L.Loop(i, length, body(base + i))]

    return over


def _moments(names: L.Names, over: Over, count: int) -> tuple[list[L.Stmt], L.Var, L.Var]:
    """Statements that set the mean and the variance of in0 over `over`'s elements, in two passes (squared
    deviations: accurate where E[x^2] - E[x]^2 would cancel)."""
    mean, variance = names.local("mean"), names.local("var")
    x = lambda index: L.Load("in0", index)  # noqa: E731
    stmts = [
        L.Assign(mean, L.const(0.0)),
        *over(lambda i: [L.Assign(mean, mean + x(i))]),
        L.Assign(mean, mean * (1.0 / count)),
        L.Assign(variance, L.const(0.0)),
        *over(lambda i: [L.Assign(variance, variance + (x(i) - mean) * (x(i) - mean))]),
        L.Assign(variance, variance * (1.0 / count)),
    ]
    return stmts, mean, variance


def _standardize(names: L.Names, over: Over, count: int, epsilon: float) -> tuple[list[L.Stmt], L.Var, L.Var]:
    """Statements that set the mean and 1 / sqrt(variance + epsilon)."""
    stmts, mean, variance = _moments(names, over, count)
    return stmts + [L.Assign(variance, 1.0 / L.call("sqrt", variance + epsilon))], mean, variance


# LayerNormalization's optional outputs after Y, in order.
LAYERNORM_STATISTICS = ("mean", "inv_std")


def _layernorm_attrs(ctx: NodeContext) -> dict[str, Any]:
    """axis, epsilon, and which of the optional Mean and InvStdDev outputs the node has (they are the kernel's
    outputs after Y, in that order)."""
    a = ctx.node.attrs
    if int(a.get("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {a['stash_type']} is not supported (1, float32, is)")
    shape = ctx.input_info(0).shape
    axis = axis_in_range(ctx, a.get("axis", -1), len(shape))
    for info in ctx.inputs[1:]:
        if info is not None and len(_trailing(info.shape, len(shape) - axis)) > len(shape) - axis:
            raise ctx.unsupported(f"scale/bias of shape {list(info.shape)} don't broadcast to {list(shape[axis:])}")
    outputs = ctx.node.outputs
    statistics = [name for i, name in enumerate(LAYERNORM_STATISTICS, 1) if i < len(outputs) and outputs[i]]
    return {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5)), "statistics": statistics}


def _trailing(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """`shape` without leading ones beyond `rank` axes (a scale of shape (1, 1, C) for normalised shape (C,))."""
    extra = max(len(shape) - rank, 0)
    return shape[extra:] if all(d == 1 for d in shape[:extra]) else shape


@register("LayerNormalization", normalize=_layernorm_attrs)
def _lower_layernorm(spec: KernelSpec) -> list[L.Stmt]:
    """y = (x - mean) / sqrt(var + eps) * scale + bias over the axes from `axis` on; scale and bias broadcast to
    that normalised shape. One work-item per normalised row, which also writes the row's requested statistics."""
    names, a, shape = L.Names(), spec.attrs, shape_of(spec)
    normalized = shape[a["axis"] :]
    length = prod(normalized)
    params = [(f"in{i}", _trailing(shape_of(spec, i), len(normalized))) for i in range(1, len(spec.inputs))]

    def row(o: L.Expr, _inner: L.Expr) -> list[L.Stmt]:
        base = o * length
        stats, mean, scale = _standardize(names, _contiguous(names, base, length), length, a["epsilon"])

        def store(v: list[L.Var]) -> list[L.Stmt]:
            value = (L.Load("in0", base + L.flat_index(normalized, v)) - mean) * scale
            value = value * L.Load(*_broadcast(params[0], normalized, v))
            if len(params) > 1:
                value = value + L.Load(*_broadcast(params[1], normalized, v))
            return [L.Store("out0", base + L.flat_index(normalized, v), value)]

        loops, _ = L.loop_nest(names, normalized, store)
        values = {"mean": mean, "inv_std": scale}
        return stats + loops + [L.Store(f"out{k}", o, values[name]) for k, name in enumerate(a["statistics"], 1)]

    return over_rows(names, prod(shape[: a["axis"]]), 1, row)


def _broadcast(param: tuple[str, tuple[int, ...]], shape: tuple[int, ...], v: list[L.Var]) -> tuple[str, L.Expr]:
    buf, param_shape = param
    return buf, L.broadcast_index(param_shape, shape, v)


def _epsilon_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {"epsilon": float(ctx.node.attrs.get("epsilon", 1e-5))}


@register("InstanceNormalization", normalize=_epsilon_attrs)
def _lower_instancenorm(spec: KernelSpec) -> list[L.Stmt]:
    """Each (batch, channel) plane normalised on its own, then scale[c] and bias[c]: a work-item per plane."""
    names, shape = L.Names(), shape_of(spec)
    channels, size = shape[1], prod(shape[2:])
    plane = names.var("p")
    over = _contiguous(names, plane * size, size)
    stats, mean, scale = _standardize(names, over, size, spec.attrs["epsilon"])
    channel = plane % channels
    factor = names.local("factor")
    normalize = over(lambda i: [L.Store("out0", i, (L.Load("in0", i) - mean) * factor + L.Load("in2", channel))])
    return [
        L.Loop(
            plane,
            shape[0] * channels,
            [*stats, L.Assign(factor, scale * L.Load("in1", channel)), *normalize],
            parallel=True,
        )
    ]


def _groupnorm_attrs(ctx: NodeContext) -> dict[str, Any]:
    """num_groups, epsilon, and whether scale and bias hold a value per channel (opset 21) or per group (18)."""
    a = ctx.node.attrs
    groups, channels = int(a["num_groups"]), ctx.input_info(0).shape[1]
    if channels % groups:
        raise ctx.unsupported(f"{channels} channels don't split into {groups} groups")
    if int(a.get("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {a['stash_type']} is not supported (1, float32, is)")
    return {"groups": groups, "epsilon": float(a.get("epsilon", 1e-5)), "per_channel": int(ctx.opset >= 21)}


@register("GroupNormalization", normalize=_groupnorm_attrs)
def _lower_groupnorm(spec: KernelSpec) -> list[L.Stmt]:
    """The channels of each group (with their spatial extent) normalised together: a work-item per (batch, group)."""
    names, a, shape = L.Names(), spec.attrs, shape_of(spec)
    groups, per_group, size = a["groups"], shape[1] // a["groups"], prod(shape[2:])
    unit, channel, i = names.var("u"), names.var("c"), names.var("i")
    base = unit * (per_group * size)
    stats, mean, scale = _standardize(names, _contiguous(names, base, per_group * size), per_group * size, a["epsilon"])
    param = (unit % groups) * per_group + channel if a["per_channel"] else unit % groups
    index = base + channel * size + i
    value = (L.Load("in0", index) - mean) * scale * L.Load("in1", param) + L.Load("in2", param)
    return [
        L.Loop(
            unit,
            shape[0] * groups,
            [*stats, L.Loop(channel, per_group, [L.Loop(i, size, [L.Store("out0", index, value)])])],
            parallel=True,
        )
    ]


def _mvn_attrs(ctx: NodeContext) -> dict[str, Any]:
    rank = len(ctx.input_info(0).shape)
    return {"axes": sorted({axis_in_range(ctx, axis, rank) for axis in ctx.node.attrs.get("axes", [0, 2, 3])})}


@register("MeanVarianceNormalization", normalize=_mvn_attrs)
def _lower_mvn(spec: KernelSpec) -> list[L.Stmt]:
    """(x - mean) / (sqrt(var) + 1e-9) over `axes`, as ONNX's function body defines it."""
    names = L.Names()
    inv_std = names.local("inv_std")
    layout = ReduceLayout.of(shape_of(spec), spec.attrs["axes"])

    def per_output(_: L.Expr, base: L.Expr) -> list[L.Stmt]:
        over: Over = lambda body: layout.over_reduced(names, base, body)  # noqa: E731
        stats, mean, variance = _moments(names, over, layout.count)
        return [
            *stats,
            L.Assign(inv_std, 1.0 / (L.call("sqrt", variance) + 1e-9)),
            *over(lambda i: [L.Store("out0", i, (L.Load("in0", i) - mean) * inv_std)]),
        ]

    return layout.over_outputs(names, per_output)


def _lp_attrs(ctx: NodeContext) -> dict[str, Any]:
    p = int(ctx.node.attrs.get("p", 2))
    if p not in (1, 2):
        raise ctx.unsupported(f"LpNormalization p={p} is not supported (1 and 2 are)")
    shape = ctx.input_info(0).shape
    outer, length, inner = axis_view(shape, axis_in_range(ctx, ctx.node.attrs.get("axis", -1), len(shape)))
    return {"p": p, "outer": outer, "length": length, "inner": inner}


@register("LpNormalization", normalize=_lp_attrs)
def _lower_lp_normalization(spec: KernelSpec) -> list[L.Stmt]:
    """x / ||row||_p along the axis; a zero row gives zeros, as onnxruntime does."""
    names, a = L.Names(), spec.attrs
    i, norm = names.var("i"), names.local("norm")
    magnitude = (lambda x: x * x) if a["p"] == 2 else absolute

    def row(o: L.Expr, t: L.Expr) -> list[L.Stmt]:
        at = along(a, o, t)
        x = L.Load("in0", at(i))
        total = L.call("sqrt", norm) if a["p"] == 2 else norm
        return [
            L.Assign(norm, L.const(0.0)),
            L.Loop(i, a["length"], [L.Assign(norm, norm + magnitude(x))]),
            L.Assign(norm, L.select(L.compare("eq", norm, 0.0), 0.0, 1.0 / total)),
            L.Loop(i, a["length"], [L.Store("out0", at(i), x * norm)]),
        ]

    return over_rows(names, a["outer"], a["inner"], row)


def _rms_attrs(ctx: NodeContext) -> dict[str, Any]:
    """axis and epsilon. The statistics are float32 (stash_type 1, the only one farm computes in), and the scale
    must broadcast to the normalised shape (the axes from `axis` on): the kernel reads it at the broadcast index."""
    a, shape = ctx.node.attrs, ctx.input_info(0).shape
    if {ctx.input_info(i).dtype for i in range(2)} != {"float32"}:
        raise ctx.unsupported("RMSNormalization computes on float32 only")
    if int(a.get("stash_type", 1)) != 1:
        raise ctx.unsupported(f"stash_type {a['stash_type']} is not supported (1, float32, is)")
    axis = axis_in_range(ctx, a.get("axis", -1), len(shape))
    normalized, scale = shape[axis:], _trailing(ctx.input_info(1).shape, len(shape) - axis)
    fits = len(scale) <= len(normalized) and all(s in (1, n) for s, n in zip(reversed(scale), reversed(normalized)))
    if not fits:
        raise ctx.unsupported(f"scale of shape {list(ctx.input_info(1).shape)} doesn't broadcast to {list(normalized)}")
    return {"axis": axis, "epsilon": float(a.get("epsilon", 1e-5))}


@register("RMSNormalization", normalize=_rms_attrs)
def _lower_rms_normalization(spec: KernelSpec) -> list[L.Stmt]:
    """y = x / sqrt(mean(x^2) + epsilon) * scale over the axes from `axis` on."""
    names, a, shape = L.Names(), spec.attrs, shape_of(spec)
    normalized = shape[a["axis"] :]
    length = prod(normalized)
    scale = ("in1", _trailing(shape_of(spec, 1), len(normalized)))
    factor = names.local("inv_rms")

    def row(o: L.Expr, _inner: L.Expr) -> list[L.Stmt]:
        base = o * length
        x = lambda v: L.Load("in0", base + L.flat_index(normalized, v))  # noqa: E731
        squares = _contiguous(names, base, length)(
            lambda i: [L.Assign(factor, factor + L.Load("in0", i) * L.Load("in0", i))]
        )
        mean_square = factor * (1.0 / length) + a["epsilon"]
        loops, _ = L.loop_nest(
            names,
            normalized,
            lambda v: [
                L.Store(
                    "out0",
                    base + L.flat_index(normalized, v),
                    x(v) * factor * L.Load(*_broadcast(scale, normalized, v)),
                )
            ],
        )
        return [L.Assign(factor, L.const(0.0)), *squares, L.Assign(factor, 1.0 / L.call("sqrt", mean_square)), *loops]

    return over_rows(names, prod(shape[: a["axis"]]), 1, row)
