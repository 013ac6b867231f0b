#!/usr/bin/env python3
"""Time to first result (load + first inference) of a ResNet-18-style model on this host's OpenCL device, in one
run: from the artifact's shipped binaries, from a serial source build, and from farm's parallel source build.

PoCL's own kernel cache is switched off (POCL_KERNEL_CACHE=0), so every source build really compiles. Each
measurement starts from an empty farm cache.

Usage: python3 benchmarks/bench_opencl.py [--no-fail]. Bars (issue 4): shipped binaries >= 20x faster than the
serial source build; parallel source build >= 1.6x faster than serial on 2 cores.
"""

from __future__ import annotations

import os

os.environ["POCL_KERNEL_CACHE"] = "0"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import onnx  # noqa: E402
from report import markdown_table  # noqa: E402

from farm import examples, runtime  # noqa: E402
from farm.artifact import open_artifact, write_artifact  # noqa: E402
from farm.build import build_model  # noqa: E402
from farm.executors import LocalExecutor  # noqa: E402
from farm.opencl_devices import BUILD_OPTIONS, opencl_devices  # noqa: E402

SHIPPED_BAR, PARALLEL_BAR = 20.0, 1.6


def for_no_device(artifact: str, folder: Path) -> str:
    """The artifact with its binaries filed under a fingerprint no device has: the runtime must build sources."""
    source = open_artifact(artifact)
    manifest = json.loads(json.dumps(source.manifest))
    members = {name: source.read_member(name) for name in manifest.pop("members")}
    for kernel in manifest["opencl"]["kernels"]:
        kernel["binaries"] = {"0" * 16: next(iter(kernel["binaries"].values()))}
    return write_artifact(folder / "no_device.farm", manifest, members)


def first_result(artifact: str, feeds: dict, cache: Path) -> float:
    started = time.perf_counter()
    runtime.load(artifact, device="opencl", cache_dir=cache).run(feeds)
    return time.perf_counter() - started


def serial_first_result(artifact: str, feeds: dict, cache: Path) -> float:
    """Build every kernel from source one after another (what a runtime without binaries does), then run."""
    import pyopencl as cl

    from farm.runtime.opencl import this_device

    started = time.perf_counter()
    context, _, _ = this_device()
    opened = open_artifact(artifact)
    for kernel in opened.manifest["opencl"]["kernels"]:
        cl.Program(context, opened.read_member(kernel["source"]).decode()).build(options=BUILD_OPTIONS.split())
    built = time.perf_counter() - started
    return built + first_result(artifact, feeds, cache)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-fail", action="store_true")
    args = parser.parse_args()
    devices = opencl_devices()
    if not devices:
        print("no OpenCL device", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="farm-bench-cl-") as name:
        folder = Path(name)
        model = examples.resnet18_style()
        onnx.save(model, folder / "resnet18_style.onnx")
        with LocalExecutor() as executor:
            artifact = build_model(folder / "resnet18_style.onnx", folder, executor=executor,
                                   opencl=[devices[0]["fingerprint"]]).artifact
        feeds = examples.random_input(model)
        no_device = for_no_device(artifact, folder)
        kernels = len(open_artifact(artifact).manifest["opencl"]["kernels"])
        shipped = first_result(artifact, feeds, folder / "cache-shipped")
        parallel = first_result(no_device, feeds, folder / "cache-parallel")
        serial = serial_first_result(no_device, feeds, folder / "cache-serial")
    rows = [["shipped binaries", f"{shipped:.3f}"], ["parallel source build (farm)", f"{parallel:.3f}"],
            ["serial source build", f"{serial:.3f}"]]
    print(f"device: {devices[0]['device']} ({devices[0]['platform_version']}); {kernels} kernels; "
          f"cores: {os.cpu_count()}\n")
    print(markdown_table(["time to first result", "seconds"], rows))
    bars = [["shipped vs serial source build", f"{serial / shipped:.1f}x", f">= {SHIPPED_BAR:.0f}x",
             "PASS" if serial / shipped >= SHIPPED_BAR else "FAIL"],
            ["parallel vs serial source build", f"{serial / parallel:.2f}x", f">= {PARALLEL_BAR}x",
             "PASS" if serial / parallel >= PARALLEL_BAR else "FAIL"]]
    print("\n" + markdown_table(["bar", "measured", "limit", "result"], bars))
    return 0 if args.no_fail or all(b[3] == "PASS" for b in bars) else 1


if __name__ == "__main__":
    sys.exit(main())
