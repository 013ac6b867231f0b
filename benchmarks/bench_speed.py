#!/usr/bin/env python3
"""Benchmark farm's inference speed against onnxruntime and the machine's fp32 peak, in one run (issue 6's bars).

For every test model (the examples of `farm.tools.examples` and the nine light models shipped with the onnx package,
picked with --models) and every ONNX file given with --onnx (torch.onnx exports of real architectures, see
scripts/export_models.py) it builds the artifact for this host and measures, interleaved round by round so that a
busy moment hits every side alike, two like-for-like pairs: farm and onnxruntime each with its default threads
(farm: every CPU; onnxruntime: its default session options), and farm and onnxruntime each on ONE thread
(onnxruntime with intra_op_num_threads = inter_op_num_threads = 1). Each figure is the median over rounds of the
mean of a round's runs. The one-thread ratio divides farm's one-thread time by onnxruntime's one-thread time:
dividing it by onnxruntime's multi-threaded time would charge farm for the cores it was told not to use.

Feeds: the built-in models get seeded standard-normal inputs (`farm.tools.examples.random_input`); an --onnx model
gets seeded standard-normal floats for float inputs, ones for an integer input whose name contains "mask" (an
attention mask), and integers in [0, 100) for other integer inputs (token ids valid for any vocabulary). Every
--onnx input must have static shapes. The largest difference between farm's one-thread outputs and onnxruntime's,
divided by the largest magnitude of onnxruntime's outputs, is reported per model as a sanity check.

It also measures this machine's fp32 peak: a JIT-compiled loop of independent fused multiply-adds on the widest
vector the CPU has (one core), times the cores; and the GFLOP/s of light ResNet-50's heaviest convolutions, each
timed on its own on one thread (`farm bench`'s step timing) against one core's peak.

Bars: light_resnet50 <= 1.5x onnxruntime; every model <= 2x onnxruntime.

Usage: python3 benchmarks/bench_speed.py [--models a,b] [--onnx PATH]... [--rounds N] [--json out.json] [--no-fail]
Without --onnx every built-in model is measured; with --onnx only the given files, plus the built-in models that
--models names. Bars apply to every measured model.
Exit status: 0 when every bar passes (or --no-fail), 1 when a bar fails, 2 on bad arguments (an unknown model, an
--onnx path that is missing or not a readable ONNX model, an input with a dynamic dimension, two models of one name).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np
import onnx
import onnxruntime as ort
from bench_build import ALL_MODELS, feeds_for, machine_info, model_names, model_path
from google.protobuf.message import DecodeError
from llvmlite import ir
from onnx import helper
from report import cell, markdown_table

from farm import runtime
from farm.backends.llvm.target import host_target, init_llvm
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.cli.bench import bench_artifact

RESNET50 = "light_resnet50"
RESNET50_BAR = 1.5
EVERY_MODEL_BAR = 2.0
PEAK_CHAINS = 12  # independent accumulators: enough to cover FMA latency x throughput on current cores
PEAK_ITERATIONS = 2_000_000
HEAVIEST_CONVS = 6
SETTLE_SECONDS = 0.1
# Each runner's turn in a round lasts about this long: long enough that the first runs after the pause (cold
# caches, a helper thread's wake-up from an idle CPU) weigh little in the mean.
ROUND_SECONDS = 0.25
TOKEN_LIMIT = 100  # integer inputs of --onnx models (token ids) are drawn below this: valid for any vocabulary
FEED_SEED = 0


@dataclass(frozen=True)
class Subject:
    """One model to measure: its name in the tables (the artifact's stem too) and its .onnx file."""

    name: str
    path: Path
    feeds: dict[str, np.ndarray]


def fma_peak_gflops() -> float:
    """One core's fp32 GFLOP/s on a loop of PEAK_CHAINS independent vector FMAs (best of 5)."""
    init_llvm()
    target = host_target()
    lanes = target.simd_floats
    vector = ir.VectorType(ir.FloatType(), lanes)
    module = ir.Module("peak")
    fma = ir.Function(module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{lanes}f32")
    fn = ir.Function(module, ir.FunctionType(ir.FloatType(), [ir.IntType(64)]), "peak")
    entry, loop, done = fn.append_basic_block("entry"), fn.append_basic_block("loop"), fn.append_basic_block("done")
    builder = ir.IRBuilder(entry)
    ones = ir.Constant(vector, [1.0] * lanes)
    scale = ir.Constant(vector, [0.999999] * lanes)
    builder.branch(loop)
    builder.position_at_end(loop)
    count = builder.phi(ir.IntType(64))
    accumulators = [builder.phi(vector) for _ in range(PEAK_CHAINS)]
    updated = [builder.call(fma, [acc, scale, ones]) for acc in accumulators]
    following = builder.add(count, ir.Constant(ir.IntType(64), 1))
    count.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    count.add_incoming(following, loop)
    for index, (acc, new) in enumerate(zip(accumulators, updated)):
        acc.add_incoming(ir.Constant(vector, [float(index)] * lanes), entry)
        acc.add_incoming(new, loop)
    builder.cbranch(builder.icmp_signed("<", following, fn.args[0]), loop, done)
    builder.position_at_end(done)
    total = updated[0]
    for new in updated[1:]:
        total = builder.fadd(total, new)
    builder.ret(builder.extract_element(total, ir.Constant(ir.IntType(32), 0)))
    # The engine owns the machine it is given: a fresh one, never the build's cached target.machine().
    machine = llvm.Target.from_triple(target.triple).create_target_machine(cpu=target.cpu, features=target.features,
                                                                           opt=3)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)), machine)
    engine.finalize_object()
    peak = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("peak"))
    best = min(_seconds(lambda: peak(PEAK_ITERATIONS)) for _ in range(5))
    return PEAK_ITERATIONS * PEAK_CHAINS * lanes * 2 / best / 1e9


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def interleaved_latency(runners: dict[str, Callable[[], object]], rounds: int, runs: int) -> dict[str, float]:
    """Median over `rounds` of each runner's mean seconds over `runs` calls; the runners take turns every round
    (after two warm-up calls each), with a pause of SETTLE_SECONDS before each turn: onnxruntime's pool threads
    spin for a while after a run, and without the pause they take a core from the next runner (measured:
    resnet18_style on two farm threads 3.67 ms alone, 4.49 ms right after onnxruntime's runs)."""
    for fn in runners.values():
        fn(), fn()
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, fn in runners.items():
            time.sleep(SETTLE_SECONDS)
            samples[name].append(_seconds(lambda call=fn: [call() for _ in range(runs)]) / runs)
    return {name: statistics.median(values) for name, values in samples.items()}


def static_inputs(model: onnx.ModelProto) -> list[tuple[str, np.dtype, list[int]]]:
    """(name, dtype, shape) of every graph input that is not an initializer; a dynamic dimension is a ValueError."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        dynamic = [dim.dim_param or "?" for dim in tensor_type.shape.dim if not dim.HasField("dim_value")]
        if dynamic or not tensor_type.HasField("shape"):
            raise ValueError(f"input {value.name!r} has a dynamic shape ({', '.join(dynamic) or 'no shape'}); "
                             "export with static shapes")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
        inputs.append((value.name, dtype, [dim.dim_value for dim in tensor_type.shape.dim]))
    return inputs


def onnx_feed(name: str, dtype: np.dtype, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    """An exported model's input: standard-normal floats; for integers, ones for an attention mask (a name holding
    "mask") and token ids in [0, TOKEN_LIMIT) otherwise, so that every Gather index is in range."""
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if "mask" in name.lower():
        return np.ones(shape, dtype)
    return rng.integers(0, TOKEN_LIMIT, shape).astype(dtype)


def onnx_feeds(path: Path) -> dict[str, np.ndarray]:
    """Seeded feeds for every input of the ONNX file at `path` (weights in external data are not read)."""
    rng = np.random.default_rng(FEED_SEED)
    model = onnx.load(str(path), load_external_data=False)
    if not model.graph.node:
        raise ValueError("the file holds no graph")
    return {name: onnx_feed(name, dtype, shape, rng) for name, dtype, shape in static_inputs(model)}


def relative_difference(ours: dict[str, np.ndarray], reference: Sequence[np.ndarray], names: Sequence[str]) -> float:
    """max |farm - onnxruntime| over every output, divided by the largest |onnxruntime output| (the output scale)."""
    diff = max(float(np.max(np.abs(ours[name].astype(np.float64) - np.asarray(ref, np.float64))))
               for name, ref in zip(names, reference))
    scale = max(float(np.max(np.abs(np.asarray(ref, np.float64)))) for ref in reference)
    return diff / scale if scale else diff


def one_thread_session_options() -> ort.SessionOptions:
    """onnxruntime pinned to one thread: one intra-op thread (the caller's) and one inter-op thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def bench_model(subject: Subject, folder: Path, executor: LocalExecutor, rounds: int) -> dict[str, Any]:
    """Build the model and time, interleaved, farm and onnxruntime at their default threads and both at one."""
    artifact = build_model(subject.path, folder / "out", executor=executor).artifact
    feeds = subject.feeds
    threaded = runtime.load(artifact, cache_dir=folder / "cache")
    single = runtime.load(artifact, cache_dir=folder / "cache", threads=1)
    session = ort.InferenceSession(str(subject.path), providers=["CPUExecutionProvider"])
    session_1 = ort.InferenceSession(str(subject.path), one_thread_session_options(),
                                     providers=["CPUExecutionProvider"])
    single_run = single.run(feeds)
    names = [output.name for output in session.get_outputs()]
    difference = relative_difference(single_run, session.run(names, feeds), names)
    runs = max(1, int(ROUND_SECONDS / max(_seconds(lambda: single.run(feeds)), 1e-6)))
    seconds = interleaved_latency({"farm": lambda: threaded.run(feeds), "ort": lambda: session.run(None, feeds),
                                   "farm_1": lambda: single.run(feeds), "ort_1": lambda: session_1.run(None, feeds)},
                                  rounds, runs)
    return {"name": subject.name, "artifact": artifact, "threads": threaded.threads, **seconds,
            "ratio": seconds["farm"] / seconds["ort"], "ratio_1": seconds["farm_1"] / seconds["ort_1"],
            "thread_speedup": seconds["farm_1"] / seconds["farm"], "relative_difference": difference,
            "outputs": list(single_run)}


def heaviest_convs(artifact: str, core_peak: float) -> list[dict[str, Any]]:
    """The convolutions taking most of one thread's time, with GFLOP/s and their share of one core's peak."""
    kernels = [row for row in bench_artifact(artifact, repeat=10, threads=1).kernels() if row["op"] == "Conv"]
    return [{**row, "of_peak": row["gflops"] / core_peak if row["gflops"] else None}
            for row in kernels[:HEAVIEST_CONVS]]


def bars(models: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """light ResNet-50 <= 1.5x onnxruntime; the worst model <= 2x."""
    found = [m for m in models if m["name"] == RESNET50]
    worst = max(models, key=lambda m: m["ratio"])
    return [
        {"bar": f"{RESNET50} farm / onnxruntime", "limit": f"<= {RESNET50_BAR}x",
         "measured": f"{found[0]['ratio']:.2f}x" if found else "not selected",
         "passed": found[0]["ratio"] <= RESNET50_BAR if found else None},
        {"bar": "every model farm / onnxruntime", "limit": f"<= {EVERY_MODEL_BAR}x",
         "measured": f"worst {worst['name']}: {worst['ratio']:.2f}x", "passed": worst["ratio"] <= EVERY_MODEL_BAR},
    ]


def report(result: dict[str, Any]) -> str:
    """The figures as Markdown tables."""
    models = markdown_table(
        ["model", "farm ms", "ort ms", "farm/ort", "farm 1-thread ms", "ort 1-thread ms", "1-thread farm/ort",
         "farm threads gain", "max diff / scale"],
        [[m["name"], f"{m['farm'] * 1e3:.3f}", f"{m['ort'] * 1e3:.3f}", f"{m['ratio']:.2f}",
          f"{m['farm_1'] * 1e3:.3f}", f"{m['ort_1'] * 1e3:.3f}", f"{m['ratio_1']:.2f}",
          f"{m['thread_speedup']:.2f}x", f"{m['relative_difference']:.1e}"] for m in result["models"]])
    convs = markdown_table(["light_resnet50 conv (one thread)", "calls", "ms", "GFLOP/s", "of one core's peak"],
                           [[c["kernel"], c["calls"], f"{c['seconds'] * 1e3:.3f}", cell(c["gflops"], ".1f"),
                             cell(None if c["of_peak"] is None else c["of_peak"] * 100, ".0f") + "%"]
                            for c in result["convs"]])
    verdicts = markdown_table(["bar", "measured", "limit", "result"],
                              [[b["bar"], b["measured"], b["limit"],
                                {True: "PASS", False: "FAIL", None: "n/a"}[b["passed"]]] for b in result["bars"]])
    peak = (f"fp32 peak: {result['core_peak_gflops']:.1f} GFLOP/s per core, "
            f"{result['machine_peak_gflops']:.1f} GFLOP/s on {result['machine']['cores']} cores")
    return f"{models}\n\n{peak}\n\n{convs}\n\n{verdicts}"


def onnx_subject(parser: argparse.ArgumentParser, path: Path) -> Subject:
    """An --onnx file as a Subject named by its stem; a missing, unreadable or dynamic-shaped model is refused."""
    if not path.is_file():
        parser.error(f"--onnx {path}: {'not a file' if path.exists() else 'no such file'}")
    try:
        feeds = onnx_feeds(path)
    except (OSError, ValueError, DecodeError) as error:
        parser.error(f"--onnx {path}: not a usable ONNX model: {error}")
    return Subject(path.stem, path, feeds)


def unique_names(parser: argparse.ArgumentParser, models: Sequence[str], subjects: Sequence[Subject]) -> None:
    """Artifacts are named by the model's stem: two models of one name would overwrite each other's."""
    names = [*models, *(subject.name for subject in subjects)]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        parser.error(f"more than one model named {', '.join(repeated)} (an --onnx file is named by its stem)")
    if not names:
        parser.error("no model to measure: give --models or --onnx")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated built-in model names (default: all of them, or none when "
                                         "--onnx is given)")
    parser.add_argument("--onnx", type=Path, action="append", default=[], metavar="PATH",
                        help="also measure this ONNX file, named by its stem (repeatable)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per model (default 15)")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    default_models = "" if args.onnx else ",".join(ALL_MODELS)
    args.models = model_names(parser, default_models if args.models is None else args.models)
    args.onnx = [onnx_subject(parser, path) for path in args.onnx]
    unique_names(parser, args.models, args.onnx)
    return args


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    ort.set_default_logger_severity(3)  # the light models carry unused initializers ort warns about
    core_peak = fma_peak_gflops()
    models = []
    built_in = [Subject(name, path, feeds_for(path)) for name, path in
                ((name, model_path(name, folder)) for name in args.models)]
    with LocalExecutor() as executor:
        for subject in [*built_in, *args.onnx]:
            models.append(bench_model(subject, folder, executor, args.rounds))
            m = models[-1]
            print(f"  {m['name']}: farm {m['farm'] * 1e3:.3f} ms ({m['threads']} threads), ort {m['ort'] * 1e3:.3f} "
                  f"ms, {m['ratio']:.2f}x; one thread: farm {m['farm_1'] * 1e3:.3f} ms, ort {m['ort_1'] * 1e3:.3f} "
                  f"ms, {m['ratio_1']:.2f}x", flush=True)
    resnet = [m for m in models if m["name"] == RESNET50]
    convs = heaviest_convs(resnet[0]["artifact"], core_peak) if resnet else []
    cores = len(os.sched_getaffinity(0))
    return {"machine": machine_info(cores), "core_peak_gflops": core_peak, "machine_peak_gflops": core_peak * cores,
            "models": models, "convs": convs, "bars": bars(models)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="farm-speed-") as tmp:
        result = run(args, Path(tmp))
    print(f"\nmachine: {json.dumps(result['machine'])}\n\n{report(result)}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    failed = any(b["passed"] is False for b in result["bars"])
    return 1 if failed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
