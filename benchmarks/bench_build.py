#!/usr/bin/env python3
"""Benchmark farm's build and runtime against the bars of the benchmark issue, in one run.

For every test model (the five examples of `farm.tools.examples`, written to a temporary folder, and the nine light models
shipped with the onnx package) it measures:

- cold compile: wall seconds of `build_model` in one shared `LocalExecutor`, whose start-up is warmed by a trivial
  build first and reported on its own;
- weights: the model's distinct constant bytes (`plan_model(path).blobs`) written as artifact members, as a build
  writes them (`farm.artifact.write_artifact`, streamed, hashed as written): total bytes over the wall time;
- inference latency: median of `--repeat` runs of farm's runtime and of onnxruntime (default session options), both
  after two warm-up runs, their ratio, and the largest absolute difference between their outputs.

Weights are also measured on synthetic random blobs (one core): 256 MB written as an artifact member against the
same bytes written to a plain file (disk speed, in the same run), and 4 MB as a member against a C char array
compiled by `cc -c -O0` (the baseline that made one compiler 10x slower). Weights go through no compiler and no
linker (docs/architecture.md, "Weights"). MB means 10**6 bytes throughout. Builds here bypass the compile cache.

`--cache` measures the compile cache instead: for each model, `--rounds` times alternately, a cold build into a
fresh store, then a warm one from that store (every kernel a cache hit), their medians, whether all artifacts are
byte-identical, and what caching the packed weights would buy (packing them against reading them from a store).

`--iree` measures a cold `farm submit` (a process of its own, an empty cache) against IREE's import and compile of
the same file, taking turns `--rounds` times, and how long `farm` takes to start when it only prints help or
refuses a model (benchmarks/compile_vs_iree.py).

Usage: python3 benchmarks/bench_build.py [--models a,b] [--repeat N] [--json out.json] [--workers N] [--no-fail]
       python3 benchmarks/bench_build.py --cache [--models a,b] [--rounds N] [--workers N] [--json out.json]
       python3 benchmarks/bench_build.py --iree [--iree-bin DIR] [--models a,b] [--rounds N] [--json out.json]
Exit status: 0 when every bar passes (or --no-fail), 1 when a bar fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from compile_vs_iree import (
    IREE_BAR,
    IREE_BAR_MODELS,
    START_BAR_SECONDS,
    CompileResult,
    compare,
    iree_tools,
    start_seconds,
)
from report import cell, markdown_table

from farm import runtime
from farm.artifact import write_artifact
from farm.backends.llvm.target import host_target
from farm.build.assembly import compile_units, plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.build.units import compile_unit
from farm.store import FileStore
from farm.tools.examples import EXAMPLES, random_input

MB = 1_000_000
LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LIGHT_MODELS = (
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
)
ALL_MODELS = (*EXAMPLES, *LIGHT_MODELS)
WARMUP_RUNS = 2

PACK_BAR_MB_S = 300.0
RESNET50_BAR_S = 15.0
LATENCY_BAR_RATIO = 10.0
SYNTHETIC_LARGE = 256 * MB
C_ARRAY_BLOB = 4 * MB


@dataclass
class ModelResult:
    """Every figure measured for one model; `error` is set (and later figures are None) when a step failed."""

    name: str
    kernels: int | None = None
    blobs: int | None = None
    weight_bytes: int | None = None
    compile_s: float | None = None
    pack_s: float | None = None
    farm_s: float | None = None
    ort_s: float | None = None
    max_abs_diff: float | None = None
    error: str | None = None

    @property
    def pack_mb_s(self) -> float | None:
        return _rate(self.weight_bytes, self.pack_s)

    @property
    def ratio(self) -> float | None:
        return self.farm_s / self.ort_s if self.farm_s is not None and self.ort_s else None


@dataclass
class Bar:
    """One bar of the issue: what was measured, against what limit, and whether it passed."""

    name: str
    measured: str
    limit: str
    passed: bool | None  # None: not measured in this run (model not selected)

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]


def _rate(nbytes: int | None, seconds: float | None) -> float | None:
    """MB/s, or None when either figure is missing."""
    return nbytes / MB / seconds if nbytes is not None and seconds else None


# -- models --------------------------------------------------------------------------------------------------------


def model_path(name: str, folder: Path) -> Path:
    """The model's .onnx file: examples are written into `folder`, light models are read where onnx installed them."""
    if name in EXAMPLES:
        path = folder / f"{name}.onnx"
        if not path.exists():
            onnx.save(EXAMPLES[name](), str(path))
        return path
    return LIGHT_DIR / f"{name}.onnx"


def feeds_for(path: Path) -> dict[str, np.ndarray]:
    """Seeded standard-normal inputs for every graph input of the model at `path`."""
    return random_input(onnx.load(str(path)), seed=0)


# -- compile -------------------------------------------------------------------------------------------------------


def warm_executor(executor: LocalExecutor, folder: Path) -> float:
    """Seconds of a trivial build (mlp) that starts the executor's worker processes and their LLVM."""
    started = time.perf_counter()
    build_model(model_path("mlp", folder), folder / "warmup", executor=executor, no_cache=True)
    return time.perf_counter() - started


def timed_build(path: Path, out_dir: Path, executor: LocalExecutor) -> tuple[str, int, int, float]:
    """Build the model cold (bypassing the compile cache); (artifact, kernels, blobs, wall seconds)."""
    started = time.perf_counter()
    result = build_model(path, out_dir, executor=executor, no_cache=True)
    return result.artifact, result.kernels, result.blobs, time.perf_counter() - started


# -- packing -------------------------------------------------------------------------------------------------------


def member_seconds(blobs: dict[str, bytes], folder: Path) -> float:
    """Wall seconds of writing every blob (sha256 -> bytes) as a member of an artifact, as a build writes weights."""
    started = time.perf_counter()
    write_artifact(folder / "weights.farm", {"model": {}}, {f"weights/{sha}.bin": data for sha, data in blobs.items()})
    seconds = time.perf_counter() - started
    (folder / "weights.farm").unlink()
    return seconds


def plain_write_seconds(data: bytes, folder: Path) -> float:
    """Wall seconds of writing `data` to a file and fsyncing it: the disk's speed, the floor for any packer."""
    started = time.perf_counter()
    with open(folder / "plain.bin", "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    seconds = time.perf_counter() - started
    (folder / "plain.bin").unlink()
    return seconds


def model_blobs(path: Path) -> dict[str, bytes]:
    """The model's distinct constant tensors as raw bytes, keyed by sha256, as the build plans them."""
    return {sha: array.tobytes() for sha, array in plan_model(path).blobs.items()}


def synthetic_blob(nbytes: int, seed: int = 0) -> dict[str, bytes]:
    """One random blob of `nbytes`, keyed by its sha256 (random so that nothing compresses or repeats)."""
    data = np.random.default_rng(seed).bytes(nbytes)
    return {hashlib.sha256(data).hexdigest(): data}


def c_array_seconds(data: bytes, folder: Path) -> float:
    """Wall seconds of `cc -c -O0` on `const unsigned char x[] = {...};` holding `data` (writing the .c is untimed)."""
    table = np.array([f"0x{value:02x},".encode() for value in range(256)], dtype="S5")
    values = np.frombuffer(data, np.uint8)
    rows = (table[values[i : i + 4096]].tobytes() for i in range(0, len(values), 4096))
    source, obj = folder / "blob_c_array.c", folder / "blob_c_array.o"
    source.write_bytes(b"const unsigned char x[] = {\n" + b"\n".join(rows) + b"\n};\n")
    started = time.perf_counter()
    subprocess.run(["cc", "-c", "-O0", str(source), "-o", str(obj)], check=True)
    return time.perf_counter() - started


def packing_baselines(folder: Path) -> dict[str, Any]:
    """Throughput of writing synthetic weights: 256 MB as a member against a plain file, 4 MB against a C array."""
    large, small = synthetic_blob(SYNTHETIC_LARGE, seed=1), synthetic_blob(C_ARRAY_BLOB, seed=3)
    small_member_s = member_seconds(small, folder)
    small_c_s = c_array_seconds(next(iter(small.values())), folder)
    return {
        "large_member": {
            "bytes": SYNTHETIC_LARGE,
            "packer": "artifact member",
            "seconds": member_seconds(large, folder),
        },
        "large_plain_file": {
            "bytes": SYNTHETIC_LARGE,
            "packer": "plain file write + fsync (disk speed)",
            "seconds": plain_write_seconds(next(iter(large.values())), folder),
        },
        "small_member": {"bytes": C_ARRAY_BLOB, "packer": "artifact member", "seconds": small_member_s},
        "small_c_array": {"bytes": C_ARRAY_BLOB, "packer": "cc -c -O0 (C char array)", "seconds": small_c_s},
        "member_over_c_array": small_c_s / small_member_s,
    }


# -- inference -----------------------------------------------------------------------------------------------------


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = WARMUP_RUNS) -> float:
    """Median wall seconds of `repeat` calls of `fn` after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def farm_latency(
    artifact: str, feeds: dict[str, np.ndarray], repeat: int, cache_dir: Path
) -> tuple[float, dict[str, np.ndarray]]:
    """farm's median latency (single-threaded runtime) and its outputs."""
    model = runtime.load(artifact, cache_dir=cache_dir)
    return median_seconds(lambda: model.run(feeds), repeat), model.run(feeds)


def ort_latency(path: Path, feeds: dict[str, np.ndarray], repeat: int) -> tuple[float, dict[str, np.ndarray]]:
    """onnxruntime's median latency with default session options (CPU provider) and its outputs."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feeds), strict=True))
    return median_seconds(lambda: session.run(None, feeds), repeat), outputs


def max_abs_diff(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """The largest absolute difference over the outputs both sides produced."""
    return max(float(np.max(np.abs(ours[name] - reference[name]))) for name in ours if name in reference)


# -- one model -----------------------------------------------------------------------------------------------------


def bench_model(name: str, folder: Path, executor: LocalExecutor, repeat: int) -> ModelResult:
    """Compile, pack and run one model; a failure is recorded in the result rather than raised."""
    result = ModelResult(name)
    try:
        path = model_path(name, folder)
        artifact, result.kernels, result.blobs, result.compile_s = timed_build(path, folder / "out", executor)
        blobs = model_blobs(path)
        result.weight_bytes = sum(len(data) for data in blobs.values())
        result.pack_s = member_seconds(blobs, folder)
        del blobs
        feeds = feeds_for(path)
        result.farm_s, ours = farm_latency(artifact, feeds, repeat, folder / "cache")
        result.ort_s, reference = ort_latency(path, feeds, repeat)
        result.max_abs_diff = max_abs_diff(ours, reference)
    except Exception as error:  # noqa: BLE001 - one failing model must not hide the others' figures
        result.error = f"{type(error).__name__}: {error}"
    return result


# -- the compile cache ---------------------------------------------------------------------------------------------


@dataclass
class CacheResult:
    """Cold and warm local builds of one model, and the packed weights' cost to pack against reading them back."""

    name: str
    units: int
    cold_s: list[float]
    warm_s: list[float]
    warm_compiled: int
    warm_cached: int
    identical: bool
    packed_bytes: int
    pack_s: float
    cache_read_s: float

    @property
    def speedup(self) -> float:
        return statistics.median(self.cold_s) / statistics.median(self.warm_s)


def bench_cache(name: str, folder: Path, executor: LocalExecutor, rounds: int) -> CacheResult:
    """`rounds` pairs of builds, each a cold one into a fresh store and a warm one from it, alternating so that a
    busy machine weighs on both alike."""
    path, cold_s, warm_s, hashes = model_path(name, folder), [], [], set()
    for round_ in range(rounds):
        store = FileStore(folder / f"store-{name}-{round_}")
        cold = build_model(path, folder / "cold", executor=executor, store=store)
        warm = build_model(path, folder / "warm", executor=executor, store=store)
        cold_s.append(cold.seconds)
        warm_s.append(warm.seconds)
        hashes |= {hashlib.sha256(Path(result.artifact).read_bytes()).hexdigest() for result in (cold, warm)}
    packed_bytes, pack_s, read_s = packed_weights_seconds(path, FileStore(folder / f"store-{name}-blobs"))
    return CacheResult(
        name,
        warm.compiled + warm.cached,
        cold_s,
        warm_s,
        warm.compiled,
        warm.cached,
        len(hashes) == 1,
        packed_bytes,
        pack_s,
        read_s,
    )


def packed_weights_seconds(path: Path, store: FileStore) -> tuple[int, float, float]:
    """(bytes, seconds to pack, seconds to read from `store`) of the model's packed weights for this host: what a
    build does now, against what it would do if they were cached."""
    plan = plan_model(path)
    units = [unit for unit in compile_units(plan, [host_target()]) if unit.kind == "blob"]
    started = time.perf_counter()
    packed = [compile_unit(unit, memoryview(plan.blobs[unit.data_key]).cast("B")) for unit in units]
    pack_s = time.perf_counter() - started
    keys = [store.put(data) for data in packed]
    started = time.perf_counter()
    for key in keys:
        store.get(key)
    return sum(len(data) for data in packed), pack_s, time.perf_counter() - started


def cache_table(results: Sequence[CacheResult]) -> str:
    """The cold and warm builds as a Markdown table."""
    header = [
        "model",
        "units",
        "cold s",
        "warm s",
        "cold/warm",
        "warm compiled",
        "warm cached",
        "identical",
        "packed MB",
        "pack s",
        "cache read s",
    ]
    rows = [
        [
            r.name,
            str(r.units),
            " / ".join(f"{s:.2f}" for s in r.cold_s),
            " / ".join(f"{s:.2f}" for s in r.warm_s),
            f"{r.speedup:.1f}x",
            str(r.warm_compiled),
            str(r.warm_cached),
            str(r.identical),
            f"{r.packed_bytes / MB:.1f}",
            f"{r.pack_s:.3f}",
            f"{r.cache_read_s:.3f}",
        ]
        for r in results
    ]
    return markdown_table(header, rows)


def run_cache_benchmark(args: argparse.Namespace, folder: Path) -> int:
    """The compile cache's figures (--cache); exit 1 when a warm build compiled anything or bytes differ."""
    with LocalExecutor(args.workers) as executor:
        warmup_s = warm_executor(executor, folder)
        print(f"executor: {executor.workers} workers, warm-up build {warmup_s:.2f} s", flush=True)
        results = [bench_cache(name, folder, executor, args.rounds) for name in args.models]
        workers = executor.workers
    print(f"\nmachine: {json.dumps(machine_info(workers))}\n\n{cache_table(results)}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine_info(workers), "cache": [{**asdict(r), "speedup": r.speedup} for r in results]},
                indent=2,
            )
            + "\n"
        )
    return 0 if all(r.identical and r.warm_compiled == 0 for r in results) else 1


# -- bars and report -----------------------------------------------------------------------------------------------


def packing_bars(results: Sequence[ModelResult]) -> list[Bar]:
    """Weights written >= 300 MB/s over all models together, as builds write them."""
    measured = [r for r in results if r.pack_s is not None]
    total = _rate(sum(r.weight_bytes for r in measured), sum(r.pack_s for r in measured))
    limit = f">= {PACK_BAR_MB_S:.0f} MB/s"
    return [
        Bar(
            "weights written as artifact members, all models",
            f"{total:.0f} MB/s" if total else "n/a",
            limit,
            total is not None and total >= PACK_BAR_MB_S if measured else None,
        )
    ]


def compile_bar(results: Sequence[ModelResult], workers: int) -> Bar:
    """light ResNet-50 cold compile < 15 s (the issue's bar is for 2 cores)."""
    resnet = next((r for r in results if r.name == "light_resnet50"), None)
    name = f"light_resnet50 cold compile, {workers} workers"
    if resnet is None:
        return Bar(name, "not selected", f"< {RESNET50_BAR_S:.0f} s", None)
    if resnet.compile_s is None:
        return Bar(name, "failed", f"< {RESNET50_BAR_S:.0f} s", False)
    return Bar(name, f"{resnet.compile_s:.2f} s", f"< {RESNET50_BAR_S:.0f} s", resnet.compile_s < RESNET50_BAR_S)


def latency_bar(results: Sequence[ModelResult]) -> Bar:
    """Every model's farm / onnxruntime latency ratio <= 10 (a model that failed fails the bar)."""
    worst = max(results, key=lambda r: float("inf") if r.ratio is None else r.ratio)
    measured = f"worst {worst.name}: " + (f"{worst.ratio:.2f}x" if worst.ratio is not None else "failed")
    return Bar(
        "latency farm / onnxruntime, every model",
        measured,
        f"<= {LATENCY_BAR_RATIO:.0f}x",
        worst.ratio is not None and worst.ratio <= LATENCY_BAR_RATIO,
    )


def model_table(results: Sequence[ModelResult]) -> str:
    """The per-model figures as a Markdown table."""
    header = [
        "model",
        "kernels",
        "blobs",
        "weights MB",
        "compile s",
        "pack MB/s",
        "farm ms",
        "ort ms",
        "farm/ort",
        "max abs diff",
    ]
    rows = [
        [
            r.name,
            cell(r.kernels, "d"),
            cell(r.blobs, "d"),
            cell(None if r.weight_bytes is None else r.weight_bytes / MB, ".2f"),
            cell(r.compile_s, ".2f"),
            cell(r.pack_mb_s, ".0f"),
            cell(None if r.farm_s is None else r.farm_s * 1e3, ".2f"),
            cell(None if r.ort_s is None else r.ort_s * 1e3, ".2f"),
            cell(r.ratio, ".2f"),
            cell(r.max_abs_diff, ".1e"),
        ]
        for r in results
    ]
    return markdown_table(header, rows)


def packing_table(baselines: dict[str, Any]) -> str:
    """The synthetic-blob packing figures as a Markdown table."""
    rows = [
        [
            key,
            f"{entry['bytes'] / MB:.0f}",
            entry["packer"],
            f"{entry['seconds']:.3f}",
            f"{_rate(entry['bytes'], entry['seconds']):.0f}",
        ]
        for key, entry in baselines.items()
        if isinstance(entry, dict)
    ]
    return markdown_table(["blob", "MB", "packer", "seconds", "MB/s"], rows)


def bars_table(bars: Sequence[Bar]) -> str:
    """The bars with their verdicts as a Markdown table."""
    return markdown_table(
        ["bar", "measured", "limit", "result"], [[b.name, b.measured, b.limit, b.verdict] for b in bars]
    )


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else whatever `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return next(
        (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor()
    )


def machine_info(workers: int) -> dict[str, Any]:
    """What the figures were measured on."""
    host = host_target()
    return {
        "cpu": cpu_name(),
        "llvm_cpu": host.cpu,
        "avx512f": "+avx512f" in host.features.split(","),
        "cores": len(os.sched_getaffinity(0)),
        "workers": workers,
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "triple": host.triple,
    }


# -- against IREE --------------------------------------------------------------------------------------------------


def run_iree_benchmark(args: argparse.Namespace, folder: Path) -> int:
    """Cold farm submits against IREE's import + compile per model, then farm's start times; tables and bars."""
    results = []
    for name in args.models:
        results.append(compare(name, model_path(name, folder), args.iree_tools, folder, args.rounds))
        r = results[-1]
        print(f"  {name}: farm {r.farm_s:.2f} s, IREE {r.iree_s:.2f} s, {r.ratio:.2f}x", flush=True)
    starts = start_seconds(folder, repeat=7)
    bars = [iree_bar(results), start_bar(starts)]
    table = markdown_table(
        ["model", "farm cold submit s", "IREE import s", "IREE compile s", "IREE total s", "farm / IREE"],
        [
            [
                r.name,
                f"{r.farm_s:.2f}",
                f"{r.iree_import_s:.2f}",
                f"{r.iree_compile_s:.2f}",
                f"{r.iree_s:.2f}",
                f"{r.ratio:.2f}",
            ]
            for r in results
        ],
    )
    start_table = markdown_table(["command", "best of 7, s"], [[label, f"{s:.3f}"] for label, s in starts.items()])
    print(
        f"\nmachine: {json.dumps(machine_info(os.cpu_count() or 1))}\n\n{table}\n\n{start_table}\n\n{bars_table(bars)}"
    )
    if args.json:
        report = {
            "machine": machine_info(os.cpu_count() or 1),
            "rounds": args.rounds,
            "models": [{**asdict(r), "iree_s": r.iree_s, "ratio": r.ratio} for r in results],
            "start_seconds": starts,
            "bars": [{**asdict(b), "verdict": b.verdict} for b in bars],
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if any(b.passed is False for b in bars) and not args.no_fail else 0


def iree_bar(results: Sequence[CompileResult]) -> Bar:
    """Cold submit <= IREE_BAR x IREE's import + compile on each of IREE_BAR_MODELS that was measured."""
    held = [r for r in results if r.name in IREE_BAR_MODELS]
    worst = max(held, key=lambda r: r.ratio, default=None)
    return Bar(
        f"cold farm submit / IREE import + compile ({', '.join(IREE_BAR_MODELS)})",
        f"worst {worst.name}: {worst.ratio:.2f}x" if worst else "not selected",
        f"<= {IREE_BAR}x",
        worst.ratio <= IREE_BAR if worst else None,
    )


def start_bar(starts: dict[str, float]) -> Bar:
    """Every start (help, a refused model) under START_BAR_SECONDS."""
    slowest = max(starts, key=starts.__getitem__)
    return Bar(
        "farm prints help or refuses a model",
        f"slowest {slowest}: {starts[slowest]:.2f} s",
        f"< {START_BAR_SECONDS} s",
        starts[slowest] < START_BAR_SECONDS,
    )


# -- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; unknown model names are refused with the list of known ones."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models", default=",".join(ALL_MODELS), help=f"comma-separated names (default: all {len(ALL_MODELS)})"
    )
    parser.add_argument("--repeat", type=int, default=20, help="timed inference runs per model (default 20)")
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--workers", type=int, default=None, help="build worker processes (default: all cores)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    parser.add_argument("--cache", action="store_true", help="measure cold against warm (cached) builds instead")
    parser.add_argument("--rounds", type=int, default=3, help="with --cache or --iree: rounds per model (default 3)")
    parser.add_argument("--iree", action="store_true", help="measure a cold farm submit against IREE instead")
    parser.add_argument(
        "--iree-bin", metavar="DIR", help="with --iree: the folder of iree-import-onnx and iree-compile"
    )
    args = parser.parse_args(argv)
    args.models = model_names(parser, args.models)
    if args.iree:
        args.iree_tools = iree_tools(args.iree_bin)
        if args.iree_tools is None:
            parser.error(
                f"--iree: iree-import-onnx and iree-compile not found {'in ' + args.iree_bin if args.iree_bin else 'on PATH'}"
                " (pip install 'iree-base-compiler[onnx]', then give --iree-bin DIR)"
            )
    if args.repeat < 1 or args.rounds < 1:
        parser.error("--repeat and --rounds must be >= 1")
    return args


def model_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The comma-separated model names of --models; unknown ones are refused with the list of known ones."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALL_MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(ALL_MODELS)}")
    return names


def run_benchmarks(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Every measurement of one run, as a JSON-ready dict (with the ModelResults kept under `_results`)."""
    ort.set_default_logger_severity(3)  # the light models carry unused initializers ort warns about
    with LocalExecutor(args.workers) as executor:
        warmup_s = warm_executor(executor, folder)
        print(f"executor: {executor.workers} workers, warm-up build {warmup_s:.2f} s", flush=True)
        results = []
        for name in args.models:
            results.append(bench_model(name, folder, executor, args.repeat))
            print(f"  {name}: " + (results[-1].error or f"compile {results[-1].compile_s:.2f} s"), flush=True)
        workers = executor.workers
    baselines = packing_baselines(folder)
    bars = [*packing_bars(results), compile_bar(results, workers), latency_bar(results)]
    return {
        "machine": machine_info(workers),
        "repeat": args.repeat,
        "executor_warmup_s": warmup_s,
        "models": [{**asdict(r), "pack_mb_s": r.pack_mb_s, "ratio": r.ratio} for r in results],
        "packing": baselines,
        "bars": [{**asdict(b), "verdict": b.verdict} for b in bars],
        "_results": results,
        "_bars": bars,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cache:
        with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
            return run_cache_benchmark(args, Path(tmp))
    if args.iree:
        with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
            return run_iree_benchmark(args, Path(tmp))
    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp:
        report = run_benchmarks(args, Path(tmp))
    results, bars = report.pop("_results"), report.pop("_bars")
    print(f"\nmachine: {json.dumps(report['machine'])}\n\n{model_table(results)}\n")
    for r in results:
        if r.error:
            print(f"{r.name} failed: {r.error}")
    print(
        f"{packing_table(report['packing'])}\n\nartifact member / C char array (4 MB): "
        f"{report['packing']['member_over_c_array']:.0f}x faster\n\n{bars_table(bars)}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    failed = any(b.passed is False for b in bars)
    return 1 if failed and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
