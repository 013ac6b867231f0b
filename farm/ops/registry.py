"""Registry of op lowerings and the small helpers every lowering uses."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.errors import UnsupportedError
from farm.ir import loopir as L
from farm.ir.graph import FUSED_OPS, Activation, Graph, Node, TensorInfo
from farm.ir.specs import KernelSpec


@dataclass
class NodeContext:
    """What attribute normalisation may look at: the node, its value infos, constants and the model's opset."""

    node: Node
    inputs: list[TensorInfo | None]
    outputs: list[TensorInfo]
    constants: Mapping[str, np.ndarray]
    opset: int

    @classmethod
    def of(cls, node: Node, graph: Graph) -> NodeContext:
        """The context of `node` in `graph`: its inputs' infos (None where unknown), its outputs', the constants."""
        return cls(
            node,
            [graph.values.get(name) for name in node.inputs],
            [graph.values[name] for name in node.outputs if name],
            graph.constants,
            graph.opset,
        )

    def constant(self, index: int) -> np.ndarray | None:
        """The constant value of input `index`, or None when it is absent; error when it is not constant."""
        if index >= len(self.node.inputs) or not self.node.inputs[index]:
            return None
        name = self.node.inputs[index]
        if name not in self.constants:
            raise self.unsupported(f"input {index} ({name!r}) must be a constant")
        return self.constants[name]

    def input_info(self, index: int) -> TensorInfo:
        """The value info of input `index`, one the op requires (validate refuses a graph that leaves it out)."""
        info = self.inputs[index]
        if info is None:
            raise self.unsupported(f"required input {index} is missing")
        return info

    def unsupported(self, reason: str) -> UnsupportedError:
        n = self.node
        return UnsupportedError(reason, node=n.name, op=n.op_type, domain=n.domain, opset=self.opset)


def axis_in_range(ctx: NodeContext, axis: Any, rank: int, what: str = "axis") -> int:
    """`axis` as an index in [0, rank), refused unless ONNX allows it ([-rank, rank)): taking it modulo the rank
    unchecked would quietly compute something for an axis of 2**40."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ctx.unsupported(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank


def keep_attrs(ctx: NodeContext) -> dict[str, Any]:
    return dict(ctx.node.attrs)


CORE_DTYPES = frozenset({"float32", "int64", "int32", "bool"})
"""The dtypes every lowering handles: what an op takes unless it declares more (OpLowering.dtypes)."""
NARROW_INTS = frozenset({"int8", "int16", "uint8", "uint16", "uint32"})
"""Integer dtypes that load as int64 values and store back wrapped to their width."""
HALF_FLOATS = frozenset({"float16", "bfloat16"})
"""Float dtypes that load as float32 values and store back rounded to nearest even (onnxruntime's CPU kernels for
float16 compute in float32 the same way, and ml_dtypes' bfloat16 arithmetic too)."""
ALL_DTYPES = CORE_DTYPES | NARROW_INTS | HALF_FLOATS | {"float64"}
"""Every dtype a buffer may hold: what pure data movement (Reshape, Transpose, Gather, ...) takes."""


@dataclass(frozen=True)
class OpLowering:
    """How one ONNX op becomes a kernel.

    `dtypes` are the dtypes its data inputs and outputs may have: CORE_DTYPES unless the op's kernels are written
    for more (a MatMul's Gemm reads float32 panels, so a float16 MatMul is refused rather than misread)."""

    lower: Callable[[KernelSpec], list[L.Stmt]]
    normalize: Callable[[NodeContext], dict[str, Any]] = keep_attrs
    data_inputs: tuple[int, ...] | None = None
    scratch_floats: Callable[[KernelSpec], int] = field(default=lambda spec: 0)
    """4-byte words of scratch the kernel needs (0: none)."""
    scratch_dtype: Callable[[KernelSpec], str] = field(default=lambda spec: L.F32)
    """The loop-IR dtype of the scratch's elements (float32 unless the kernel keeps bytes there)."""
    dtypes: frozenset[str] = CORE_DTYPES
    empty_operands: bool = False
    """The kernel is right when some of its inputs or outputs are empty and others are not: its loops over an empty
    tensor run no iteration, and nothing else reads one (a reduction over nothing stores its identity). The
    planner refuses such a node of any other op (a node whose outputs are all empty gets no kernel)."""

    def data_input_indices(self, node: Node) -> list[int]:
        """Indices of the node inputs passed to the kernel as buffers (None: every present input)."""
        indices = range(len(node.inputs)) if self.data_inputs is None else self.data_inputs
        return [i for i in indices if i < len(node.inputs) and node.inputs[i]]


LOWERINGS: dict[str, OpLowering] = {}


def register(*ops: str, **options: Any) -> Callable:
    """Decorator: register a lowering function for `ops` with OpLowering options."""

    def add(lower: Callable[[KernelSpec], list[L.Stmt]]) -> Callable:
        for op in ops:
            LOWERINGS[op] = OpLowering(lower=lower, **options)
        return lower

    return add


class _SupportedOps:
    """A live view of the registry's op names (ops register on import)."""

    def __contains__(self, op: object) -> bool:
        return op in LOWERINGS and op not in FUSED_OPS

    def __iter__(self):
        return iter(sorted(op for op in LOWERINGS if op not in FUSED_OPS))

    def __len__(self) -> int:
        return len(LOWERINGS) - len(FUSED_OPS & LOWERINGS.keys())


SUPPORTED_OPS = _SupportedOps()


def lower_kernel(spec: KernelSpec) -> L.LoopKernel:
    """The loop kernel for `spec`: parameters are outputs, then data inputs, then scratch if any."""
    lowering = LOWERINGS[spec.op]
    params = [L.Param(f"out{i}", _ir_dtype(t), output=True) for i, t in enumerate(spec.outputs)]
    params += [L.Param(f"in{i}", _ir_dtype(t)) for i, t in enumerate(spec.inputs)]
    if lowering.scratch_floats(spec):
        params.append(L.Param("scratch", lowering.scratch_dtype(spec), output=True))
    return L.LoopKernel(params, lowering.lower(spec))


def argument_bytes(spec: KernelSpec) -> list[int]:
    """The byte size of each of `lower_kernel(spec)`'s parameters, in order (what a caller must allocate)."""
    sizes = [info.nbytes for info in (*spec.outputs, *spec.inputs)]
    scratch = LOWERINGS[spec.op].scratch_floats(spec)
    return sizes + ([scratch * 4] if scratch else [])


BUFFER_DTYPES = {
    "float32": L.F32,
    "float64": L.F64,
    "float16": L.F16,
    "bfloat16": L.BF16,
    "int64": L.I64,
    "int32": L.I32,
    "int16": L.I16,
    "int8": L.I8,
    "uint32": L.U32,
    "uint16": L.U16,
    "uint8": L.U8,
    "bool": L.BOOL,
}
"""The loop IR's buffer dtype for each numpy dtype a tensor may have."""


def check_dtypes(ctx: NodeContext, allowed: frozenset[str]) -> None:
    """Refuse a node whose data inputs or outputs have a dtype its lowering doesn't take, naming it."""
    for role, infos in (("input", ctx.inputs), ("output", ctx.outputs)):
        for index, info in enumerate(infos):
            if info is not None and info.dtype not in allowed:
                names = ctx.node.inputs if role == "input" else [n for n in ctx.node.outputs if n]
                name = names[index]
                raise ctx.unsupported(
                    f"{role} {name!r} has dtype {info.dtype}; {ctx.node.op_type} takes "
                    f"{', '.join(sorted(allowed))} in farm"
                )


def _ir_dtype(info: TensorInfo) -> str:
    return BUFFER_DTYPES[info.dtype]


ACTIVATIONS: dict[str, Callable[[L.Expr, tuple[float, ...]], L.Expr]] = {
    "relu": lambda x, p: L.maximum(x, 0.0),
    "leakyrelu": lambda x, p: L.select(L.compare("lt", x, 0.0), x * p[0], x),
    "clip": lambda x, p: L.minimum(L.maximum(x, p[0]), p[1]),
}


def activate(value: L.Expr, activation: Activation | None) -> L.Expr:
    """Apply a fused activation to the value a kernel is about to store."""
    return value if activation is None else ACTIVATIONS[activation.kind](value, activation.params)


def gemm_epilogue(
    spec: KernelSpec,
    bias: str | None,
    bias_offset: L.Expr,
    bias_on_columns: bool = False,
    residual: str | None = None,
    residual_offset: L.Expr | None = None,
) -> L.GemmEpilogue | None:
    """The GEMM epilogue of a kernel whose output is the GEMM's C: its bias (a buffer, None without), a residual
    laid out like C (which may be C itself: conv._conv_residual), and the spec's fused activation; None when there is
    none of them."""
    if bias is None and residual is None and spec.activation is None:
        return None
    activation = None if spec.activation is None else (spec.activation.kind, tuple(spec.activation.params))
    return L.GemmEpilogue(
        bias=bias,
        bias_offset=bias_offset if bias else None,
        bias_on_columns=bias_on_columns,
        residual=residual,
        residual_offset=residual_offset if residual else None,
        activation=activation,
    )


def elementwise_loops(
    names: L.Names, shape: tuple[int, ...], value_at: Callable[[list[L.Var]], L.Expr], out: str = "out0"
) -> list[L.Stmt]:
    """out[i...] = value_at(i...) over every index of `shape` (independent iterations: marked parallel)."""
    body, _ = L.loop_nest(names, shape, lambda v: [L.Store(out, L.flat_index(shape, v), value_at(v))], parallel=True)
    return body


def coalesced(
    shape: tuple[int, ...], operands: Sequence[tuple[int, ...]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """`shape` and the `operands`' shapes (each numpy-broadcast to it) with axes of extent 1 dropped and neighbouring
    axes merged wherever every operand reads both alike (wholly, or broadcast across both). An elementwise loop nest
    over the result is one long contiguous loop where nothing broadcasts: over a short innermost axis (a 16x16 plane),
    LLVM vectorised the loop around it instead, with gathers and scatters, at a tenth of the speed."""
    padded = [(1,) * (len(shape) - len(operand)) + tuple(operand) for operand in operands]
    axes = [axis for axis, extent in enumerate(shape) if extent != 1]
    merged: list[int] = []
    merged_operands: list[list[int]] = [[] for _ in operands]
    reads: tuple[bool, ...] | None = None
    for axis in axes:
        read = tuple(operand[axis] != 1 for operand in padded)
        if read == reads:
            merged[-1] *= shape[axis]
            for merged_operand, operand in zip(merged_operands, padded):
                merged_operand[-1] *= operand[axis]
        else:
            merged.append(shape[axis])
            for merged_operand, operand in zip(merged_operands, padded):
                merged_operand.append(operand[axis])
        reads = read
    if not merged:
        return (1,), [(1,) for _ in operands]
    return tuple(merged), [tuple(operand) for operand in merged_operands]


def shape_of(spec: KernelSpec, index: int = 0) -> tuple[int, ...]:
    return spec.inputs[index].shape


def out_shape(spec: KernelSpec, index: int = 0) -> tuple[int, ...]:
    return spec.outputs[index].shape


def prod(values) -> int:
    """The exact product of `values` (no int64 wrap-around)."""
    return math.prod(int(v) for v in values)
