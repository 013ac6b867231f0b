#!/usr/bin/env python3
"""Seconds to import and plan long chains of cheap nodes, against the bars of issue 13 item 9 (a 20,000-node chain
took over 60 s: the memory plan and the topological sort were quadratic in the node count).

For every node count it times `plan_model` (import, passes, validate, plan) on two chains of Relu and Add nodes on
a [1, 8] tensor, one listed in order and one listed last to first (which the import must sort), best of --repeat
runs each, and prints seconds, microseconds per node and the ratio of each count's time to the one before.
--submit also times a whole local `farm submit` (compile, link, artifact) of the in-order chain of --submit-nodes.

Bars: the in-order and reversed 20,000-node chains plan within 5 s each, and 50,000 nodes take at most 3.5 times
20,000 (2.5 is linear).

Usage: python3 benchmarks/bench_plan.py [--nodes 2000,5000,20000,50000] [--orders in-order,reversed] [--repeat N]
                                        [--submit]
                                        [--submit-nodes N] [--no-fail]
Exit status: 0 when every bar passes (or --no-fail), 1 when a bar fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
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

from farm.build.assembly import plan_model  # noqa: E402

SECONDS_AT_20000 = 5.0
RATIO_50000_TO_20000 = 3.5


def chain_model(nodes: int, reverse: bool) -> onnx.ModelProto:
    """x -> Add(c) -> Relu -> Add(c) -> ... (`nodes` in all: the Relus fuse into the Adds), in order or reversed."""
    chain = [
        helper.make_node(
            "Add" if i % 2 == 0 else "Relu", [f"v{i - 1}" if i else "x", "c"][: 2 - i % 2], [f"v{i}"], name=f"n{i}"
        )
        for i in range(nodes)
    ]
    graph = helper.make_graph(
        chain[::-1] if reverse else chain,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(f"v{nodes - 1}", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.full((1, 8), 0.5, np.float32), "c")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def time_plan(path: Path, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        plan_model(path)
        best = min(best, time.perf_counter() - started)
    return best


def time_submit(path: Path, out: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "farm", "submit", str(path), "-o", str(out)],
        check=True,
        cwd=CHECKOUT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="2000,5000,20000,50000", help="node counts, comma-separated")
    parser.add_argument("--orders", default="in-order,reversed", help="chains to time: in-order, reversed or both")
    parser.add_argument("--repeat", type=int, default=1, help="runs per count, the best is kept (default 1)")
    parser.add_argument("--submit", action="store_true", help="also time a whole local farm submit")
    parser.add_argument("--submit-nodes", type=int, default=20000, help="nodes of the submitted chain (default 20000)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args()
    try:
        counts = sorted({int(n) for n in args.nodes.split(",")})
    except ValueError:
        parser.error(f"--nodes {args.nodes!r}: expected whole numbers separated by commas")
    orders = args.orders.split(",")
    if not counts or counts[0] < 2 or args.repeat < 1 or not set(orders) <= {"in-order", "reversed"}:
        parser.error("node counts must be at least 2, --repeat at least 1, --orders in-order and/or reversed")
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="farm-bench-plan-") as scratch:
        folder = Path(scratch)
        print(f"{'chain':<10}{'nodes':>8}{'seconds':>10}{'us/node':>10}{'ratio':>8}")
        for order in orders:
            seconds: dict[int, float] = {}
            for nodes in counts:
                path = folder / f"{order}{nodes}.onnx"
                onnx.save(chain_model(nodes, reverse=order == "reversed"), path)
                seconds[nodes] = time_plan(path, args.repeat)
                before = [n for n in counts if n < nodes]
                ratio = f"{seconds[nodes] / seconds[before[-1]]:.2f}" if before else ""
                print(
                    f"{order:<10}{nodes:>8}{seconds[nodes]:>10.2f}{seconds[nodes] / nodes * 1e6:>10.1f}{ratio:>8}",
                    flush=True,
                )
            failures += _bars(order, seconds)
        if args.submit:
            path = folder / "submitted.onnx"
            onnx.save(chain_model(args.submit_nodes, reverse=False), path)
            print(
                f"farm submit of the in-order {args.submit_nodes}-node chain: {time_submit(path, folder / 'out'):.1f} s"
            )
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures and not args.no_fail else 0


def _bars(order: str, seconds: dict[int, float]) -> list[str]:
    failures = []
    if 20000 in seconds and seconds[20000] > SECONDS_AT_20000:
        failures.append(f"{order}: 20,000 nodes took {seconds[20000]:.1f} s, over {SECONDS_AT_20000:g} s")
    if 20000 in seconds and 50000 in seconds and seconds[50000] > RATIO_50000_TO_20000 * seconds[20000]:
        failures.append(
            f"{order}: 50,000 nodes took {seconds[50000] / seconds[20000]:.1f} times 20,000, over "
            f"{RATIO_50000_TO_20000:g}"
        )
    return failures


if __name__ == "__main__":
    sys.exit(main())
