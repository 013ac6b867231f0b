#!/usr/bin/env python3
"""Time to first result (load + first inference) of a ResNet-18-style model on this host's OpenCL device, in one
run: from the artifact's shipped binaries, from farm's parallel source build, and from two serial source builds.

- serial source build, binaries kept: farm's runtime limited to one process, the same work as the parallel build
  (build every kernel, compile its launches, read the binary back for the cache), one kernel after another.
- serial source build, nothing kept: what a runtime without a binary cache does (MACE's fallback, TVM): build each
  kernel from source in turn and let the first run compile the launches; cheaper once, paid on every start.

Each measurement is a fresh process with an empty farm cache and an empty PoCL cache directory (PoCL's kernel
cache on, as an app's first start would find it), so every source build really compiles; the clock starts after
the OpenCL platform is up (common to every row) and stops at the first inference's outputs. Each row is the
median of --repeat runs.

Usage: python3 benchmarks/bench_opencl.py [--no-fail] [--repeat N]. Bars (issue 4): shipped binaries >= 20x
faster than the serial source build (the cheaper serial row); parallel source build >= 1.6x faster than the
serial build of the same work, on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from report import markdown_table

from farm.artifact import open_artifact, write_artifact
from farm.backends.opencl.devices import BUILD_OPTIONS, opencl_devices
from farm.backends.opencl.loader import OpenCLModel, this_device
from farm.backends.opencl.target import OpenClTarget
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.runtime.manifest_types import OpenClKernel
from farm.tools import examples

SHIPPED_BAR, PARALLEL_BAR = 20.0, 1.6


class UncachedSerialModel(OpenCLModel):
    """A runtime without a binary cache: each kernel built from source in turn, launches compiled by the first run."""

    def load_programs(self, kernels: list[OpenClKernel]) -> dict[str, Any]:
        import pyopencl as cl

        return {
            k.symbol: cl.Program(self.context, self.loader.artifact.read_member(k.source).decode()).build(
                options=BUILD_OPTIONS.split()
            )
            for k in kernels
        }


# scenario: (artifact to load: the real one or the one without binaries for this device, model class, options)
SCENARIOS: dict[str, tuple[str, type[OpenCLModel], dict[str, Any]]] = {
    "shipped binaries": ("shipped", OpenCLModel, {}),
    "parallel source build, binaries kept (farm)": ("no_device", OpenCLModel, {}),
    "serial source build, binaries kept": ("no_device", OpenCLModel, {"build_processes": 1}),
    "serial source build, nothing kept": ("no_device", UncachedSerialModel, {}),
}


def for_no_device(artifact: str, folder: Path) -> str:
    """The artifact with its binaries filed under a fingerprint no device has: the runtime must build sources."""
    source = open_artifact(artifact)
    manifest = json.loads(json.dumps(source.manifest))
    members = {name: source.read_member(name) for name in manifest.pop("members")}
    for kernel in manifest["opencl"]["kernels"]:
        kernel["binaries"] = {"0" * 16: next(iter(kernel["binaries"].values()))}
    return write_artifact(folder / "no_device.farm", manifest, members)


def measure(scenario: str, folder: Path) -> float:
    """In this (fresh) process: seconds from opening the artifact to the first inference's outputs."""
    which, model_class, options = SCENARIOS[scenario]
    feeds = dict(np.load(folder / "feeds.npz"))
    this_device()
    started = time.perf_counter()
    model_class(open_artifact(folder / f"{which}.farm"), folder / f"cache-{time.time_ns()}", **options).run(feeds)
    return time.perf_counter() - started


def measure_in_a_fresh_process(scenario: str, folder: Path) -> float:
    with tempfile.TemporaryDirectory(prefix="pocl-cache-") as pocl_cache:
        env = {**os.environ, "POCL_CACHE_DIR": pocl_cache, "POCL_KERNEL_CACHE": "1"}
        done = subprocess.run(
            [sys.executable, __file__, "--measure", scenario, str(folder)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(done.stdout.split()[-1])


def prepare(folder: Path, fingerprint: str) -> int:
    """Build the model for the device; write shipped.farm, no_device.farm and feeds.npz; return the kernel count."""
    model = examples.resnet18_style()
    onnx.save(model, folder / "resnet18_style.onnx")
    with LocalExecutor() as executor:
        artifact = build_model(
            folder / "resnet18_style.onnx", folder, [OpenClTarget(fingerprint)], executor=executor
        ).artifact
    os.replace(artifact, folder / "shipped.farm")
    for_no_device(str(folder / "shipped.farm"), folder)
    np.savez(folder / "feeds.npz", **examples.random_input(model))
    return len(open_artifact(folder / "shipped.farm").manifest["opencl"]["kernels"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--no-fail", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--measure", nargs=2, metavar=("SCENARIO", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(f"{measure(args.measure[0], Path(args.measure[1])):.6f}")
        return 0
    devices = opencl_devices()
    if not devices:
        print("no OpenCL device", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="farm-bench-cl-") as name:
        folder = Path(name)
        kernels = prepare(folder, devices[0]["fingerprint"])
        seconds = {
            scenario: statistics.median(measure_in_a_fresh_process(scenario, folder) for _ in range(args.repeat))
            for scenario in SCENARIOS
        }
    print(
        f"device: {devices[0]['device']} ({devices[0]['platform_version']}); {kernels} kernels; "
        f"cores: {os.cpu_count()}; median of {args.repeat}; load average {os.getloadavg()[0]:.2f}\n"
    )
    print(markdown_table(["time to first result", "seconds"], [[s, f"{t:.3f}"] for s, t in seconds.items()]))
    shipped, parallel, serial, uncached = seconds.values()
    cheapest_serial = min(serial, uncached)
    bars = [
        [
            "shipped vs the cheaper serial source build",
            f"{cheapest_serial / shipped:.1f}x",
            f">= {SHIPPED_BAR:.0f}x",
            "PASS" if cheapest_serial / shipped >= SHIPPED_BAR else "FAIL",
        ],
        [
            "parallel vs serial source build (binaries kept)",
            f"{serial / parallel:.2f}x",
            f">= {PARALLEL_BAR}x",
            "PASS" if serial / parallel >= PARALLEL_BAR else "FAIL",
        ],
        ["parallel vs serial source build (nothing kept)", f"{uncached / parallel:.2f}x", "(reported)", ""],
    ]
    print("\n" + markdown_table(["bar", "measured", "limit", "result"], bars))
    return 0 if args.no_fail or all(b[3] != "FAIL" for b in bars) else 1


if __name__ == "__main__":
    sys.exit(main())
