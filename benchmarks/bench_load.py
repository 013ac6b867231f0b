#!/usr/bin/env python3
"""Seconds to `farm.runtime.load` an artifact, the first time and again, against issue 15 item 4's bar (a 434 MB
BERT-base artifact took 2.7 s on every load, the third as slow as the first: every member was hashed and the
library extracted each time; onnxruntime creates its session from the .onnx in 1.35 s).

For each model it builds the artifact for this host, then, with a fresh runtime cache, times the first load (every
member hashed once, the library written to the cache), the second and the third (the artifact file and the cached
library recognised by their stat: nothing hashed, the library memory-mapped by dlopen), and onnxruntime's
InferenceSession from the same .onnx (best of --repeat). Built-in models: the examples of `farm.tools.examples`
and `bert_base` (bert_style at BERT-base's size: 12 layers of 768, vocabulary 30522, sequence 128; about 430 MB
of weights, a minute to build). --onnx adds any ONNX file with static shapes.

Bar: every second load within 0.5 s (the issue aims at 0.1 s).

Usage: python3 benchmarks/bench_load.py [--models tiny_cnn,resnet18_style,bert_base] [--onnx PATH]... [--repeat N]
                                        [--no-fail]
Exit status: 0 when the bar passes (or --no-fail), 1 when it fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime as ort

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from report import markdown_table  # noqa: E402

from farm import runtime  # noqa: E402
from farm.build.local import build_model  # noqa: E402
from farm.tools import examples  # noqa: E402

SECOND_LOAD_BAR_S = 0.5
BUILT_IN: dict[str, Callable[[], onnx.ModelProto]] = {
    **examples.EXAMPLES,
    "bert_base": lambda: examples.bert_style(seq=128, width=768, heads=12, layers=12, vocab=30522),
}


def _seconds(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(path: Path, folder: Path, repeat: int) -> dict[str, float | str]:
    """Build `path`, then time its loads into a fresh runtime cache and onnxruntime's session creation."""
    artifact = build_model(path, folder / "out").artifact
    cache = folder / "runtime-cache"
    loads = [_seconds(lambda: runtime.load(artifact, cache_dir=cache, threads=1)) for _ in range(3)]
    again = min(_seconds(lambda: runtime.load(artifact, cache_dir=cache, threads=1)) for _ in range(repeat))
    session = min(
        _seconds(lambda: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])) for _ in range(repeat)
    )
    return {
        "model": path.stem,
        "megabytes": Path(artifact).stat().st_size / 1e6,
        "first": loads[0],
        "second": loads[1],
        "third": loads[2],
        "best_again": again,
        "onnxruntime": session,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default="tiny_cnn,resnet18_style,bert_style,bert_base",
        help=f"comma-separated built-in models ({', '.join(BUILT_IN)}); default: "
        "tiny_cnn,resnet18_style,bert_style,bert_base",
    )
    parser.add_argument(
        "--onnx",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="also measure this ONNX file (static shapes), named by its stem",
    )
    parser.add_argument("--repeat", type=int, default=5, help="loads for the best-of figures (default 5)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when the bar fails")
    args = parser.parse_args(argv)
    args.models = [name for name in args.models.split(",") if name]
    unknown = [name for name in args.models if name not in BUILT_IN]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; choose from {', '.join(BUILT_IN)}")
    missing = [str(path) for path in args.onnx if not path.is_file()]
    if missing:
        parser.error(f"--onnx {', '.join(missing)}: no such file")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="farm-load-") as tmp:
        paths = []
        for name in args.models:
            paths.append(Path(tmp) / f"{name}.onnx")
            onnx.save(BUILT_IN[name](), paths[-1])
        for index, path in enumerate([*paths, *args.onnx]):
            rows.append(measure(path, Path(tmp) / str(index), args.repeat))
            print(
                f"  {rows[-1]['model']}: first {rows[-1]['first']:.3f} s, second {rows[-1]['second']:.3f} s", flush=True
            )
    print(
        markdown_table(
            ["model", "MB", "first load s", "second s", "third s", f"best of {args.repeat} s", "onnxruntime session s"],
            [
                [
                    r["model"],
                    f"{r['megabytes']:.1f}",
                    f"{r['first']:.3f}",
                    f"{r['second']:.3f}",
                    f"{r['third']:.3f}",
                    f"{r['best_again']:.3f}",
                    f"{r['onnxruntime']:.3f}",
                ]
                for r in rows
            ],
        )
    )
    worst = max(rows, key=lambda r: r["second"])
    passed = worst["second"] <= SECOND_LOAD_BAR_S
    print(
        f"\nbar: every second load <= {SECOND_LOAD_BAR_S} s: worst {worst['model']} {worst['second']:.3f} s "
        f"{'PASS' if passed else 'FAIL'}"
    )
    return 0 if passed or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
