#!/usr/bin/env python3
"""Benchmark tuning, model by model: what `--tune` costs and what it gains over the untuned build on this host.

For each model (default: DEFAULT_MODELS), with a fresh store (a temporary folder, so nothing is reused from earlier
runs) it measures:

- tuning: wall seconds of `choose_variants(..., tune=True)` for this host, as a local `farm submit --tune` and a
  farm worker run it: one kernel at a time on one core, each variant compiled, checked and timed; how many
  kernels were timed and how many took a variant other than their untuned one;
- both builds (the untuned one from an empty database, the tuned one from the records just made, which times
  nothing);
- latency: the two artifacts each in a process of its own (engine_process), at the host's default threads and on
  one thread, taking turns `--rounds` times (medians of each turn's mean); where tuning kept every kernel's
  untuned variant the tuned build runs the same code, so only the untuned one is timed (two processes of one
  artifact differ by up to 6% on two threads of the shared VM);
- per kernel that tuning moved off its untuned variant: the variant and both seconds as tuning measured them.

Bars (issues 6 and 32): tuning light ResNet-50 on one worker takes under 5 minutes; no tuned model is slower than
its untuned build beyond NOISE at either thread count.

Usage: python3 benchmarks/bench_tune.py [--models a,b] [--rounds N] [--json out.json] [--no-fail]
Exit status: 0 when the bars pass (or --no-fail), 1 when one fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench_build import feeds_for, machine_info, model_names, model_path
from engine_process import EngineProcess, alternating_latency, save_feeds
from report import cell, markdown_table

from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.kernel import untuned_blocking
from farm.backends.llvm.target import host_target
from farm.build.assembly import plan_model
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.cli.bench import kernel_label
from farm.store import FileStore, Store
from farm.tuning.database import db_ref
from farm.tuning.space import tunable
from farm.tuning.variants import choose_variants

DEFAULT_MODELS = ("light_resnet50", "light_squeezenet", "resnet18_style", "mobilenetv2_style", "bert_style")
TIMED_MODEL = "light_resnet50"
TUNING_BAR_S = 300.0
NOISE = 0.03
"""How much slower than the untuned build a tuned one may time before the bar fails: on the shared 2-core Xeon VM two
runs of this benchmark gave one model's tuned / untuned 0.93 and 1.00 on two threads, and an artifact timed in two
processes differed by up to 6%."""
ROUND_SECONDS = 0.25
"""About how long each engine's turn in a round lasts (as bench_speed's)."""


def tune(path: Path, store: Store) -> tuple[float, int]:
    """Seconds to tune every tunable kernel of the model for this host into `store`, and how many were timed."""
    started = time.perf_counter()
    _, report = choose_variants([plan_model(path)], [host_target()], store, tune=True)
    return time.perf_counter() - started, len(report.timed)


def moved_kernels(path: Path, store: Store) -> list[dict[str, Any]]:
    """Each tunable kernel whose recorded variant is not its untuned blocking: its label, the variant and the
    seconds tuning measured for both."""
    target = host_target()
    rows = []
    for spec in plan_model(path).kernels().values():
        if not tunable(spec):
            continue
        record = json.loads(store.get(store.get_ref(db_ref(spec, target.id))))
        chosen = GemmBlocking.from_json(record["variant"])
        if chosen == untuned_blocking(spec, target):
            continue
        rows.append(
            {
                "kernel": kernel_label(spec.to_json()),
                "variant": chosen.name,
                "default_s": record["default_seconds"],
                "chosen_s": record["seconds"][chosen.name],
            }
        )
    return rows


def latencies(artifacts: dict[str, str], feeds: Path, folder: Path, rounds: int) -> dict[str, float]:
    """Median seconds of each artifact at the default threads and on one thread ("<name>_1"), each in a process
    of its own, taking turns."""
    with contextlib.ExitStack() as stack:
        engines = {
            f"{name}{suffix}": stack.enter_context(EngineProcess("farm", artifact, feeds, threads, folder / "cache"))
            for name, artifact in artifacts.items()
            for suffix, threads in (("", 0), ("_1", 1))
        }
        runs = max(1, int(ROUND_SECONDS / max(engines["untuned_1"].seconds(1), 1e-6)))
        return alternating_latency(engines, rounds, runs)


def bench_model(name: str, folder: Path, executor: LocalExecutor, rounds: int) -> dict[str, Any]:
    """Tune the model into a fresh store, build it untuned and tuned, and time both."""
    path = model_path(name, folder)
    tuned_store, empty_store = FileStore(folder / f"{name}-tuned-store"), FileStore(folder / f"{name}-empty-store")
    tune_s, timed = tune(path, tuned_store)
    untuned = build_model(path, folder / f"{name}-untuned", executor=executor, store=empty_store)
    tuned = build_model(path, folder / f"{name}-tuned", executor=executor, store=tuned_store)
    feeds = save_feeds(feeds_for(path), folder / f"{name}-feeds.npz")
    moved = moved_kernels(path, tuned_store)
    if moved:
        seconds = latencies({"untuned": untuned.artifact, "tuned": tuned.artifact}, feeds, folder, rounds)
    else:  # every kernel kept its untuned variant: the same code, whatever two processes' timings would say
        seconds = latencies({"untuned": untuned.artifact}, feeds, folder, rounds)
        seconds |= {"tuned": seconds["untuned"], "tuned_1": seconds["untuned_1"]}
    return {
        "model": name,
        "kernels_timed": timed,
        "tuning_s": tune_s,
        "untuned_build_s": untuned.seconds,
        "tuned_build_s": tuned.seconds,
        **{f"{key}_s": value for key, value in seconds.items()},
        "ratio": seconds["tuned"] / seconds["untuned"],
        "ratio_1": seconds["tuned_1"] / seconds["untuned_1"],
        "moved": moved,
    }


def run(names: Sequence[str], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="farm-bench-tune-") as folder, LocalExecutor() as executor:
        models = [bench_model(name, Path(folder), executor, rounds) for name in names]
    return {"machine": machine_info(executor.workers), "target": host_target().id, "models": models}


def report(result: dict[str, Any]) -> str:
    machine = result["machine"]
    summary = [
        [
            m["model"],
            str(m["kernels_timed"]),
            str(len(m["moved"])),
            cell(m["tuning_s"], ".1f"),
            cell(m["untuned_s"] * 1e3, ".3f"),
            cell(m["tuned_s"] * 1e3, ".3f"),
            cell(m["ratio"], ".3f"),
            cell(m["untuned_1_s"] * 1e3, ".3f"),
            cell(m["tuned_1_s"] * 1e3, ".3f"),
            cell(m["ratio_1"], ".3f"),
        ]
        for m in result["models"]
    ]
    moved = [
        [m["model"], k["kernel"], k["variant"], cell(k["default_s"] * 1e3, ".3f"), cell(k["chosen_s"] * 1e3, ".3f")]
        for m in result["models"]
        for k in m["moved"]
    ]
    headers = ["model", "kernels tuned", "moved", "tuning s", "untuned ms", "tuned ms", "tuned / untuned"]
    headers += ["untuned ms, 1 thread", "tuned ms, 1 thread", "tuned / untuned, 1 thread"]
    return "\n".join(
        [
            f"{machine['cpu']} ({result['target']}), {machine['cores']} CPUs",
            "",
            markdown_table(headers, summary),
            "",
            "Kernels tuning moved off their untuned variant (seconds as tuning measured them, one core, hot):",
            "",
            markdown_table(["model", "kernel", "variant", "untuned ms", "chosen ms"], moved) if moved else "none",
        ]
    )


def bar_rows(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(bar, measured, limit, passed) of each bar that the run measured."""
    rows = []
    for m in result["models"]:
        if m["model"] == TIMED_MODEL:
            rows.append(
                (
                    f"tuning {TIMED_MODEL}, one worker",
                    f"{m['tuning_s']:.1f} s",
                    f"< {TUNING_BAR_S:.0f} s",
                    m["tuning_s"] < TUNING_BAR_S,
                )
            )
    worst = max(result["models"], key=lambda m: max(m["ratio"], m["ratio_1"]))
    ratio = max(worst["ratio"], worst["ratio_1"])
    rows.append(
        (
            "tuned / untuned, every model, both thread counts",
            f"worst {worst['model']}: {ratio:.3f}",
            f"<= {1 + NOISE:.2f}",
            ratio <= 1 + NOISE,
        )
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated built-in model names")
    parser.add_argument("--rounds", type=int, default=7, help="turns of each artifact per thread count (default 7)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    args = parser.parse_args(argv)
    names = model_names(parser, args.models)
    result = run(names, args.rounds)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    bars = bar_rows(result)
    print(
        "\n"
        + markdown_table(
            ["bar", "measured", "limit", "result"], [[b, m, lim, "PASS" if ok else "FAIL"] for b, m, lim, ok in bars]
        )
    )
    return 0 if all(ok for *_, ok in bars) or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
