#!/usr/bin/env python3
"""Benchmark farm's inference speed against onnxruntime and the machine's fp32 peak, in one run.

For every test model (the examples of `farm.tools.examples` and the nine light models shipped with the onnx package,
picked with --models) and every ONNX file given with --onnx (torch.onnx exports of real architectures, see
scripts/export_models.py) it builds the artifact for this host and measures two like-for-like pairs: farm and
onnxruntime each with its default threads (farm: every CPU; onnxruntime: its default session options), and farm
and onnxruntime each on ONE thread (onnxruntime with intra_op_num_threads = inter_op_num_threads = 1). Each of the
four runs in a process of its own (benchmarks/engine_process.py), and they take turns round by round, so that a
busy moment hits every side alike and no engine's threads share a process with another's (timed in one process,
onnxruntime's spinning pool threads took a core from farm: on a 2-core Zen 3 farm's two-thread figures doubled).
Each figure is the median over rounds of the mean of a round's runs. The one-thread ratio divides farm's one-thread time by onnxruntime's one-thread time:
dividing it by onnxruntime's multi-threaded time would charge farm for the cores it was told not to use.

Feeds: the built-in models get seeded standard-normal inputs (`farm.tools.examples.random_input`); an --onnx model
gets seeded standard-normal floats for float inputs, ones for an integer input whose name contains "mask" (an
attention mask), and integers in [0, 100) for other integer inputs (token ids valid for any vocabulary). An
--onnx model's dynamic dimensions are pinned with --shape (NAME=SIZE or INPUT=AxB, as `farm submit --shape`
takes them; the same pins for every --onnx model), and onnxruntime runs the dynamic model on the feeds of those
shapes. The largest difference between farm's one-thread outputs and onnxruntime's,
divided by the largest magnitude of onnxruntime's outputs, is reported per model as a sanity check.

It also measures this machine's fp32 peak: a JIT-compiled loop of independent fused multiply-adds on the widest
vector the CPU has (one core), times the cores; and, on one thread, the GFLOP/s of each model's heaviest
multiply-add kernels (Conv, ConvTranspose, MatMul, Gemm): farm's timed step by step in model order (`farm bench`'s
step timing, best of repeats), onnxruntime's nodes of the same op family and work from its own profiler (best of
repeats), each against one core's peak measured again just before that model's kernels are timed (a shared host's
peak drifts by 5-10% within a minute).

Bars: light_resnet50 <= 1.0x onnxruntime at the default threads and on one thread; every model of at least
KERNEL_BAR_MIN_SECONDS on one thread <= 1.10x, at the default threads and on one thread; the heaviest
compute-bound multiply-add kernel of each such model at >= 75% of one core's peak.

Usage: python3 benchmarks/bench_speed.py [--models a,b] [--onnx PATH]... [--shape NAME=SIZE]... [--rounds N]
                                         [--json out.json] [--no-fail]
Without --onnx every built-in model is measured; with --onnx only the given files, plus the built-in models that
--models names. Bars apply to every measured model.
Exit status: 0 when every bar passes (or --no-fail), 1 when a bar fails, 2 on bad arguments (an unknown model, an
--onnx path that is missing or not a readable ONNX model, an input left dynamic or a --shape that fits no input or
dimension, two models of one name).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
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
from engine_process import EngineProcess, alternating_latency, save_feeds
from google.protobuf.message import DecodeError
from llvmlite import ir
from onnx import helper
from report import cell, markdown_table

from farm.artifact import read_manifest
from farm.backends.llvm.target import host_target, init_llvm
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.cli.bench import bench_artifact, kernel_label
from farm.errors import BadInputError
from farm.frontend.shapes import apply_shapes
from farm.ir.shapes import PinnedShapes, parse_sizes

RESNET50 = "light_resnet50"
RESNET50_BAR = 1.0
EVERY_MODEL_BAR = 1.10
KERNEL_PEAK_BAR = 0.75
KERNEL_BAR_MIN_SECONDS = 0.005
"""Models faster than this on one thread are held by per-run and per-step overheads (bars)."""
COMPUTE_BOUND_INTENSITY = 32
"""Flops per byte of a kernel's inputs and outputs from which it is held to the FMA peak: at 32, streaming its
operands once from memory at 12 GB/s (one core here) takes under a third of the time its flops take at 75% of a
216 GFLOP/s peak. A fully connected layer at batch 1 does 0.5 (memory-bound at 3-8% of peak in every engine)."""
PEAK_CHAINS = 12  # independent accumulators: enough to cover FMA latency x throughput on current cores
PEAK_ITERATIONS = 2_000_000
HEAVIEST_KERNELS = 6
KERNEL_REPEATS = 10
MULTIPLY_ADD_FAMILIES = {
    "Conv": "conv",
    "FusedConv": "conv",
    "NchwcConv": "conv",
    "ConvTranspose": "convtranspose",
    "MatMul": "matmul",
    "FusedMatMul": "matmul",
    "Gemm": "matmul",
}
"""The family of each farm op and onnxruntime node op (after its fusions) whose work is multiply-adds: a farm kernel
is matched with onnxruntime's nodes of its family and of the same flops per call."""
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
    shapes: PinnedShapes | None = None
    """The --shape pins an --onnx model with dynamic dimensions is built and fed with."""


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
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3
    )
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(str(module)), machine)
    engine.finalize_object()
    peak = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64)(engine.get_function_address("peak"))
    best = min(_seconds(lambda: peak(PEAK_ITERATIONS)) for _ in range(5))
    return PEAK_ITERATIONS * PEAK_CHAINS * lanes * 2 / best / 1e9


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


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
            raise ValueError(
                f"input {value.name!r} has a dynamic shape ({', '.join(dynamic) or 'no shape'}); pin it with --shape"
            )
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


def onnx_feeds(path: Path, shapes: PinnedShapes | None = None) -> dict[str, np.ndarray]:
    """Seeded feeds for every input of the ONNX file at `path` (weights in external data are not read), its
    dynamic dimensions pinned by `shapes` (`--shape`, as `farm submit` takes them)."""
    rng = np.random.default_rng(FEED_SEED)
    model = onnx.load(str(path), load_external_data=False)
    if not model.graph.node:
        raise ValueError("the file holds no graph")
    if shapes:
        apply_shapes(model.graph, shapes, str(path))
    return {name: onnx_feed(name, dtype, shape, rng) for name, dtype, shape in static_inputs(model)}


def relative_difference(ours: dict[str, np.ndarray], reference: Sequence[np.ndarray], names: Sequence[str]) -> float:
    """max |farm - onnxruntime| over every output, divided by the largest |onnxruntime output| (the output scale)."""
    diff = max(
        float(np.max(np.abs(ours[name].astype(np.float64) - np.asarray(ref, np.float64))))
        for name, ref in zip(names, reference)
    )
    scale = max(float(np.max(np.abs(np.asarray(ref, np.float64)))) for ref in reference)
    return diff / scale if scale else diff


def one_thread_session_options() -> ort.SessionOptions:
    """onnxruntime pinned to one thread: one intra-op thread (the caller's) and one inter-op thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return options


def bench_model(subject: Subject, folder: Path, executor: LocalExecutor, rounds: int) -> dict[str, Any]:
    """Build the model; time farm and onnxruntime at their default threads and both at one, each in its own process
    (model_latencies); then, once those processes are gone, the heaviest kernels on one thread in this process
    (onnxruntime's one-thread session has no pool threads)."""
    artifact = build_model(
        subject.path, folder / "out", executor=executor, sizes=[subject.shapes] if subject.shapes else ()
    ).artifact
    result = model_latencies(subject, artifact, folder, rounds)
    time.sleep(SETTLE_SECONDS)
    return {**result, "kernels": heaviest_kernels(artifact, ort_kernel_times(subject.path, subject.feeds, folder))}


def model_latencies(subject: Subject, artifact: str, folder: Path, rounds: int) -> dict[str, Any]:
    """farm and onnxruntime at their default threads and both at one thread, each in a process of its own, taking
    turns (engine_process.alternating_latency), and the largest difference of their outputs."""
    feeds = save_feeds(subject.feeds, folder / f"{subject.name}-feeds.npz")
    settings = {"farm": ("farm", 0), "ort": ("ort", 0), "farm_1": ("farm", 1), "ort_1": ("ort", 1)}
    with contextlib.ExitStack() as stack:
        engines = {
            name: stack.enter_context(
                EngineProcess(engine, artifact if engine == "farm" else subject.path, feeds, threads, folder / "cache")
            )
            for name, (engine, threads) in settings.items()
        }
        ours, reference = engines["farm_1"].outputs(folder / "farm.npz"), engines["ort"].outputs(folder / "ort.npz")
        runs = max(1, int(ROUND_SECONDS / max(engines["farm_1"].seconds(1), 1e-6)))
        seconds = alternating_latency(engines, rounds, runs)
    names = list(reference)
    return {
        "name": subject.name,
        "artifact": artifact,
        "threads": engines["farm"].loaded["threads"],
        **seconds,
        "ratio": seconds["farm"] / seconds["ort"],
        "ratio_1": seconds["farm_1"] / seconds["ort_1"],
        "thread_speedup": seconds["farm_1"] / seconds["farm"],
        "relative_difference": relative_difference(ours, [reference[name] for name in names], names),
        "outputs": list(ours),
    }


def ort_node_work(args: dict[str, Any]) -> tuple[str, int, int] | None:
    """(family, flops, output elements) of an onnxruntime profiler node event's args, from its input and output
    shapes (ResNet's 3x3 convs all do the same flops: the output size tells them apart); None for an op whose work
    is not multiply-adds. Conv: 2 x output elements x weights per output (W's dims past the first);
    ConvTranspose: 2 x input elements x W's dims past the first; MatMul and Gemm: 2 x output elements x the shared
    dimension: A's elements over the output's rows (whether or not A is transposed), or A's last dimension where
    A is broadcast over the output's batch."""
    family = MULTIPLY_ADD_FAMILIES.get(args.get("op_name", ""))
    if family is None:
        return None
    shapes = [next(iter(shape.values())) for shape in args["input_type_shape"]]
    out = next(iter(args["output_type_shape"][0].values()))
    elements = int(np.prod(out))
    if family == "conv":
        return family, 2 * elements * int(np.prod(shapes[1][1:])), elements
    if family == "convtranspose":
        return family, 2 * int(np.prod(shapes[0])) * int(np.prod(shapes[1][1:])), elements
    a = shapes[0]
    depth = int(np.prod(a)) * out[-1] // elements if len(a) == len(out) else a[-1]
    return family, 2 * elements * int(depth), elements


def ort_kernel_times(path: Path, feeds: dict[str, np.ndarray], folder: Path) -> dict[tuple[str, int, int], list[float]]:
    """onnxruntime on one thread with its profiler on: every multiply-add node's best seconds over KERNEL_REPEATS
    runs, keyed by its work (ort_node_work)."""
    options = one_thread_session_options()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "ort-profile")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(KERNEL_REPEATS):
        session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    best: dict[str, tuple[tuple[str, int, int], float]] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        work = ort_node_work(event["args"])
        if work is not None:
            seconds = event["dur"] * 1e-6
            best[event["name"]] = (work, min(seconds, best.get(event["name"], (work, seconds))[1]))
    times: dict[tuple[str, int, int], list[float]] = {}
    for work, seconds in best.values():
        times.setdefault(work, []).append(seconds)
    return times


def heaviest_kernels(artifact: str, ort_times: dict[tuple[str, int, int], list[float]]) -> dict[str, Any]:
    """The multiply-add kernels taking most of one thread's time (farm bench's rows), each with farm's GFLOP/s,
    onnxruntime's over its nodes of the same work (family, flops and output elements per call), and both against
    one core's peak, measured just before."""
    core_peak = fma_peak_gflops()
    specs = {kernel_label(entry["spec"]): entry["spec"] for entry in read_manifest(artifact).get("kernels", [])}
    rows = []
    for row in bench_artifact(artifact, repeat=KERNEL_REPEATS, threads=1).kernels():
        family = MULTIPLY_ADD_FAMILIES.get(row["op"])
        if family is None or not row["gflops"] or len(rows) == HEAVIEST_KERNELS:
            continue
        flops, (outputs, operand_bytes) = row["flops"] // row["calls"], spec_sizes(specs[row["kernel"]])
        matched = ort_times.get((family, flops, outputs), [])
        ort_gflops = flops * len(matched) / sum(matched) / 1e9 if matched else None
        rows.append(
            {
                **row,
                "intensity": flops / operand_bytes,
                "of_peak": row["gflops"] / core_peak,
                "ort_gflops": ort_gflops,
                "ort_of_peak": None if ort_gflops is None else ort_gflops / core_peak,
            }
        )
    return {"core_peak_gflops": core_peak, "kernels": rows}


def spec_sizes(spec: dict[str, Any]) -> tuple[int, int]:
    """A kernel spec's output elements and the bytes of all its inputs and outputs."""
    values = [*spec["inputs"], *spec["outputs"]]
    return (
        int(np.prod(spec["outputs"][0][0])),
        sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in values),
    )


def compute_bound(models: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(model, its heaviest compute-bound kernel: COMPUTE_BOUND_INTENSITY flops per operand byte or more) of every
    model that takes at least KERNEL_BAR_MIN_SECONDS on one thread and has one."""
    heaviest = [
        (m["name"], next((k for k in m["kernels"]["kernels"] if k["intensity"] >= COMPUTE_BOUND_INTENSITY), None))
        for m in models
        if m["farm_1"] >= KERNEL_BAR_MIN_SECONDS
    ]
    return [(name, kernel) for name, kernel in heaviest if kernel is not None]


def bars(models: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """light ResNet-50 <= RESNET50_BAR x onnxruntime and every model of at least KERNEL_BAR_MIN_SECONDS (one thread)
    <= EVERY_MODEL_BAR x, each at the default threads and on one thread (the worse of the two ratios); the heaviest compute-bound kernel of each such model at KERNEL_PEAK_BAR of one core's peak
    or more (compute_bound). Smaller models are held by per-run and per-step overheads, and a kernel that streams
    more than a byte of operands per COMPUTE_BOUND_INTENSITY flops by memory: the tables show both anyway."""
    found = [m for m in models if m["name"] == RESNET50]
    held = [m for m in models if m["farm_1"] >= KERNEL_BAR_MIN_SECONDS]
    worst = max(held, key=worse_ratio, default=None)
    lowest = min(compute_bound(models), key=lambda pair: pair[1]["of_peak"], default=None)
    return [
        {
            "bar": f"{RESNET50} farm / onnxruntime, default threads and one thread",
            "limit": f"<= {RESNET50_BAR}x",
            "measured": ratios(found[0]) if found else "not selected",
            "passed": worse_ratio(found[0]) <= RESNET50_BAR if found else None,
        },
        {
            "bar": f"every model of {KERNEL_BAR_MIN_SECONDS * 1e3:.0f} ms or more, farm / onnxruntime, both",
            "limit": f"<= {EVERY_MODEL_BAR}x",
            "measured": f"worst {worst['name']}: {ratios(worst)}" if worst else "no model that long",
            "passed": worse_ratio(worst) <= EVERY_MODEL_BAR if worst else None,
        },
        {
            "bar": "heaviest compute-bound kernel of each, one thread",
            "limit": f">= {KERNEL_PEAK_BAR:.0%} of peak",
            "measured": f"lowest {lowest[0]}: {lowest[1]['of_peak']:.0%}" if lowest else "none",
            "passed": lowest[1]["of_peak"] >= KERNEL_PEAK_BAR if lowest else None,
        },
    ]


def worse_ratio(model: dict[str, Any]) -> float:
    """The worse of a model's two ratios, at the default threads and on one thread: a bar holds for both."""
    return max(model["ratio"], model["ratio_1"])


def ratios(model: dict[str, Any]) -> str:
    return f"{model['ratio']:.2f}x, one thread {model['ratio_1']:.2f}x"


def report(result: dict[str, Any]) -> str:
    """The figures as Markdown tables."""
    models = markdown_table(
        [
            "model",
            "farm ms",
            "ort ms",
            "farm/ort",
            "farm 1-thread ms",
            "ort 1-thread ms",
            "1-thread farm/ort",
            "farm threads gain",
            "max diff / scale",
        ],
        [
            [
                m["name"],
                f"{m['farm'] * 1e3:.3f}",
                f"{m['ort'] * 1e3:.3f}",
                f"{m['ratio']:.2f}",
                f"{m['farm_1'] * 1e3:.3f}",
                f"{m['ort_1'] * 1e3:.3f}",
                f"{m['ratio_1']:.2f}",
                f"{m['thread_speedup']:.2f}x",
                f"{m['relative_difference']:.1e}",
            ]
            for m in result["models"]
        ],
    )
    peaks = {m["name"]: m["kernels"]["core_peak_gflops"] for m in result["models"]}
    heaviest = markdown_table(
        [
            "model: heaviest compute-bound kernel (one thread)",
            "calls",
            "ms",
            "flop/B",
            "GFLOP/s",
            "of peak",
            "ort GFLOP/s",
            "ort of peak",
            "peak then",
        ],
        [
            [f"{name}: {k['kernel']}", *kernel_cells(k), f"{peaks[name]:.0f}"]
            for name, k in compute_bound(result["models"])
        ],
    )
    resnet = [m for m in result["models"] if m["name"] == RESNET50]
    convs = (
        ""
        if not resnet
        else "\n\n"
        + markdown_table(
            [f"{RESNET50} (one thread)", "calls", "ms", "flop/B", "GFLOP/s", "of peak", "ort GFLOP/s", "ort of peak"],
            [[k["kernel"], *kernel_cells(k)] for k in resnet[0]["kernels"]["kernels"]],
        )
    )
    verdicts = markdown_table(
        ["bar", "measured", "limit", "result"],
        [
            [b["bar"], b["measured"], b["limit"], {True: "PASS", False: "FAIL", None: "n/a"}[b["passed"]]]
            for b in result["bars"]
        ],
    )
    peak = (
        f"fp32 peak: {result['core_peak_gflops']:.1f} GFLOP/s per core, "
        f"{result['machine_peak_gflops']:.1f} GFLOP/s on {result['machine']['cores']} cores"
    )
    return f"{models}\n\n{peak}\n\n{heaviest}{convs}\n\n{verdicts}"


def kernel_cells(kernel: dict[str, Any]) -> list[str]:
    """calls, ms, flops per operand byte, GFLOP/s and share of peak of a heaviest_kernels row, farm's then
    onnxruntime's."""
    return [
        kernel["calls"],
        f"{kernel['seconds'] * 1e3:.3f}",
        f"{kernel['intensity']:.0f}",
        cell(kernel["gflops"], ".1f"),
        f"{kernel['of_peak']:.0%}",
        cell(kernel["ort_gflops"], ".1f"),
        "-" if kernel["ort_of_peak"] is None else f"{kernel['ort_of_peak']:.0%}",
    ]


def onnx_subject(parser: argparse.ArgumentParser, path: Path, shapes: PinnedShapes) -> Subject:
    """An --onnx file as a Subject named by its stem, its dynamic dimensions pinned by --shape; a missing or
    unreadable model, or one left with a dynamic input, is refused."""
    if not path.is_file():
        parser.error(f"--onnx {path}: {'not a file' if path.exists() else 'no such file'}")
    try:
        feeds = onnx_feeds(path, shapes)
    except (OSError, ValueError, DecodeError, BadInputError) as error:
        parser.error(f"--onnx {path}: not a usable ONNX model: {error}")
    return Subject(path.stem, path, feeds, shapes)


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
    parser.add_argument(
        "--models", help="comma-separated built-in model names (default: all of them, or none when --onnx is given)"
    )
    parser.add_argument(
        "--onnx",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="also measure this ONNX file, named by its stem (repeatable)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=SIZE",
        help="pin a dynamic dimension of the --onnx models (batch=1) or a whole input "
        "(input_ids=1x128), as farm submit --shape does; repeatable",
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds per model (default 15)")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    default_models = "" if args.onnx else ",".join(ALL_MODELS)
    args.models = model_names(parser, default_models if args.models is None else args.models)
    try:
        sizes = parse_sizes(args.shape)
    except BadInputError as error:
        parser.error(str(error))
    if len(sizes) > 1:
        parser.error("--shape: give one size per pin (a benchmark times one size)")
    shapes = sizes[0]
    args.onnx = [onnx_subject(parser, path, shapes) for path in args.onnx]
    unique_names(parser, args.models, args.onnx)
    return args


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    ort.set_default_logger_severity(3)  # the light models carry unused initializers ort warns about
    core_peak = fma_peak_gflops()
    models = []
    built_in = [
        Subject(name, path, feeds_for(path))
        for name, path in ((name, model_path(name, folder)) for name in args.models)
    ]
    with LocalExecutor() as executor:
        for subject in [*built_in, *args.onnx]:
            models.append(bench_model(subject, folder, executor, args.rounds))
            m = models[-1]
            print(
                f"  {m['name']}: farm {m['farm'] * 1e3:.3f} ms ({m['threads']} threads), ort {m['ort'] * 1e3:.3f} "
                f"ms, {m['ratio']:.2f}x; one thread: farm {m['farm_1'] * 1e3:.3f} ms, ort {m['ort_1'] * 1e3:.3f} "
                f"ms, {m['ratio_1']:.2f}x",
                flush=True,
            )
    cores = len(os.sched_getaffinity(0))
    return {
        "machine": machine_info(cores),
        "core_peak_gflops": core_peak,
        "machine_peak_gflops": core_peak * cores,
        "models": models,
        "bars": bars(models),
    }


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
