"""Neural-network ops: convolution and matrix products (through the IR's Gemm primitive), pools, norms, softmax."""

from __future__ import annotations

import math
from typing import Any

from farm.codegen import loopir as L
from farm.ops.registry import NodeContext, activate, out_shape, prod, register, shape_of
from farm.specs import KernelSpec

NEG_INF = -3.4028234663852886e38


def _spatial_attrs(ctx: NodeContext, kernel_shape: list[int]) -> dict[str, Any]:
    """kernel_shape, strides, dilations and explicit [top, left, bottom, right] pads, with auto_pad resolved."""
    x = ctx.inputs[0]
    if x is None or len(x.shape) != 4:
        raise ctx.unsupported("only 2-D spatial inputs (NCHW) are supported")
    attrs = ctx.node.attrs
    strides = list(attrs.get("strides", [1, 1]))
    dilations = list(attrs.get("dilations", [1, 1]))
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(x.shape[2:], kernel_shape, strides, dilations, upper=auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = [0, 0, 0, 0]
    return {"kernel_shape": list(kernel_shape), "strides": strides, "dilations": dilations, "pads": pads}


def _same_pads(spatial, kernel, strides, dilations, *, upper: bool) -> list[int]:
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if upper else large)
        ends.append(large if upper else small)
    return begins + ends


def _conv_attrs(ctx: NodeContext) -> dict[str, Any]:
    weight = ctx.inputs[1]
    attrs = _spatial_attrs(ctx, list(ctx.node.attrs.get("kernel_shape", weight.shape[2:])))
    attrs["group"] = int(ctx.node.attrs.get("group", 1))
    return attrs


def _conv_geometry(spec: KernelSpec) -> dict[str, int]:
    a = spec.attrs
    n, c, h, w = shape_of(spec)
    _, m, ho, wo = out_shape(spec)
    g = a["group"]
    kh, kw = a["kernel_shape"]
    return dict(n=n, c=c, h=h, w=w, m=m, ho=ho, wo=wo, g=g, cg=c // g, mg=m // g, kh=kh, kw=kw,
                sh=a["strides"][0], sw=a["strides"][1], dh=a["dilations"][0], dw=a["dilations"][1],
                ph=a["pads"][0], pw=a["pads"][1])


def _is_pointwise(geo: dict[str, int]) -> bool:
    """A 1x1, stride-1, unpadded conv reads its input as the GEMM's B matrix directly: no im2col."""
    return (geo["kh"], geo["kw"], geo["sh"], geo["sw"], geo["ph"], geo["pw"]) == (1, 1, 1, 1, 0, 0)


def _is_depthwise(geo: dict[str, int]) -> bool:
    return geo["cg"] == 1 and geo["mg"] == 1


def _conv_scratch(spec: KernelSpec) -> int:
    geo = _conv_geometry(spec)
    if _is_pointwise(geo) or _is_depthwise(geo):
        return 0
    return geo["cg"] * geo["kh"] * geo["kw"] * geo["ho"] * geo["wo"]


def _input_at(geo: dict[str, int], base: L.Expr, oh: L.Expr, ow: L.Expr, r: L.ExprLike, s: L.ExprLike,
              fill: float) -> L.Expr:
    """x[base + ih*W + iw] for the window tap (r, s) of output (oh, ow), or `fill` in the padding."""
    ih = oh * geo["sh"] - geo["ph"] + L.wrap(r, L.I64) * geo["dh"]
    iw = ow * geo["sw"] - geo["pw"] + L.wrap(s, L.I64) * geo["dw"]
    inside = L.logical_and(L.compare("ge", ih, 0), L.compare("lt", ih, geo["h"]),
                           L.compare("ge", iw, 0), L.compare("lt", iw, geo["w"]))
    clamped = L.minimum(L.maximum(ih, 0), geo["h"] - 1) * geo["w"] + L.minimum(L.maximum(iw, 0), geo["w"] - 1)
    return L.select(inside, L.Load("in0", base + clamped), fill)


def _im2col(names: L.Names, geo: dict[str, int], x_base: L.Expr) -> list[L.Stmt]:
    """scratch[(c*kh*kw + r*kw + s) * P + oh*Wo + ow] = x[c, ih, iw] (0 in the padding) for one group."""
    c, r, s, oh, ow = (names.var(h) for h in "crsyx")
    hw, p = geo["h"] * geo["w"], geo["ho"] * geo["wo"]
    row = (c * geo["kh"] + r) * geo["kw"] + s
    store = L.Store("scratch", row * p + oh * geo["wo"] + ow, _input_at(geo, x_base + c * hw, oh, ow, r, s, 0.0))
    body: list[L.Stmt] = [store]
    for var, extent in ((ow, geo["wo"]), (oh, geo["ho"]), (s, geo["kw"]), (r, geo["kh"]), (c, geo["cg"])):
        body = [L.Loop(var, extent, body, parallel=True)]
    return body


def _bias_activation_epilogue(names: L.Names, spec: KernelSpec, rows: int, cols: int, batches: int,
                              bias: str | None) -> list[L.Stmt]:
    """out[b, m, p] = act(out[b, m, p] + bias[m]) after a Gemm wrote the raw products."""
    if bias is None and spec.activation is None:
        return []
    b, m, p = names.var("b"), names.var("m"), names.var("p")
    index = (b * rows + m) * cols + p
    value: L.Expr = L.Load("out0", index)
    if bias is not None:
        value = value + L.Load(bias, m)
    store = L.Store("out0", index, activate(value, spec.activation))
    return [L.Loop(b, batches, [L.Loop(m, rows, [L.Loop(p, cols, [store], True)], True)], True)]


def _depthwise(names: L.Names, spec: KernelSpec, geo: dict[str, int]) -> list[L.Stmt]:
    """Direct depthwise conv: one output channel per input channel, no GEMM to feed."""
    n, ch, oh, ow, r, s, acc = names.var("n"), names.var("c"), names.var("y"), names.var("x"), \
        names.var("r"), names.var("s"), names.local()
    plane = (n * geo["c"] + ch) * (geo["h"] * geo["w"])
    tap = _input_at(geo, plane, oh, ow, r, s, 0.0) * L.Load("in1", (ch * geo["kh"] + r) * geo["kw"] + s)
    init = L.Load("in2", ch) if len(spec.inputs) > 2 else L.const(0.0)
    out_index = ((n * geo["m"] + ch) * geo["ho"] + oh) * geo["wo"] + ow
    inner = [L.Assign(acc, init),
             L.Loop(r, geo["kh"], [L.Loop(s, geo["kw"], [L.Assign(acc, acc + tap)])]),
             L.Store("out0", out_index, activate(acc, spec.activation))]
    return [L.Loop(n, geo["n"], [L.Loop(ch, geo["m"], [L.Loop(oh, geo["ho"], [L.Loop(ow, geo["wo"], inner, True)], True)],
                                        True)], True)]


def _lower_conv(spec: KernelSpec) -> list[L.Stmt]:
    """Conv as im2col + GEMM per (batch, group): out[m, p] = W[m, k] @ col[k, p]; bias and activation after."""
    names, geo = L.Names(), _conv_geometry(spec)
    if _is_depthwise(geo):
        return _depthwise(names, spec, geo)
    n, g = names.var("n"), names.var("g")
    kdim, p, hw = geo["cg"] * geo["kh"] * geo["kw"], geo["ho"] * geo["wo"], geo["h"] * geo["w"]
    x_base = (n * geo["c"] + g * geo["cg"]) * hw
    pointwise = _is_pointwise(geo)
    gemm = L.Gemm(a="in1", a_offset=g * (geo["mg"] * kdim), lda=kdim,
                  b="in0" if pointwise else "scratch", b_offset=x_base if pointwise else L.const(0), ldb=p,
                  c="out0", c_offset=(n * geo["m"] + g * geo["mg"]) * p, ldc=p, m=geo["mg"], n=p, k=kdim)
    per_group = ([] if pointwise else _im2col(names, geo, x_base)) + [gemm]
    body = [L.Loop(n, geo["n"], [L.Loop(g, geo["g"], per_group)])]
    bias = "in2" if len(spec.inputs) > 2 else None
    return body + _bias_activation_epilogue(names, spec, geo["m"], p, geo["n"], bias)


register("Conv", normalize=_conv_attrs, scratch_floats=_conv_scratch)(_lower_conv)


def _gemm_attrs(ctx: NodeContext) -> dict[str, Any]:
    a = ctx.node.attrs
    return {"alpha": float(a.get("alpha", 1.0)), "beta": float(a.get("beta", 1.0)),
            "transA": int(a.get("transA", 0)), "transB": int(a.get("transB", 0))}


@register("Gemm", normalize=_gemm_attrs)
def _lower_gemm(spec: KernelSpec) -> list[L.Stmt]:
    """Y = alpha * op(A) @ op(B) + beta * C; the plain layout goes through the Gemm primitive."""
    names, a = L.Names(), spec.attrs
    rows, cols = out_shape(spec)
    depth = shape_of(spec, 0)[0 if a["transA"] else 1]
    if not a["transA"] and not a["transB"]:
        body: list[L.Stmt] = [L.Gemm("in0", L.const(0), depth, "in1", L.const(0), cols, "out0", L.const(0), cols,
                                     rows, cols, depth)]
        product = lambda m, n: L.Load("out0", m * cols + n)  # noqa: E731
    else:
        body, product = [], None
    m, n, k, acc = names.var("m"), names.var("n"), names.var("k"), names.local()
    value: L.Expr = acc if product is None else product(m, n)
    value = value * a["alpha"] if a["alpha"] != 1.0 else value
    if len(spec.inputs) > 2 and a["beta"] != 0.0:
        value = value + L.Load("in2", L.broadcast_index(shape_of(spec, 2), (rows, cols), [m, n])) * a["beta"]
    store = L.Store("out0", m * cols + n, activate(value, spec.activation))
    if product is not None:
        return body + [L.Loop(m, rows, [L.Loop(n, cols, [store], True)], True)]
    a_index = k * rows + m if a["transA"] else m * depth + k
    b_index = n * depth + k if a["transB"] else k * cols + n
    dot = L.Loop(k, depth, [L.Assign(acc, acc + L.Load("in0", a_index) * L.Load("in1", b_index))])
    return [L.Loop(m, rows, [L.Loop(n, cols, [L.Assign(acc, L.const(0.0)), dot, store], True)], True)]


@register("MatMul")
def _lower_matmul(spec: KernelSpec) -> list[L.Stmt]:
    """numpy matmul: batch dims broadcast, one Gemm per output batch; 1-D operands as in numpy."""
    names = L.Names()
    a_shape, b_shape, o_shape = shape_of(spec, 0), shape_of(spec, 1), out_shape(spec)
    a_mat = (1, *a_shape) if len(a_shape) == 1 else a_shape
    b_mat = (*b_shape, 1) if len(b_shape) == 1 else b_shape
    rows, depth, cols = a_mat[-2], a_mat[-1], b_mat[-1]
    batch = tuple(o_shape[: len(o_shape) - (len(a_shape) > 1) - (len(b_shape) > 1)])

    def gemm(v: list[L.Var]) -> list[L.Stmt]:
        a_off = L.broadcast_index(a_mat[:-2], batch, v) * (rows * depth) if len(a_mat) > 2 else L.const(0)
        b_off = L.broadcast_index(b_mat[:-2], batch, v) * (depth * cols) if len(b_mat) > 2 else L.const(0)
        c_off = L.flat_index(batch, v) * (rows * cols)
        return [L.Gemm("in0", a_off, depth, "in1", b_off, cols, "out0", c_off, cols, rows, cols, depth)]

    body, _ = L.loop_nest(names, batch, gemm)
    return body + _bias_activation_epilogue(names, spec, 1, prod(o_shape), 1, None)


def _pool_attrs(ctx: NodeContext) -> dict[str, Any]:
    if len(ctx.node.outputs) > 1 and ctx.node.outputs[1]:
        raise ctx.unsupported("MaxPool's Indices output is not supported")
    attrs = _spatial_attrs(ctx, list(ctx.node.attrs["kernel_shape"]))
    attrs["count_include_pad"] = int(ctx.node.attrs.get("count_include_pad", 0))
    return attrs


def _lower_pool(spec: KernelSpec) -> list[L.Stmt]:
    """Max or average over each window; the average divides by the window's count under count_include_pad."""
    names, a = L.Names(), spec.attrs
    n, c, h, w = shape_of(spec)
    _, _, ho, wo = out_shape(spec)
    geo = dict(h=h, w=w, sh=a["strides"][0], sw=a["strides"][1], dh=a["dilations"][0], dw=a["dilations"][1],
               ph=a["pads"][0], pw=a["pads"][1])
    plane, y, x, r, s = names.var("p"), names.var("y"), names.var("x"), names.var("r"), names.var("s")
    acc, count = names.local(), names.local("cnt")
    is_max = spec.op == "MaxPool"
    tap = _input_at(geo, plane * (h * w), y, x, r, s, -math.inf if is_max else 0.0)
    update = [L.Assign(acc, L.maximum(acc, tap) if is_max else acc + tap)]
    if not is_max:
        update.append(L.Assign(count, count + L.select(_counted(geo, a, y, x, r, s), 1.0, 0.0)))
    kh, kw = a["kernel_shape"]
    result = acc if is_max else acc / count
    inner = [L.Assign(acc, L.const(-math.inf if is_max else 0.0)), L.Assign(count, L.const(0.0)),
             L.Loop(r, kh, [L.Loop(s, kw, update)]),
             L.Store("out0", (plane * ho + y) * wo + x, activate(result, spec.activation))]
    return [L.Loop(plane, n * c, [L.Loop(y, ho, [L.Loop(x, wo, inner, True)], True)], True)]


def _counted(geo: dict, attrs: dict, y: L.Var, x: L.Var, r: L.Var, s: L.Var) -> L.Expr:
    """Whether tap (r, s) counts towards the average: inside the input, or inside the pads under count_include_pad."""
    ih = y * geo["sh"] - geo["ph"] + r * geo["dh"]
    iw = x * geo["sw"] - geo["pw"] + s * geo["dw"]
    pads = attrs["pads"] if attrs["count_include_pad"] else [0, 0, 0, 0]
    return L.logical_and(L.compare("ge", ih, -pads[0]), L.compare("lt", ih, geo["h"] + pads[2]),
                         L.compare("ge", iw, -pads[1]), L.compare("lt", iw, geo["w"] + pads[3]))


register("MaxPool", "AveragePool", normalize=_pool_attrs, data_inputs=(0,))(_lower_pool)


def _no_attrs(ctx: NodeContext) -> dict[str, Any]:
    return {}


@register("GlobalAveragePool", "GlobalMaxPool", normalize=_no_attrs)
def _lower_global_pool(spec: KernelSpec) -> list[L.Stmt]:
    names = L.Names()
    shape = shape_of(spec)
    planes, size = shape[0] * shape[1], prod(shape[2:])
    p, i, acc = names.var("p"), names.var("i"), names.local()
    tap = L.Load("in0", p * size + i)
    is_max = spec.op == "GlobalMaxPool"
    result = acc if is_max else acc * (1.0 / size)
    return [L.Loop(p, planes, parallel=True, body=[
        L.Assign(acc, L.const(NEG_INF if is_max else 0.0)),
        L.Loop(i, size, [L.Assign(acc, L.maximum(acc, tap) if is_max else acc + tap)]),
        L.Store("out0", p, activate(result, spec.activation)),
    ])]


def _lrn_attrs(ctx: NodeContext) -> dict[str, Any]:
    a = ctx.node.attrs
    return {"size": int(a["size"]), "alpha": float(a.get("alpha", 1e-4)), "beta": float(a.get("beta", 0.75)),
            "bias": float(a.get("bias", 1.0))}


@register("LRN", normalize=_lrn_attrs)
def _lower_lrn(spec: KernelSpec) -> list[L.Stmt]:
    """y = x / (bias + alpha/size * sum of x^2 over the channel window)^beta."""
    names, a = L.Names(), spec.attrs
    n, c, h, w = shape_of(spec)
    hw = h * w
    b, ch, i, j, acc = names.var("b"), names.var("c"), names.var("i"), names.var("j"), names.local()
    before = (a["size"] - 1) // 2
    other = ch - before + j
    inside = L.logical_and(L.compare("ge", other, 0), L.compare("lt", other, c))
    x_other = L.Load("in0", (b * c + L.minimum(L.maximum(other, 0), c - 1)) * hw + i)
    center = (b * c + ch) * hw + i
    base = a["bias"] + acc * (a["alpha"] / a["size"])
    value = L.Load("in0", center) * L.call("exp", L.call("log", base) * (-a["beta"]))
    return [L.Loop(b, n, [L.Loop(ch, c, [L.Loop(i, hw, [
        L.Assign(acc, L.const(0.0)),
        L.Loop(j, a["size"], [L.Assign(acc, acc + L.select(inside, x_other * x_other, 0.0))]),
        L.Store("out0", center, activate(value, spec.activation)),
    ], True)], True)], True)]


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


def _softmax_attrs(ctx: NodeContext) -> dict[str, Any]:
    """Softmax as (outer, length, inner): before opset 13 it covers every axis from `axis` on, later just `axis`."""
    shape = ctx.inputs[0].shape
    legacy = ctx.opset < 13
    axis = int(ctx.node.attrs.get("axis", 1 if legacy else -1)) % len(shape)
    length = prod(shape[axis:]) if legacy else shape[axis]
    inner = 1 if legacy else prod(shape[axis + 1:])
    return {"outer": prod(shape[:axis]), "length": length, "inner": inner}


@register("Softmax", normalize=_softmax_attrs)
def _lower_softmax(spec: KernelSpec) -> list[L.Stmt]:
    names, a = L.Names(), spec.attrs
    o, t, i, mx, total = names.var("o"), names.var("t"), names.var("i"), names.local("mx"), names.local("sum")
    index = (o * a["length"] + i) * a["inner"] + t
    x = L.Load("in0", index)
    return [L.Loop(o, a["outer"], parallel=True, body=[L.Loop(t, a["inner"], parallel=True, body=[
        L.Assign(mx, L.const(NEG_INF)),
        L.Loop(i, a["length"], [L.Assign(mx, L.maximum(mx, x))]),
        L.Assign(total, L.const(0.0)),
        L.Loop(i, a["length"], [L.Store("out0", index, L.call("exp", x - mx)),
                                L.Assign(total, total + L.Load("out0", index))]),
        L.Assign(total, 1.0 / total),
        L.Loop(i, a["length"], [L.Store("out0", index, activate(L.Load("out0", index) * total, spec.activation))]),
    ])])]
