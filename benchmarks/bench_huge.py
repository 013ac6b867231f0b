#!/usr/bin/env python3
"""A model whose weights pass 2 GB, built, loaded and run against numpy (issue 15 item 3: ten 8192 x 8192 float
MatMuls, 2.7 GB in external data, failed to link with R_X86_64_PC32 out of range after 25 s and 6.2 GB of RSS).

It writes the model (a chain of --layers MatMuls of --width x --width random weights, external data), builds it
with `farm submit` in a child process (peak RSS: that process's own high-water mark, VmHWM, see PEAK_REPORTER),
loads the artifact twice into a fresh runtime cache, runs it on two threads and compares the output with numpy in
float64. Needs about three times the weights in free disk and memory.

Bars: the build succeeds and the output matches numpy within 1e-4 of its scale; the build's peak RSS is at most
1.5 x the weights + 1 GB.

Usage: python3 benchmarks/bench_huge.py [--layers 10] [--width 8192] [--no-fail]
Exit status: 0 when every bar passes (or --no-fail), 1 when one fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from farm import runtime  # noqa: E402

GB = 1 << 30
RSS_BAR_FACTOR, RSS_BAR_EXTRA = 1.5, 1 * GB
TOLERANCE = 1e-4


def write_model(path: Path, layers: int, width: int) -> list[np.ndarray]:
    """The chain of MatMuls, its weights in one external data file beside it; returns the weights."""
    rng = np.random.default_rng(0)
    weights = [
        (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
        for _ in range(layers)
    ]
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"], name=f"mm{i}")
        for i in range(layers)
    ]
    graph = helper.make_graph(
        nodes,
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(f"y{layers - 1}", TensorProto.FLOAT, [1, width])],
        [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f"{path.stem}.data")
    return weights


PEAK_REPORTER = """
import atexit, runpy, sys
report = sys.argv.pop(1)

def peak() -> None:
    status = open("/proc/self/status").read()
    with open(report, "w") as file:
        file.write(status.split("VmHWM:")[1].split()[0])

atexit.register(peak)
sys.argv[0] = "farm"
runpy.run_module("farm", run_name="__main__")
"""
"""`python -m farm` that writes its own peak RSS (VmHWM, kB) to a file as it exits: the rusage of a child is no
measure, since Linux charges a child with its parent's high-water mark when it execs (this process holds the
model's weights for the numpy check: the earlier figures, 12.55 and 8.90 GiB, were this process's peak)."""


def build(path: Path, folder: Path) -> tuple[float, int, subprocess.CompletedProcess]:
    """`farm submit` in a child: seconds, the child's own peak RSS in bytes (its compile workers are separate
    processes of a few hundred MB), the result."""
    env = {**os.environ, "FARM_CACHE_DIR": str(folder / "cache"), "PYTHONPATH": str(CHECKOUT)}
    report = folder / "peak-rss"
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", PEAK_REPORTER, str(report), "submit", str(path), "-o", str(folder / "out")],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.perf_counter() - started
    return seconds, int(report.read_text()) * 1024, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=10, help="MatMuls in the chain (default 10)")
    parser.add_argument("--width", type=int, default=8192, help="rows and columns of each weight (default 8192)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    if args.layers < 1 or args.width < 1:
        parser.error("--layers and --width must be >= 1")
    with tempfile.TemporaryDirectory(prefix="farm-huge-", dir=os.environ.get("TMPDIR")) as tmp:
        folder = Path(tmp)
        weights = write_model(folder / "huge.onnx", args.layers, args.width)
        weight_bytes = sum(w.nbytes for w in weights)
        seconds, rss, result = build(folder / "huge.onnx", folder)
        print(
            f"weights {weight_bytes / GB:.2f} GB; build {seconds:.1f} s, exit {result.returncode}, peak RSS "
            f"{rss / GB:.2f} GB",
            flush=True,
        )
        built = result.returncode == 0
        if not built:
            print(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "(no error text)")
        else:
            artifact = result.stdout.strip()
            loads = []
            for _ in range(2):
                started = time.perf_counter()
                model = runtime.load(artifact, cache_dir=folder / "runtime", threads=2)
                loads.append(time.perf_counter() - started)
            x = np.random.default_rng(1).standard_normal((1, args.width)).astype(np.float32)
            started = time.perf_counter()
            y = model.run({"x": x})[f"y{args.layers - 1}"]
            run_seconds = time.perf_counter() - started
            reference = x.astype(np.float64)
            for w in weights:
                reference = reference @ w.astype(np.float64)
            relative = float(np.max(np.abs(y - reference)) / np.max(np.abs(reference)))
            print(
                f"loads {loads[0]:.3f} s then {loads[1]:.3f} s; run (2 threads) {run_seconds:.3f} s; max diff / "
                f"scale {relative:.1e}"
            )
            built = relative <= TOLERANCE
    limit = RSS_BAR_FACTOR * weight_bytes + RSS_BAR_EXTRA
    bars = [
        ("builds, runs and matches numpy", built),
        (f"peak build RSS <= {RSS_BAR_FACTOR} x weights + 1 GB ({limit / GB:.2f} GB)", rss <= limit),
    ]
    for name, passed in bars:
        print(f"bar: {name}: {'PASS' if passed else 'FAIL'}")
    return 0 if all(passed for _, passed in bars) or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
