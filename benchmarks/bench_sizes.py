#!/usr/bin/env python3
"""One artifact of several sizes (`--shape batch=1,8,32`, issue 15 item 1) against an artifact per size.

For each model (a dynamic batch dimension named `batch`) it builds, for this host, one artifact per size and one
artifact holding every size (in one warm process pool, after one untimed build of them all), then compares: build seconds, compile units, artifact bytes and the bytes of weight
members; and runs every size through the one loaded model and through its own artifact on the same random feeds.

Bars: the artifact of sizes holds each weight once (its weight members' bytes equal one single-size artifact's),
and every size's outputs are bit-identical to those of its own artifact.

Built-in models: `mlp` (8 MatMul+Relu layers of 1024, 32 MB of weights, dynamic batch) and the committed dynamic
torchvision export `mobilenet_v2` (tests/exports/mobilenet_v2_dynamic.onnx).

Usage: python3 benchmarks/bench_sizes.py [--models mlp,mobilenet_v2] [--sizes 1,8,32] [--no-fail]
Exit status: 0 when the bars pass (or --no-fail), 1 when one fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from report import markdown_table  # noqa: E402

from farm import runtime  # noqa: E402
from farm.build.executor import LocalExecutor  # noqa: E402
from farm.build.local import build_model  # noqa: E402
from farm.cli.bench import sample_feeds  # noqa: E402


def mlp(path: Path, width: int = 1024, layers: int = 8) -> None:
    """`layers` MatMul + Relu of `width` over a dynamic batch."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((width, width)) / width**0.5).astype(np.float32), f"w{i}")
        for i in range(layers)
    ]
    nodes = []
    for i in range(layers):
        nodes += [
            helper.make_node("MatMul", [f"h{i}" if i else "x", f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"h{i + 1}" if i + 1 < layers else "y"]),
        ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def committed(name: str) -> Callable[[Path], None]:
    def copy(path: Path) -> None:
        path.write_bytes((CHECKOUT / "tests" / "exports" / f"{name}_dynamic.onnx").read_bytes())

    return copy


MODELS: dict[str, Callable[[Path], None]] = {"mlp": mlp, "mobilenet_v2": committed("mobilenet_v2")}


def weight_bytes(artifact: str) -> int:
    """The bytes of an artifact's weight members (plain and packed)."""
    with tarfile.open(artifact) as tar:
        return sum(info.size for info in tar.getmembers() if "weights/" in info.name)


def _build(
    path: Path, folder: Path, sizes: list[dict[str, tuple[int, ...]]], executor: LocalExecutor
) -> tuple[float, object]:
    started = time.perf_counter()
    result = build_model(path, folder, executor=executor, sizes=sizes, no_cache=True)  # cold: compile every kernel
    return time.perf_counter() - started, result


def measure(name: str, batches: list[int], folder: Path) -> dict[str, object]:
    path = folder / f"{name}.onnx"
    MODELS[name](path)
    sizes = [{"batch": (batch,)} for batch in batches]
    with LocalExecutor() as executor:
        _build(path, folder / "warm-up", sizes, executor)  # the process pool's start-up is no build's own
        singles = [_build(path, folder / f"batch{batch}", [pins], executor) for batch, pins in zip(batches, sizes)]
        together_s, together = _build(path, folder / "together", sizes, executor)
    loaded = runtime.load(together.artifact, cache_dir=folder / "cache")
    identical = True
    for (_, size), (_, single) in zip(loaded.sizes, singles):
        feeds = sample_feeds(size.inputs)
        alone = runtime.load(single.artifact, cache_dir=folder / "cache").run(feeds)
        identical &= all(np.array_equal(alone[key], value) for key, value in loaded.run(feeds).items())
    return {
        "model": name,
        "together_s": together_s,
        "singles_s": sum(s for s, _ in singles),
        "together_units": together.kernels + together.blobs,
        "singles_units": sum(r.kernels + r.blobs for _, r in singles),
        "together_bytes": Path(together.artifact).stat().st_size,
        "singles_bytes": sum(Path(r.artifact).stat().st_size for _, r in singles),
        "together_weights": weight_bytes(together.artifact),
        "single_weights": weight_bytes(singles[0][1].artifact),
        "identical": identical,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,mobilenet_v2", help="comma-separated: mlp, mobilenet_v2")
    parser.add_argument("--sizes", default="1,8,32", help="batch sizes (default 1,8,32)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    names = [name for name in args.models.split(",") if name]
    if not names or any(name not in MODELS for name in names):
        parser.error(f"--models takes some of {', '.join(MODELS)}")
    try:
        batches = [int(n) for n in args.sizes.split(",")]
    except ValueError:
        parser.error("--sizes takes comma-separated integers")
    if len(batches) < 2 or min(batches) < 1 or len(set(batches)) != len(batches):
        parser.error("--sizes takes at least two distinct batch sizes of 1 or more")
    with tempfile.TemporaryDirectory(prefix="farm-sizes-") as tmp:
        rows = [measure(name, batches, Path(tmp)) for name in names]
    mb = lambda count: f"{count / 1e6:.1f}"  # noqa: E731
    print(
        markdown_table(
            [
                "model",
                "sizes",
                "build s (one / each)",
                "units (one / each)",
                "artifact MB (one / each)",
                "weights MB (one / a size's)",
                "outputs",
            ],
            [
                [
                    r["model"],
                    args.sizes,
                    f"{r['together_s']:.2f} / {r['singles_s']:.2f}",
                    f"{r['together_units']} / {r['singles_units']}",
                    f"{mb(r['together_bytes'])} / {mb(r['singles_bytes'])}",
                    f"{mb(r['together_weights'])} / {mb(r['single_weights'])}",
                    "identical" if r["identical"] else "DIFFER",
                ]
                for r in rows
            ],
        )
    )
    passed = all(r["identical"] and r["together_weights"] == r["single_weights"] for r in rows)
    print(
        f"bars: weights held once and every size's outputs bit-identical to its own artifact's: "
        f"{'PASS' if passed else 'FAIL'}"
    )
    return 0 if passed or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
