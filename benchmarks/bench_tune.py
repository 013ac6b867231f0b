#!/usr/bin/env python3
"""Benchmark tuning against the bars of issue 6: tuning the light ResNet-50 on one worker takes under 5 minutes,
and the tuned model is never slower than the one with the default variant.

With a fresh store (a temporary folder, so nothing is reused from earlier runs) it measures:

- tuning: wall seconds of `choose_variants(..., tune=True)` for this host, as a local `farm submit --tune`
  and a farm worker run it: one kernel at a time on one core, each variant compiled, checked and timed;
- both builds (the default from an empty database, the tuned one from the records just made, which times nothing);
- latency: median of `--repeat` runs of each model (default threads: every CPU), the two models taking turns so
  that a busy moment of the machine costs both alike, after two warm-up runs each;
- per kernel: the variant chosen and the default's and winner's seconds as tuning measured them.

Usage: python3 benchmarks/bench_tune.py [--repeat N] [--json out.json] [--no-fail]
Exit status: 0 when both bars pass (or --no-fail), 1 when one fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
from report import cell, markdown_table

from farm import runtime
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.target import host_target
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.cli.bench import kernel_label
from farm.store import FileStore, Store
from farm.tools.examples import random_input
from farm.tuning.database import db_ref
from farm.tuning.space import tunable
from farm.tuning.variants import choose_variants

MODEL = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
TUNING_BAR_S = 300.0
LATENCY_BAR_RATIO = 1.0
WARMUP_RUNS = 2


def tune(path: Path, store: Store) -> tuple[float, int]:
    """Seconds to tune every tunable kernel of the model for this host into `store`, and how many were timed."""
    started = time.perf_counter()
    _, report = choose_variants([plan_model(path)], [host_target()], store, tune=True)
    return time.perf_counter() - started, len(report.timed)


def latencies(artifacts: Sequence[str], repeat: int) -> list[float]:
    """Median seconds per run of each artifact, the artifacts run in turn `repeat` times."""
    models = [runtime.load(artifact) for artifact in artifacts]
    feeds = random_input(onnx.load(str(MODEL)), seed=0)
    for model in models:
        for _ in range(WARMUP_RUNS):
            model.run(feeds)
    samples: list[list[float]] = [[] for _ in models]
    for _ in range(repeat):
        for model, times in zip(models, samples):
            started = time.perf_counter()
            model.run(feeds)
            times.append(time.perf_counter() - started)
    return [statistics.median(times) for times in samples]


def kernel_rows(path: Path, store: Store) -> list[dict[str, Any]]:
    """Each tunable kernel's label, chosen variant and measured seconds (the default's and the winner's)."""
    target = host_target()
    rows = []
    for spec in plan_model(path).kernels().values():
        if not tunable(spec):
            continue
        record = json.loads(store.get(store.get_ref(db_ref(spec, target.id))))
        chosen = GemmBlocking.from_json(record["variant"]).name
        rows.append(
            {
                "kernel": kernel_label(spec.to_json()),
                "variant": chosen,
                "default_s": record["default_seconds"],
                "chosen_s": record["seconds"][chosen],
                "rejected": record["rejected"],
            }
        )
    return rows


def run(repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="farm-bench-tune-") as folder:
        root = Path(folder)
        tuned_store, empty_store = FileStore(root / "tuned-store"), FileStore(root / "empty-store")
        tune_s, timed = tune(MODEL, tuned_store)
        with LocalExecutor() as executor:
            default = build_model(MODEL, root / "default", executor=executor, store=empty_store)
            tuned = build_model(MODEL, root / "tuned", executor=executor, store=tuned_store)
        default_s, tuned_s = latencies([default.artifact, tuned.artifact], repeat)
        return {
            "model": MODEL.stem,
            "target": host_target().id,
            "kernels_timed": timed,
            "tuning_s": tune_s,
            "default_build_s": default.seconds,
            "tuned_build_s": tuned.seconds,
            "default_latency_s": default_s,
            "tuned_latency_s": tuned_s,
            "ratio": tuned_s / default_s,
            "kernels": kernel_rows(MODEL, tuned_store),
        }


def report(result: dict[str, Any]) -> str:
    rows = [
        [
            k["kernel"],
            k["variant"],
            cell(k["default_s"] * 1e3, ".3f"),
            cell(k["chosen_s"] * 1e3, ".3f"),
            cell(k["default_s"] / k["chosen_s"], ".2f"),
            ",".join(k["rejected"]) or "-",
        ]
        for k in result["kernels"]
    ]
    return "\n".join(
        [
            f"{result['model']} on {result['target']}",
            f"tuning: {result['tuning_s']:.1f} s for {result['kernels_timed']} kernels (bar < {TUNING_BAR_S:.0f} s)",
            f"builds: default {result['default_build_s']:.1f} s, tuned {result['tuned_build_s']:.1f} s (no timing)",
            f"latency: default {result['default_latency_s'] * 1e3:.2f} ms, tuned {result['tuned_latency_s'] * 1e3:.2f} "
            f"ms, tuned/default {result['ratio']:.3f} (bar <= {LATENCY_BAR_RATIO:.2f})",
            "",
            markdown_table(["kernel", "variant", "default ms", "chosen ms", "speed-up", "rejected"], rows),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each model (default 30)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    result = run(args.repeat)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    passed = result["tuning_s"] < TUNING_BAR_S and result["ratio"] <= LATENCY_BAR_RATIO
    print(f"\nbars: {'PASS' if passed else 'FAIL'}")
    return 0 if passed or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
