#!/usr/bin/env python3
"""Benchmark quantized models: does int8 pay in farm, against farm's own float32 and onnxruntime's int8?

Each model (`--models`, built-in ones of bench_build) is quantized here by onnxruntime's own quantizers, as users
quantize: `static` (QDQ: QuantizeLinear/DequantizeLinear pairs around Conv, MatMul and Gemm, uint8 activations and
int8 weights, per-channel weights, calibrated on 8 seeded inputs) or `dynamic` (DynamicQuantizeLinear and
MatMulInteger, uint8 weights, as for transformers). farm builds the float32 model and the quantized one for this
host; then four engines, each in a process of its own taking turns (benchmarks/engine_process.py), time them on
`--threads` threads (0: each engine's default): farm float32, farm int8, onnxruntime float32 and onnxruntime int8.
The table gives each latency, farm int8 against farm float32 and against onnxruntime's int8, and how far farm's
int8 outputs are from onnxruntime's (in units of the largest output's magnitude: the two quantize alike but
onnxruntime's u8s8 kernels may saturate without VNNI, so this is a sanity check, not an exactness check).

Bars (issue 32): the statically quantized resnet18_style faster than farm's float32 resnet18_style and <= 1.0x
onnxruntime's int8; the dynamically quantized bert_style <= 1.25x onnxruntime's int8.

Usage: python3 benchmarks/bench_int8.py [--models resnet18_style:static,bert_style:dynamic] [--rounds N]
                                        [--threads N] [--json out.json] [--no-fail]
Exit status: 0 when every bar passes (or --no-fail), 1 when one fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from bench_build import ALL_MODELS, feeds_for, machine_info, model_path
from engine_process import EngineProcess, alternating_latency, save_feeds
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from report import markdown_table

from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.tools.examples import random_input

DEFAULT_MODELS = "resnet18_style:static,bert_style:dynamic"
CALIBRATION_INPUTS = 8
ROUND_SECONDS = 0.25
STATIC_BAR_OVER_ORT = 1.0
DYNAMIC_BAR_OVER_ORT = 1.25


class SeededInputs(CalibrationDataReader):
    """CALIBRATION_INPUTS seeded standard-normal inputs of the model, for quantize_static's calibration."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.feeds = iter([random_input(model, seed=seed) for seed in range(1, CALIBRATION_INPUTS + 1)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.feeds, None)


def quantized(path: Path, how: str, folder: Path) -> Path:
    """The model at `path` quantized by onnxruntime (`static`: QDQ, u8 activations, s8 per-channel weights, after
    onnxruntime's pre-processing, as its documentation asks (its quantizer warns without it): BatchNormalization
    folds into the Conv before it, as a torch export folds it; `dynamic`: DynamicQuantizeLinear + MatMulInteger,
    u8 weights)."""
    out = folder / f"{path.stem}_{how}_int8.onnx"
    if how == "static":
        prepared = folder / f"{path.stem}_prepared.onnx"
        quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out),
            SeededInputs(onnx.load(str(prepared))),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
    else:
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QUInt8)
    return out


def bench_model(name: str, how: str, folder: Path, executor: LocalExecutor, rounds: int, threads: int) -> dict:
    """Build the float32 and quantized models, then time the four engines taking turns."""
    float_path = model_path(name, folder)
    int8_path = quantized(float_path, how, folder)
    feeds = save_feeds(feeds_for(float_path), folder / f"{name}-feeds.npz")
    artifacts = {
        label: build_model(path, folder / label, executor=executor).artifact
        for label, path in (("float32", float_path), ("int8", int8_path))
    }
    settings = {
        "farm_float32": ("farm", artifacts["float32"]),
        "farm_int8": ("farm", artifacts["int8"]),
        "ort_float32": ("ort", float_path),
        "ort_int8": ("ort", int8_path),
    }
    with contextlib.ExitStack() as stack:
        engines = {
            label: stack.enter_context(EngineProcess(engine, model, feeds, threads, folder / "cache"))
            for label, (engine, model) in settings.items()
        }
        ours = engines["farm_int8"].outputs(folder / "farm.npz")
        reference = engines["ort_int8"].outputs(folder / "ort.npz")
        runs = max(1, int(ROUND_SECONDS / max(engines["farm_int8"].seconds(1), 1e-6)))
        seconds = alternating_latency(engines, rounds, runs)
    scale = max(float(np.max(np.abs(value))) for value in reference.values()) or 1.0
    difference = max(float(np.max(np.abs(ours[key] - reference[key]))) for key in reference) / scale
    return {
        "name": name,
        "quantization": how,
        **seconds,
        "int8_over_float32": seconds["farm_int8"] / seconds["farm_float32"],
        "int8_over_ort_int8": seconds["farm_int8"] / seconds["ort_int8"],
        "difference_over_scale": difference,
    }


def bars(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's int8 bars, on the models measured."""
    found = {(r["name"], r["quantization"]): r for r in results}
    static, dynamic = found.get(("resnet18_style", "static")), found.get(("bert_style", "dynamic"))
    return [
        {
            "bar": "static resnet18_style: farm int8 / farm float32",
            "limit": "< 1.0x",
            "measured": f"{static['int8_over_float32']:.2f}x" if static else "not selected",
            "passed": static["int8_over_float32"] < 1.0 if static else None,
        },
        {
            "bar": "static resnet18_style: farm int8 / onnxruntime int8",
            "limit": f"<= {STATIC_BAR_OVER_ORT}x",
            "measured": f"{static['int8_over_ort_int8']:.2f}x" if static else "not selected",
            "passed": static["int8_over_ort_int8"] <= STATIC_BAR_OVER_ORT if static else None,
        },
        {
            "bar": "dynamic bert_style: farm int8 / onnxruntime int8",
            "limit": f"<= {DYNAMIC_BAR_OVER_ORT}x",
            "measured": f"{dynamic['int8_over_ort_int8']:.2f}x" if dynamic else "not selected",
            "passed": dynamic["int8_over_ort_int8"] <= DYNAMIC_BAR_OVER_ORT if dynamic else None,
        },
    ]


def report(results: Sequence[dict[str, Any]], verdicts: Sequence[dict[str, Any]]) -> str:
    models = markdown_table(
        [
            "model",
            "quantization",
            "farm fp32 ms",
            "farm int8 ms",
            "ort fp32 ms",
            "ort int8 ms",
            "farm int8 / farm fp32",
            "farm int8 / ort int8",
            "int8 diff / scale",
        ],
        [
            [
                r["name"],
                r["quantization"],
                f"{r['farm_float32'] * 1e3:.3f}",
                f"{r['farm_int8'] * 1e3:.3f}",
                f"{r['ort_float32'] * 1e3:.3f}",
                f"{r['ort_int8'] * 1e3:.3f}",
                f"{r['int8_over_float32']:.2f}",
                f"{r['int8_over_ort_int8']:.2f}",
                f"{r['difference_over_scale']:.1e}",
            ]
            for r in results
        ],
    )
    table = markdown_table(
        ["bar", "measured", "limit", "result"],
        [
            [b["bar"], b["measured"], b["limit"], {True: "PASS", False: "FAIL", None: "n/a"}[b["passed"]]]
            for b in verdicts
        ],
    )
    return f"{models}\n\n{table}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=DEFAULT_MODELS, help=f"NAME:static|dynamic, comma-separated ({DEFAULT_MODELS})"
    )
    parser.add_argument("--rounds", type=int, default=15, help="rounds of turns per model (default 15)")
    parser.add_argument("--threads", type=int, default=0, help="threads per engine; 0: each engine's default")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    pairs = [item.strip().partition(":") for item in args.models.split(",") if item.strip()]
    bad = [f"{name}:{how}" for name, _, how in pairs if name not in ALL_MODELS or how not in ("static", "dynamic")]
    if bad or not pairs:
        parser.error(f"--models: expected NAME:static or NAME:dynamic with NAME one of {', '.join(ALL_MODELS)}: {bad}")
    if args.rounds < 1 or args.threads < 0:
        parser.error("--rounds must be >= 1 and --threads >= 0")
    args.models = [(name, how) for name, _, how in pairs]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="farm-int8-") as tmp, LocalExecutor() as executor:
        for name, how in args.models:
            results.append(bench_model(name, how, Path(tmp), executor, args.rounds, args.threads))
            r = results[-1]
            print(
                f"  {name} ({how}): farm int8 {r['farm_int8'] * 1e3:.3f} ms, farm fp32 {r['farm_float32'] * 1e3:.3f} "
                f"ms, ort int8 {r['ort_int8'] * 1e3:.3f} ms",
                flush=True,
            )
        workers = executor.workers
    verdicts = bars(results)
    machine = machine_info(workers)
    print(
        f"\nmachine: {json.dumps(machine)}, threads per engine: {args.threads or 'default'}\n\n{report(results, verdicts)}"
    )
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "models": results, "bars": verdicts}, indent=2) + "\n")
    failed = any(b["passed"] is False for b in verdicts)
    return 1 if failed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
