#!/usr/bin/env python3
"""Seconds a submitting client's commands take from start to exit, and what they import (issue 16: a CI machine
that only submits and downloads should not load a compiler).

Against a real redis-server it starts (no worker: a job done by hand, its artifact a recipe in the store, as
tests/test_client.py makes one), it runs `farm status JOB`, `farm download JOB`, `farm jobs` and
`farm submit MODEL --no-wait --target cpu:TRIPLE` in fresh processes, the checkouts given (--checkout, default
this one: an older tree gives the figures before a change) in alternating rounds, and reports each command's
best and median wall time, how many modules it imported and which of numpy, llvmlite, pyopencl, onnx and celery.

Then it times the check of a manifest's nesting that a download makes (farm.artifact._deeper_than, the standard
library's) against the numpy one it replaced (`numpy_deeper_than`), best of --repeat interleaved rounds, on the
manifest of each --manifest-of artifact, a hostile manifest of 16 MB of nested brackets and a flat one of 16 MB.

Usage: python3 benchmarks/bench_client.py [--checkout PATH]... [--repeat N] [--manifest-of ARTIFACT]...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))  # tests/ holds the real redis-server the benchmark reuses

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from report import markdown_table  # noqa: E402

from farm.artifact import MAX_MANIFEST_BYTES, MAX_MANIFEST_DEPTH, _deeper_than, verify  # noqa: E402
from farm.backends.llvm.target import host_target  # noqa: E402
from farm.distributed import recipes  # noqa: E402
from farm.distributed.client import FarmClient  # noqa: E402
from farm.distributed.job_record import JobState  # noqa: E402
from farm.distributed.steps import Farm  # noqa: E402
from farm.tools import examples  # noqa: E402
from tests.services import RedisServer  # noqa: E402

HEAVY = ("numpy", "llvmlite", "pyopencl", "onnx", "celery")
RUN_AND_COUNT = """
import atexit, json, sys
atexit.register(lambda: print("modules: " + json.dumps(sorted(sys.modules)), file=sys.stderr))
from farm.cli.main import main
main(prog_name="farm")
"""
"""`farm ARGS`, then the names of every module it imported on stderr."""


def done_job(url: str, model: Path) -> str:
    """A job submitted and done, its artifact a recipe of a manifest and 1 MB of weights (what a farm's finish
    leaves; its size doesn't matter here)."""
    client = FarmClient(url)
    job_id = client.submit(model, [host_target()])
    Farm(client.board, client.store, lambda message: None).accept(job_id)
    weights = client.store.put(os.urandom(1 << 20))
    key, _ = recipes.put_recipe(
        client.store,
        {"model": {"name": model.stem}},
        {"weights/w.bin": recipes.stored(client.store, weights, 1 << 20)},
        lambda keys: None,
    )
    client.board.advance(job_id, JobState.DONE, artifact_key=key)
    return job_id


def run(checkout: Path, args: list[str], url: str, folder: Path) -> tuple[float, list[str]]:
    """Seconds `farm ARGS` of `checkout` took, and the modules it imported."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "FARM_BROKER_URL": url}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", RUN_AND_COUNT, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"farm {' '.join(args)} ({checkout}) failed:\n{result.stderr}")
    return seconds, json.loads(result.stderr.rpartition("modules: ")[2])


def numpy_deeper_than(text: str, limit: int) -> bool:
    """The check artifact.py made before, with numpy: the running sum of +1 per opening and -1 per closing bracket
    outside strings, over the whole text."""
    outside = np.frombuffer(re.sub(r'"(?:[^"\\]|\\.)*"', '""', text).encode("utf-8"), np.uint8)
    steps = np.isin(outside, np.frombuffer(b"[{", np.uint8)).astype(np.int8) - np.isin(
        outside, np.frombuffer(b"]}", np.uint8)
    ).astype(np.int8)
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0)) > limit


def time_manifest_checks(manifests: dict[str, str], repeat: int) -> str:
    """Best milliseconds of each check on each manifest, interleaved; both must agree."""
    checks: dict[str, Callable[[str, int], bool]] = {"numpy (before)": numpy_deeper_than, "stdlib": _deeper_than}
    rows = []
    for name, text in manifests.items():
        best = dict.fromkeys(checks, float("inf"))
        for _ in range(repeat):
            for label, check in checks.items():
                started = time.perf_counter()
                deeper = check(text, MAX_MANIFEST_DEPTH)
                best[label] = min(best[label], time.perf_counter() - started)
                assert deeper == numpy_deeper_than(text, MAX_MANIFEST_DEPTH), name
        rows.append([f"{name} ({len(text) / 1e3:.0f} KB)", *(f"{best[label] * 1e3:.2f}" for label in checks)])
    return markdown_table(["manifest", *(f"{label} ms" for label in checks)], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", action="append", type=Path, help="a farm tree to time (repeatable)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--manifest-of",
        action="append",
        type=Path,
        default=[],
        metavar="ARTIFACT",
        help="time the manifest check on this artifact's manifest too (repeatable)",
    )
    options = parser.parse_args()
    checkouts = [path.resolve() for path in options.checkout or [CHECKOUT]]
    with tempfile.TemporaryDirectory(prefix="bench-client-") as name, RedisServer() as server:
        folder = Path(name)
        model = folder / "tiny_cnn.onnx"
        onnx.save(examples.tiny_cnn(), model)
        job_id = done_job(server.url, model)
        commands = {
            "status": ["status", job_id],
            "download": ["download", job_id, "-o", str(folder / "out")],
            "jobs": ["jobs"],
            "submit --no-wait": ["submit", str(model), "--no-wait", "--target", f"cpu:{host_target().triple}"],
        }
        times = {(c, k): [] for c in checkouts for k in commands}
        imported: dict[tuple[Path, str], list[str]] = {}
        for _ in range(options.repeat):
            for command, args in commands.items():
                for checkout in checkouts:
                    seconds, imported[checkout, command] = run(checkout, args, server.url, folder)
                    times[checkout, command].append(seconds)
    rows = [
        [
            f"{checkout.name} {command}",
            f"{min(times[checkout, command]):.3f}",
            f"{statistics.median(times[checkout, command]):.3f}",
            str(len(imported[checkout, command])),
            ", ".join(m for m in HEAVY if m in imported[checkout, command]) or "none",
        ]
        for command in commands
        for checkout in checkouts
    ]
    print(markdown_table(["checkout, command", "best s", "median s", "modules", "heavy modules"], rows))
    half = MAX_MANIFEST_BYTES // 2
    manifests = {path.name: verify(path).manifest_text.decode() for path in options.manifest_of}
    manifests |= {"hostile": "[" * half + "]" * half, "flat": '{"a": [' + "1," * (half - 8) + "1]}"}
    print()
    print(time_manifest_checks(manifests, options.repeat))


if __name__ == "__main__":
    main()
