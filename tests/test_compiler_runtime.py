"""farm.backends.llvm.compiler_runtime: float16 conversions give the same bits on every target, numpy's bits.

One model casts float16 -> float32, float32 -> float16 and float64 -> float16; one artifact holds it for this host
(F16C's instructions for float, farm's __truncdfhf2 for double unless the CPU has AVX512-FP16), for baseline x86-64
(each conversion a call to farm's definitions, run natively), for AArch64 (FCVT instructions, under qemu) and for
riscv64 rv64gc (farm's definitions, under qemu). Each is fed every float16, and float32 and float64 values at every
float16 boundary: each float16, each midpoint between neighbours and the value one ulp either side of it (where a
double rounded through float32 would land on the tie), the overflow threshold, subnormals, zeros, infinities, NaNs
with their payloads, and random bit patterns. Outputs must equal numpy's conversion bit for bit; a NaN must equal
what x86 and AArch64 instructions give (numpy leaves a signalling NaN signalling): quiet, with its sign and its
payload's top bits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import farm.runtime
from farm.backends.llvm.target import host_target, parse_target
from farm.build.executor import LocalExecutor
from farm.build.local import build_model

TARGETS = {
    "this host": "cpu",
    "x86-64 baseline": "cpu:x86_64-linux-gnu",
    "aarch64": "cpu:aarch64-linux-gnu",
    "riscv64": "cpu:riscv64-linux-gnu",
}
RANDOM_PATTERNS = 1 << 20
QUIET_BIT = {np.float16: 0x200, np.float32: 0x400000}


def finite_halves() -> np.ndarray:
    """Every non-negative finite float16, in order, as float64."""
    return np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)


def around_boundaries(dtype: type) -> np.ndarray:
    """Each float16, each midpoint between neighbours (the last one, 65520, is where values overflow), the values
    one ulp of `dtype` either side of each midpoint, all of them with both signs."""
    halves = finite_halves()
    midpoints = (halves + np.append(halves[1:], 65536.0)) / 2  # exact: a float16 has 11 significant bits
    midpoints = midpoints.astype(dtype)
    values = np.concatenate(
        [halves.astype(dtype), midpoints, np.nextafter(midpoints, dtype(np.inf)), np.nextafter(midpoints, dtype(0))]
    )
    return np.concatenate([values, -values])


def special_bits(dtype: type) -> np.ndarray:
    """Zeros, the smallest subnormal and largest finite values, infinities, and NaNs of both signs, quiet and
    signalling, with payloads in the top bits (which a float16 keeps) and the low ones (which it loses)."""
    info, uint = np.finfo(dtype), np.dtype(dtype).str.replace("f", "u")
    exponent = np.array(np.inf, dtype).view(uint)
    top = exponent >> np.array(1, uint) & ~exponent  # the quiet bit
    payloads = [top, top >> np.array(1, uint), np.array(1, uint), top | np.array(1, uint), top - np.array(1, uint)]
    nans = [exponent | payload for payload in payloads]
    values = np.array([0.0, info.smallest_subnormal, info.max, np.inf], dtype).view(uint)
    positive = np.concatenate([values, np.array(nans, uint)])
    return np.concatenate([positive, positive | (np.array(1, uint) << np.array(info.bits - 1, uint))])


def random_bits(dtype: type, rng: np.random.Generator) -> np.ndarray:
    """Random bit patterns: half of them anywhere, half with an exponent around float16's range (2**-26 to 2**17)."""
    uint, bits = np.dtype(dtype).str.replace("f", "u"), np.finfo(dtype).bits
    fraction = np.finfo(dtype).nmant
    anywhere = rng.integers(0, 1 << bits, RANDOM_PATTERNS // 2, dtype=np.uint64, endpoint=False).astype(uint)
    bias = np.finfo(dtype).maxexp - 1
    exponents = rng.integers(bias - 26, bias + 17, RANDOM_PATTERNS // 2, dtype=np.uint64)
    fractions = rng.integers(0, 1 << fraction, RANDOM_PATTERNS // 2, dtype=np.uint64)
    signs = rng.integers(0, 2, RANDOM_PATTERNS // 2, dtype=np.uint64) << np.uint64(bits - 1)
    return np.concatenate([anywhere, (signs | exponents << np.uint64(fraction) | fractions).astype(uint)])


def wide_inputs(dtype: type) -> np.ndarray:
    rng = np.random.default_rng(28)
    return np.concatenate(
        [around_boundaries(dtype), special_bits(dtype).view(dtype), random_bits(dtype, rng).view(dtype)]
    )


def expected(values: np.ndarray, to: type) -> np.ndarray:
    """numpy's conversion of `values`; a NaN quiet, of its sign, with the top bits of its payload."""
    with np.errstate(over="ignore"):
        converted = values.astype(to)
    source_bits, fraction = np.finfo(values.dtype).nmant, np.finfo(to).nmant
    uint, wide = np.dtype(to).str.replace("f", "u"), values.view(values.dtype.str.replace("f", "u")).astype(np.uint64)
    sign = (wide >> np.uint64(8 * values.dtype.itemsize - 1)) << np.uint64(8 * np.dtype(to).itemsize - 1)
    exponent = np.array(np.inf, to).view(uint).astype(np.uint64)
    payload = (
        (wide & np.uint64((1 << source_bits) - 1)) >> np.uint64(source_bits - fraction)
        if source_bits > fraction
        else (wide & np.uint64((1 << source_bits) - 1)) << np.uint64(fraction - source_bits)
    )
    nan = (sign | exponent | payload | np.uint64(QUIET_BIT[to])).astype(uint)
    return np.where(np.isnan(values), nan, converted.view(uint))


INPUTS = {
    "half": np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16),
    "float": wide_inputs(np.float32),
    "double": wide_inputs(np.float64),
}
CASTS = {
    "half": ("as_float", np.float32),
    "float": ("float_as_half", np.float16),
    "double": ("double_as_half", np.float16),
}
ONNX_TYPES = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def conversions_model() -> onnx.ModelProto:
    """Cast of each input to CASTS' type."""
    nodes = [helper.make_node("Cast", [name], [output], to=ONNX_TYPES[to]) for name, (output, to) in CASTS.items()]
    inputs = [
        helper.make_tensor_value_info(name, ONNX_TYPES[INPUTS[name].dtype.type], [INPUTS[name].size]) for name in CASTS
    ]
    outputs = [
        helper.make_tensor_value_info(output, ONNX_TYPES[to], [INPUTS[name].size])
        for name, (output, to) in CASTS.items()
    ]
    return helper.make_model(
        helper.make_graph(nodes, "conversions", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=8,
    )


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("conversions")
    onnx.save(conversions_model(), folder / "conversions.onnx")
    targets = [parse_target(spec) for spec in TARGETS.values()]
    with LocalExecutor(1) as in_this_process:  # 12 small kernels: starting a pool would take longer
        yield build_model(folder / "conversions.onnx", folder, targets, executor=in_this_process).artifact


def test_the_inputs_hold_doubles_that_rounding_through_float_gets_wrong() -> None:
    """Else the check of double -> half could not tell one rounding from two."""
    doubles = INPUTS["double"]
    with np.errstate(over="ignore", invalid="ignore"):
        twice = doubles.astype(np.float32).astype(np.float16)
    assert np.count_nonzero(twice.view(np.uint16) != expected(doubles, np.float16)) > 10_000


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_conversions_give_numpys_bits(name: str, artifact: str, tmp_path: Path) -> None:
    wanted = TARGETS[name] if name != "this host" else host_target().id
    outputs = farm.runtime.load(artifact, target=wanted, cache_dir=tmp_path, threads=1).run(INPUTS)
    for source, (output, to) in CASTS.items():
        got, want = outputs[output].view(f"u{np.dtype(to).itemsize}"), expected(INPUTS[source], to)
        wrong = np.flatnonzero(got != want)
        shown = ", ".join(
            f"{INPUTS[source][i]!r} ({INPUTS[source][i : i + 1].view(f'u{INPUTS[source].itemsize}')[0]:#x}) "
            f"-> {got[i]:#x}, not {want[i]:#x}"
            for i in wrong[:5]
        )
        assert wrong.size == 0, f"{source} -> {np.dtype(to)} on {name}: {wrong.size} wrong, e.g. {shown}"
