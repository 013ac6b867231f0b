"""Elementwise ops: activations and numpy-broadcasting arithmetic."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from farm.codegen import loopir as L
from farm.ops.registry import NodeContext, activate, elementwise_loops, out_shape, register
from farm.specs import KernelSpec


def _tanh(x: L.Expr) -> L.Expr:
    """tanh from one exp of a non-positive argument, so that it never overflows."""
    t = L.call("exp", -2.0 * L.select(L.compare("lt", x, 0.0), -x, x))
    magnitude = (1.0 - t) / (1.0 + t)
    return L.select(L.compare("lt", x, 0.0), -magnitude, magnitude)


def _sigmoid(x: L.Expr) -> L.Expr:
    return 1.0 / (1.0 + L.call("exp", -x))


UNARY: dict[str, Callable[[L.Expr, dict[str, Any]], L.Expr]] = {
    "Relu": lambda x, a: L.maximum(x, 0.0),
    "LeakyRelu": lambda x, a: L.select(L.compare("lt", x, 0.0), x * a.get("alpha", 0.01), x),
    "Clip": lambda x, a: L.minimum(L.maximum(x, a["min"]), a["max"]),
    "Sigmoid": lambda x, a: _sigmoid(x),
    "Tanh": lambda x, a: _tanh(x),
}


def _clip_bounds(ctx: NodeContext) -> dict[str, Any]:
    """Clip's bounds from attributes (opset < 11) or constant inputs (opset >= 11); absent means unbounded."""
    low, high = ctx.node.attrs.get("min", -math.inf), ctx.node.attrs.get("max", math.inf)
    low_input, high_input = ctx.constant(1), ctx.constant(2)
    low = float(low_input) if low_input is not None else low
    high = float(high_input) if high_input is not None else high
    return {"min": max(low, -3.4028234663852886e38), "max": min(high, 3.4028234663852886e38)}


def _lower_unary(spec: KernelSpec) -> list[L.Stmt]:
    shape, fn, attrs = out_shape(spec), UNARY[spec.op], spec.attrs
    load = lambda v: L.Load("in0", L.flat_index(shape, v))  # noqa: E731
    return elementwise_loops(L.Names(), shape, lambda v: activate(fn(load(v), attrs), spec.activation))


for _op in ("Relu", "LeakyRelu", "Sigmoid", "Tanh"):
    register(_op)(_lower_unary)
register("Clip", normalize=_clip_bounds, data_inputs=(0,))(_lower_unary)


BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Sum": "add"}


@register("Add", "Sub", "Mul", "Div", "Sum")
def _lower_broadcasting(spec: KernelSpec) -> list[L.Stmt]:
    """out = in0 (op) in1 (op) ..., each input broadcast numpy-style to the output shape."""
    shape, op = out_shape(spec), BINARY[spec.op]

    def value(v: list[L.Var]) -> L.Expr:
        result: L.Expr | None = None
        for i, info in enumerate(spec.inputs):
            term = L.Load(f"in{i}", L.broadcast_index(info.shape, shape, v))
            result = term if result is None else L.binary(op, result, term)
        return activate(result, spec.activation)

    return elementwise_loops(L.Names(), shape, value)
