"""Training losses as inference ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both see the input as (N, C, D) (D the product of the spatial dims d1, d2, ... of an N x C x d1 x d2 ... input) and
the target as (N, D). The loss of element (n, d) with target t is -weight[t] * logp[n, t, d], 0 where t equals
ignore_index; `none` stores those, `sum` adds them and `mean` divides that sum by the sum of the weights of the
targets not ignored (their count without a weight input), as the ONNX spec says.

Targets are data. ONNX leaves a target outside [0, C) (other than ignore_index) undefined; here it is clamped
into [0, C) for both the input's and the weight's load, as ONNX's reference clips its weight gather, so that no
target ever reads outside a buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from farm.ir import loopir as L
from farm.ir.specs import KernelSpec
from farm.ops.registry import NodeContext, prod, register
from farm.ops.tensor import load

REDUCTIONS = ("none", "sum", "mean")
TARGET_DTYPES = ("int64", "int32")

# logp(n, d, t) -> (statements that compute it, its value): the log-probability of class t at element (n, d).
LogProb = Callable[[L.Names, L.Expr, L.Expr, L.Expr], tuple[list[L.Stmt], L.Expr]]


def _check_inputs(ctx: NodeContext) -> None:
    """float32 input (N x C x d1 ..., C >= 1) and weight (C), int64 or int32 targets (N x d1 ...)."""
    x, target = ctx.input_info(0), ctx.input_info(1)
    weight = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    if x.dtype != "float32" or (weight is not None and weight.dtype != "float32"):
        raise ctx.unsupported("only float32 input and weight are supported")
    if target.dtype not in TARGET_DTYPES:
        raise ctx.unsupported(f"target of {target.dtype} is not supported (int64 and int32 are)")
    if len(x.shape) < 2 or x.shape[1] < 1:
        raise ctx.unsupported(f"the input must be N x C x d1 ... with C >= 1, not {list(x.shape)}")
    n, classes, *spatial = x.shape
    if tuple(target.shape) != (n, *spatial) or (weight is not None and tuple(weight.shape) != (classes,)):
        raise ctx.unsupported(f"target {list(target.shape)} or weight does not match input {list(x.shape)}")


def _loss_attrs(ctx: NodeContext) -> dict[str, Any]:
    """The (N, C, D) view, the reduction and ignore_index (None when absent: no target is ignored)."""
    _check_inputs(ctx)
    reduction = ctx.node.attrs.get("reduction", "mean")
    if reduction not in REDUCTIONS:
        raise ctx.unsupported(f"reduction {reduction!r} is not supported ({', '.join(REDUCTIONS)} are)")
    ignore = ctx.node.attrs.get("ignore_index")
    n, classes, *spatial = ctx.input_info(0).shape
    return {
        "reduction": reduction,
        "ignore_index": None if ignore is None else int(ignore),
        "outer": n,
        "classes": classes,
        "inner": prod(spatial),
    }


def _class_index(a: dict[str, Any], n: L.Expr, d: L.Expr) -> Callable[[L.ExprLike], L.Expr]:
    """Flat index of class c at element (n, d) of the (N, C, D) input."""
    base = n * (a["classes"] * a["inner"]) + d
    return lambda c: base + c * a["inner"]


def _element_loss(spec: KernelSpec, names: L.Names, e: L.Expr, logp: LogProb) -> tuple[list[L.Stmt], L.Var, L.Var]:
    """Statements that set (loss, weight) locals for flat element e = n * D + d of the target; an ignored target
    has weight 0 and loss 0 (whatever the input holds there)."""
    a = spec.attrs
    n, d = (e, L.const(0)) if a["inner"] == 1 else (e // a["inner"], e % a["inner"])
    target, safe = names.local("t", L.I64), names.local("class", L.I64)
    loss, weight = names.local("loss"), names.local("w")
    stmts: list[L.Stmt] = [
        L.Assign(target, load("in1", spec.inputs[1], e)),
        L.Assign(safe, L.minimum(L.maximum(target, 0), a["classes"] - 1)),
    ]
    picked_stmts, picked = logp(names, n, d, safe)
    stmts += picked_stmts
    w: L.Expr = load("in2", spec.inputs[2], safe) if len(spec.inputs) > 2 else L.const(1.0)
    value = -(picked * w)
    if a["ignore_index"] is not None:
        ignored = L.compare("eq", target, a["ignore_index"])
        w, value = L.select(ignored, 0.0, w), L.select(ignored, 0.0, value)
    stmts += [L.Assign(weight, w), L.Assign(loss, value)]
    return stmts, loss, weight


def _losses(spec: KernelSpec, logp: LogProb, names: L.Names) -> list[L.Stmt]:
    """The loss output: one parallel loop storing each element's loss (`none`), or one serial loop summing them
    (and the weights, for `mean`) into element 0."""
    a, elements = spec.attrs, spec.attrs["outer"] * spec.attrs["inner"]
    e = names.var("e")
    if a["reduction"] == "none":
        stmts, loss, _ = _element_loss(spec, names, e, logp)
        return [L.Loop(e, elements, [*stmts, L.Store("out0", e, loss)], parallel=True)]
    total, weights = names.local("total"), names.local("weights")
    stmts, loss, weight = _element_loss(spec, names, e, logp)
    body = [*stmts, L.Assign(total, total + loss), L.Assign(weights, weights + weight)]
    result = total / weights if a["reduction"] == "mean" else total
    return [
        L.Assign(total, L.const(0.0)),
        L.Assign(weights, L.const(0.0)),
        L.Loop(e, elements, body),
        L.Store("out0", L.const(0), result),
    ]


# ------------------------------------------------------------------------------------ NegativeLogLikelihoodLoss


def _input_log_prob(spec: KernelSpec) -> LogProb:
    """NegativeLogLikelihoodLoss's input already holds log-probabilities: logp is a load."""

    def logp(names: L.Names, n: L.Expr, d: L.Expr, t: L.Expr) -> tuple[list[L.Stmt], L.Expr]:
        return [], L.Load("in0", _class_index(spec.attrs, n, d)(t))

    return logp


@register("NegativeLogLikelihoodLoss", normalize=_loss_attrs)
def _lower_nll(spec: KernelSpec) -> list[L.Stmt]:
    return _losses(spec, _input_log_prob(spec), L.Names())


# -------------------------------------------------------------------------------------- SoftmaxCrossEntropyLoss


def _log_sum_exp(names: L.Names, x_at: Callable[[L.Expr], L.Expr], classes: int) -> tuple[list[L.Stmt], L.Var]:
    """Statements that set a local to log(sum_c exp(x_c)), as max + log(sum exp(x - max)) so that large logits
    don't overflow (the max starts from class 0, so no sentinel can meet an input of -inf)."""
    c, top, total = names.var("c"), names.local("mx"), names.local("sum")
    return [
        L.Assign(top, x_at(L.const(0))),
        L.Loop(c, classes, [L.Assign(top, L.maximum(top, x_at(c)))]),
        L.Assign(total, L.const(0.0)),
        L.Loop(c, classes, [L.Assign(total, total + L.call("exp", x_at(c) - top))]),
        L.Assign(total, top + L.call("log", total)),
    ], total


def _softmax_log_prob(spec: KernelSpec) -> LogProb:
    """logp = x - logsumexp over the classes of element (n, d)."""

    def logp(names: L.Names, n: L.Expr, d: L.Expr, t: L.Expr) -> tuple[list[L.Stmt], L.Expr]:
        at = _class_index(spec.attrs, n, d)
        stmts, lse = _log_sum_exp(names, lambda c: L.Load("in0", at(c)), spec.attrs["classes"])
        return stmts, L.Load("in0", at(t)) - lse

    return logp


def _log_prob_output(spec: KernelSpec, names: L.Names) -> list[L.Stmt]:
    """The optional second output: log_softmax of the input along C, one work-item per element (n, d)."""
    a = spec.attrs
    e, c = names.var("e"), names.var("c")
    n, d = (e, L.const(0)) if a["inner"] == 1 else (e // a["inner"], e % a["inner"])
    at = _class_index(a, n, d)
    stmts, lse = _log_sum_exp(names, lambda k: L.Load("in0", at(k)), a["classes"])
    store = L.Loop(c, a["classes"], [L.Store("out1", at(c), L.Load("in0", at(c)) - lse)])
    return [L.Loop(e, a["outer"] * a["inner"], [*stmts, store], parallel=True)]


@register("SoftmaxCrossEntropyLoss", normalize=_loss_attrs)
def _lower_sce(spec: KernelSpec) -> list[L.Stmt]:
    names = L.Names()
    log_prob = _log_prob_output(spec, names) if len(spec.outputs) > 1 else []
    return log_prob + _losses(spec, _softmax_log_prob(spec), names)
