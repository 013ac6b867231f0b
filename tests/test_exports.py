"""Real torch.onnx exports (issue 15): tiny torchvision and transformers models, static and with dynamic dimensions,
built by farm and compared with onnxruntime.

The .onnx files under tests/exports/ were written once by scripts/export_test_models.py (its docstring says with
which torch, torchvision and transformers), so torch stays out of the test install. The static exports build as
they are; the dynamic ones (dim_params `batch`, `seq`) build with `--shape` pins at sizes other than the ones they
were traced at, so that a size baked into the graph by the trace shows up as a wrong shape or value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from numerics import RELATIVE_TOLERANCE, compare_outputs, run_onnxruntime, scaled_error

import farm.runtime
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.ir.shapes import parse_sizes

EXPORTS = Path(__file__).parent / "exports"
VOCAB = 1000
"""The vocabulary size of the text models (scripts/export_test_models.py): token ids are drawn below it."""
MAX_EXPORTS_BYTES = 8 * 1024 * 1024
"""The committed exports stay small: the repository carries them."""
PADDING = 3
"""How many trailing positions of every attention mask are padding (0), so that masking has an effect."""


@dataclass(frozen=True)
class Export:
    """One committed export and the `--shape` pins it is built with (none for a static one)."""

    name: str
    pins: tuple[str, ...] = ()


EXPORT_CASES = [
    Export("mobilenet_v2_static"),
    Export("mobilenet_v2_dynamic", ("batch=3",)),
    Export("mobilenet_v3_static"),
    Export("mobilenet_v3_dynamic", ("batch=3",)),
    Export("bert_static"),
    Export("bert_dynamic", ("batch=3", "seq=12")),
    Export("gpt2_static"),
    Export("gpt2_dynamic", ("batch=3", "seq=12")),
    Export("vit_static"),
    Export("vit_dynamic", ("batch=3",)),
]


def feeds_for(model: farm.runtime.Model, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs at the built model's shapes: token ids below VOCAB, masks of ones ending in PADDING zeros,
    standard-normal images."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in model.inputs:
        shape = tuple(spec.shape)
        if spec.name == "input_ids":
            feeds[spec.name] = rng.integers(0, VOCAB, shape, dtype=np.int64)
        elif spec.name == "attention_mask":
            mask = np.ones(shape, dtype=np.int64)
            mask[:, -PADDING:] = 0
            feeds[spec.name] = mask
        else:
            feeds[spec.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def declared_shapes(path: Path, pins: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The export's input shapes with every dim_param replaced by its pinned size."""
    graph = onnx.load(path, load_external_data=False).graph
    return {
        value.name: tuple(
            pins[dim.dim_param][0] if dim.dim_param else dim.dim_value for dim in value.type.tensor_type.shape.dim
        )
        for value in graph.input
    }


def assert_close_to_own_scale(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Every output within RELATIVE_TOLERANCE of its own largest value: the project's tolerance has an absolute floor
    of 1e-4, which a small output (logits ~0.01) would pass whatever its values."""
    for name, reference in expected.items():
        scale = float(np.abs(reference).max())
        assert scale > 0, f"output {name!r} is all zero: it carries no signal to compare"
        error = scaled_error(actual[name] / scale, reference / scale)
        assert error <= RELATIVE_TOLERANCE, f"output {name!r}: error {error:.3e} of its scale {scale:.3g}"


def check_export(case: Export, tmp_path: Path, fingerprint: str | None = None) -> None:
    """Build `case` (for this host's CPU, or for the OpenCL device `fingerprint`), check its pinned input shapes,
    run it on random inputs and compare with onnxruntime on the export itself."""
    path = EXPORTS / f"{case.name}.onnx"
    shapes = parse_sizes(case.pins)[0] if case.pins else None
    targets = [OpenClTarget(fingerprint)] if fingerprint else []
    result = build_model(path, tmp_path, targets, executor=LocalExecutor(1), sizes=[shapes] if shapes else [])
    model = farm.runtime.load(result.artifact, device="opencl" if fingerprint else "cpu", cache_dir=tmp_path / "cache")
    assert {spec.name: tuple(spec.shape) for spec in model.inputs} == declared_shapes(path, shapes or {})
    feeds = feeds_for(model)
    expected = run_onnxruntime(path, feeds)
    actual = model.run(feeds)
    compare_outputs(actual, expected, case.name)
    assert_close_to_own_scale(actual, expected)


@pytest.mark.parametrize("case", EXPORT_CASES, ids=[case.name for case in EXPORT_CASES])
def test_an_export_built_by_farm_matches_onnxruntime(case: Export, tmp_path: Path) -> None:
    check_export(case, tmp_path)


def test_a_dynamic_export_matches_onnxruntime_on_opencl(fingerprint: str, tmp_path: Path) -> None:
    """One export on OpenCL (PoCL here): the cheapest to build there (~7 s); every one of them passes on PoCL, but
    together they take two minutes."""
    check_export(next(case for case in EXPORT_CASES if case.name == "gpt2_dynamic"), tmp_path, fingerprint)


def test_a_dynamic_export_of_several_sizes_matches_onnxruntime_at_each(tmp_path: Path) -> None:
    """`--shape batch=1,3 --shape seq=12`: one artifact of two sizes (the weights shared), each size run through the
    one loaded model by feeds of its shapes and compared with onnxruntime on the export."""
    path = EXPORTS / "bert_dynamic.onnx"
    result = build_model(path, tmp_path, executor=LocalExecutor(1), sizes=parse_sizes(("batch=1,3", "seq=12")))
    model = farm.runtime.load(result.artifact, cache_dir=tmp_path / "cache")
    assert [pins for pins, _ in model.sizes] == [{"batch": (1,), "seq": (12,)}, {"batch": (3,), "seq": (12,)}]
    for _, size in model.sizes:
        feeds = feeds_for(size)
        expected = run_onnxruntime(path, feeds)
        actual = model.run(feeds)
        compare_outputs(actual, expected, "bert_dynamic")
        assert_close_to_own_scale(actual, expected)


def test_every_committed_export_is_tested_and_they_stay_small() -> None:
    on_disk = sorted(path.stem for path in EXPORTS.glob("*.onnx"))
    assert on_disk == sorted(case.name for case in EXPORT_CASES)
    total = sum(path.stat().st_size for path in EXPORTS.glob("*.onnx"))
    assert total <= MAX_EXPORTS_BYTES, f"tests/exports holds {total / 1e6:.1f} MB"


@pytest.mark.parametrize("case", [case for case in EXPORT_CASES if case.pins], ids=lambda case: case.name)
def test_a_dynamic_export_keeps_the_dimension_names_its_pins_use(case: Export) -> None:
    """The pins name the exporter's dim_params: a re-export that renamed them (s0, s1) would fail to build, not pass
    a static test by accident."""
    graph = onnx.load(EXPORTS / f"{case.name}.onnx", load_external_data=False).graph
    names = {dim.dim_param for value in graph.input for dim in value.type.tensor_type.shape.dim if dim.dim_param}
    assert names == {pin.partition("=")[0] for pin in case.pins}
