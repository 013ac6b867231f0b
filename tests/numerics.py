"""Numerical test helpers: build ONNX models with onnx.helper, compile them with farm and compare with onnxruntime.

Tolerance everywhere: max |farm - reference| <= 1e-4 * max(1, max |reference|), reference = onnxruntime on the CPU
provider (or a stored reference output). A case whose reference is a function of the feeds (`OpCase.reference`:
ONNX's reference evaluator, as a rule) is compared with that instead: where onnxruntime has no kernel, and where its
answer depends on the CPU it runs on. Every op that sums integer products (MatMulInteger, ConvInteger, QLinearMatMul,
QLinearConv, QDQ models) is such a case: the sums are exact in the reference, while onnxruntime's uint8 x int8
kernels saturate 16-bit pair sums on x86 CPUs without VNNI (tests/test_ops_quantize.py, issue 28). A reference
must not depend on the host: a test passes or fails alike on every CPU that runs farm's code. Case tables in the
test_ops_* files are lists of `OpCase`, so that test_ops_registry can check that every op in farm.ops.SUPPORTED_OPS
has a case.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.typing import DTypeLike
from onnx import TensorProto, helper, numpy_helper

import farm.runtime
from farm.artifact import read_manifest
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import BuildResult, build_model

RELATIVE_TOLERANCE = 1e-4
OPSET = 17
IR_VERSION = 8

Shape = Sequence[int]
# A graph input of any dtype: (name, shape, dtype), dtype anything np.dtype accepts ("int64", np.bool_, ...).
TypedInput = tuple[str, Shape, DTypeLike]
# A graph input of graph_model and single_op_model: (name, shape) for float32, or a TypedInput.
GraphInput = tuple[str, Shape] | TypedInput
# A reference for a model that onnxruntime refuses or answers per CPU: feeds -> outputs by name.
Reference = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


# ------------------------------------------------------------------------------------------------ comparisons


def scaled_error(actual: np.ndarray, reference: np.ndarray) -> float:
    """max |actual - reference| / max(1, max |reference|): what must stay <= RELATIVE_TOLERANCE."""
    reference = np.asarray(reference, dtype=np.float64)
    actual = np.asarray(actual, dtype=np.float64)
    if reference.size == 0:
        return 0.0
    scale = max(1.0, float(np.abs(reference).max()))
    return float(np.abs(actual - reference).max()) / scale


def assert_close(actual: np.ndarray, reference: np.ndarray, what: str = "output") -> None:
    """Same shape and dtype; integers and booleans equal (the references' integer arithmetic is exact, so a
    tolerance scaled by the largest value would let a sum of products off by a few pass); floats finite where the
    reference is, and within the tolerance."""
    actual, reference = np.asarray(actual), np.asarray(reference)
    assert actual.shape == reference.shape, f"{what}: shape {actual.shape}, reference {reference.shape}"
    assert actual.dtype == reference.dtype, f"{what}: dtype {actual.dtype}, reference {reference.dtype}"
    if not np.issubdtype(reference.dtype, np.inexact):
        np.testing.assert_array_equal(actual, reference, err_msg=what)
        return
    finite = np.isfinite(reference)
    assert np.array_equal(np.isfinite(actual), finite), f"{what}: non-finite values differ from the reference"
    error = scaled_error(actual[finite], reference[finite])
    if not error <= RELATIVE_TOLERANCE:
        worst = np.unravel_index(int(np.argmax(np.abs(actual.astype(np.float64) - reference))), reference.shape)
        raise AssertionError(
            f"{what}: scaled max error {error:.3e} > {RELATIVE_TOLERANCE:g} (max |ref| "
            f"{float(np.abs(reference).max()):.3g}); worst at {tuple(int(i) for i in worst)}: farm "
            f"{actual[worst]!r}, reference {reference[worst]!r}"
        )


# --------------------------------------------------------------------------------------------------- models


def _input_info(graph_input: GraphInput) -> onnx.ValueInfoProto:
    name, shape, *dtype = graph_input
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype[0] if dtype else np.float32))
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def graph_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[GraphInput],
    outputs: Sequence[str] = ("y",),
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """A model of `nodes` with graph inputs `inputs`, initializers, and graph outputs `outputs`.

    Each graph input is (name, shape), a float32 tensor, or (name, shape, dtype), where dtype is anything
    `np.dtype` accepts ("int64", np.int64, np.bool_, an array's .dtype); for an ONNX TensorProto element type, pass
    `helper.tensor_dtype_to_np_dtype(t)`. The outputs are declared untyped and unshaped: strict shape inference
    gives them their element type and shape, then the intermediate value_info is dropped."""
    graph = helper.make_graph(
        list(nodes),
        "g",
        [_input_info(graph_input) for graph_input in inputs],
        [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), name) for name, a in (initializers or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)
    # Strict shape inference types the outputs and rejects a malformed case before anything is built.
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    del model.graph.value_info[:]
    onnx.checker.check_model(model)
    return model


def single_op_model(
    op: str,
    inputs: Sequence[GraphInput],
    attrs: Mapping[str, object] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = OPSET,
    *,
    node_inputs: Sequence[str] | None = None,
    outputs: Sequence[str] = ("y",),
) -> onnx.ModelProto:
    """One `op` node reading the graph inputs then the initializers, in order (or `node_inputs`, where "" marks an
    absent optional input), and writing the graph output(s) `outputs`. Graph inputs as in `graph_model`: (name,
    shape) for float32, (name, shape, dtype) for any other dtype."""
    names = list(node_inputs) if node_inputs is not None else [i[0] for i in inputs] + list(initializers or {})
    node = helper.make_node(op, names, list(outputs), name=f"{op.lower()}_0", **dict(attrs or {}))
    return graph_model([node], inputs, outputs, initializers, opset)


def rand(*shape: int, seed: int = 0, scale: float = 1.0, positive: bool = False) -> np.ndarray:
    """Deterministic float32 data: standard normal times `scale`, or uniform in [0.5, 1.5) * scale if `positive`."""
    rng = np.random.default_rng(seed)
    data = rng.uniform(0.5, 1.5, shape) if positive else rng.standard_normal(shape)
    return np.asarray(data * scale, dtype=np.float32)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal float32 arrays for every graph input that is not an initializer (rank 0 included)."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        feeds[value.name] = np.asarray(rng.standard_normal(shape), dtype=dtype)
    return feeds


# ------------------------------------------------------------------------------------------ build and compare


def run_onnxruntime(
    model_path: str | os.PathLike, feeds: Mapping[str, np.ndarray], *, optimized: bool = True
) -> dict[str, np.ndarray]:
    """onnxruntime's outputs on the CPU provider. `optimized=False` turns its graph optimisations off, so a QDQ
    model's DequantizeLinear, float op and QuantizeLinear run as written, not fused into its integer kernels (whose
    uint8 x int8 pair sums saturate on x86 CPUs without VNNI): the spec's answer on every CPU up to the float sums'
    order."""
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the light models carry unused initializers that ORT warns about
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(os.fspath(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(feeds))))


def build_and_load(
    model_path: str | os.PathLike, out_dir: str | os.PathLike, executor: LocalExecutor | None = None
) -> tuple[BuildResult, farm.runtime.Model]:
    """Build `model_path` into `out_dir` (in-process by default) and load it with a cache inside `out_dir`."""
    result = build_model(model_path, out_dir, executor=executor if executor is not None else LocalExecutor(1))
    return result, farm.runtime.load(result.artifact, cache_dir=Path(out_dir) / "cache")


def compare_outputs(actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], what: str = "") -> None:
    assert sorted(actual) == sorted(expected), f"{what} outputs {sorted(actual)}, reference {sorted(expected)}"
    for name, reference in expected.items():
        assert_close(actual[name], reference, f"{what} output {name!r}".strip())


def assert_matches_onnxruntime(
    model: onnx.ModelProto,
    tmp_path: str | os.PathLike,
    feeds: Mapping[str, np.ndarray] | None = None,
    executor: LocalExecutor | None = None,
    *,
    name: str = "model",
    reference: Reference | None = None,
) -> BuildResult:
    """Save `model` under tmp_path, build and load it with farm, run it on `feeds` (default: random_feeds seed 0)
    and compare every output with onnxruntime's (or, where onnxruntime refuses a valid model or answers per CPU,
    with `reference`, a function of the feeds). Returns the BuildResult (its artifact stays under tmp_path)."""
    tmp_path = Path(tmp_path)
    tmp_path.mkdir(parents=True, exist_ok=True)
    model_path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(model_path))
    result, farm_model = build_and_load(model_path, tmp_path / "out", executor)
    feeds = dict(feeds) if feeds is not None else random_feeds(model)
    assert [spec.name for spec in farm_model.outputs] == [o.name for o in model.graph.output]
    expected = dict(reference(feeds)) if reference is not None else run_onnxruntime(model_path, feeds)
    compare_outputs(farm_model.run(feeds), expected)
    return result


def scheduled_ops(result: BuildResult) -> list[str]:
    """The op of every kernel call in the artifact's schedule, in order."""
    return [step["op"] for step in read_manifest(result.artifact)["schedule"]]


# ---------------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class OpCase:
    """One parametrized case: a model, optional feeds, optionally the ops the schedule must hold afterwards (to
    check that a pass fused or kept what it should) and a reference function to use instead of onnxruntime (where
    it refuses the model or its answer depends on the CPU)."""

    id: str
    model: onnx.ModelProto
    feeds: Mapping[str, np.ndarray] | None = None
    schedule: tuple[str, ...] | None = None
    reference: Reference | None = None  # instead of onnxruntime, where it refuses the model or answers per CPU


def case(
    id: str,
    model: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray] | None = None,
    schedule: Sequence[str] | None = None,
    reference: Reference | None = None,
) -> OpCase:
    return OpCase(id, model, feeds, tuple(schedule) if schedule is not None else None, reference)


def params(cases: Iterable[OpCase]) -> list:
    cases = list(cases)
    ids = [c.id for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    assert not duplicates, f"duplicate case ids {duplicates}"
    return [pytest.param(c, id=c.id) for c in cases]


def ops_of(cases: Iterable[OpCase]) -> set[str]:
    """The op types the cases' models use."""
    return {node.op_type for c in cases for node in c.model.graph.node}


def check_case_on_opencl(c: OpCase, fingerprint: str, tmp_path: Path) -> None:
    """Build `c` with an OpenCL part for `fingerprint`, run it on that device and compare with onnxruntime (or the
    case's reference)."""
    path = tmp_path / "model.onnx"
    onnx.save(c.model, path)
    artifact = build_model(path, tmp_path, [OpenClTarget(fingerprint)], executor=LocalExecutor(1)).artifact
    model = farm.runtime.load(artifact, device="opencl", cache_dir=tmp_path / "cache")
    feeds = dict(c.feeds) if c.feeds is not None else random_feeds(c.model)
    expected = c.reference(feeds) if c.reference is not None else run_onnxruntime(path, feeds)
    compare_outputs(model.run(feeds), expected, "opencl")


def check_case(c: OpCase, tmp_path: str | os.PathLike) -> BuildResult:
    result = assert_matches_onnxruntime(c.model, tmp_path, c.feeds, name=c.id.replace("/", "_"), reference=c.reference)
    if c.schedule is not None:
        assert tuple(scheduled_ops(result)) == c.schedule
    return result


def hostile_op_model(
    op: str,
    attrs: Mapping[str, object] | None = None,
    initializers: Mapping[str, np.ndarray] | None = None,
    x: Sequence[int] | None = (1, 2, 4, 4),
    opset: int = OPSET,
    outputs: Sequence[str] = ("y",),
) -> onnx.ModelProto:
    """One `op` node named "victim" reading graph input x (float32, omitted when `x` is None) then the initializers
    and writing `outputs`, with no shape inference or checker run: a hostile model as an attacker writes it (issue
    13)."""
    inputs = [] if x is None else [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))]
    names = [i.name for i in inputs] + list(initializers or {})
    node = helper.make_node(op, names, list(outputs), name="victim", **dict(attrs or {}))
    graph = helper.make_graph(
        [node],
        "hostile",
        inputs,
        [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(a), name) for name, a in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION)


def assert_unsupported(model: onnx.ModelProto, message: str, folder: str | os.PathLike) -> None:
    """plan_model refuses `model` with an UnsupportedError matching `message` (a variant farm doesn't build)."""
    from farm.build.assembly import plan_model
    from farm.errors import UnsupportedError

    path = Path(folder) / "unsupported.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedError, match=message):
        plan_model(path)


def assert_refused(model: onnx.ModelProto, message: str, folder: str | os.PathLike) -> None:
    """plan_model refuses `model` with one line that names the node "victim" and matches `message`."""
    from farm.build.assembly import plan_model
    from farm.errors import UnsupportedError

    path = Path(folder) / "hostile.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedError, match=message) as refusal:
        plan_model(path)
    assert "victim" in str(refusal.value) and "\n" not in str(refusal.value)
