#!/usr/bin/env python3
"""How much a farm of N workers could speed up one build: every step timed serially on one core, the compile
units then scheduled on N simulated workers (issue 15 item 5: ResNet-50 plan 0.60 s, 139 units 3.30 s, link 0.63 s
gave at most 1.6x on 2 workers and 3.1x on 64; DenseNet-121 5.3x on 64; BERT-base 1.3x).

The process is first prepared as a farm worker's is before its pool forks (farm.distributed.worker.preload: the
compiler loaded, garbage collected rarely). For each model it times, in this process on one core: the plan as a farm worker makes it (import of the graph the
client split off, each weight read by its key, passes, validation, planning; the weights the submitter named by
sha256 are not hashed again: `assembly.plan_model` with `StoredBlobs`, after one untimed plan has warmed the
process as a coordinator's is), each compile unit on its own (`build.units.compile_unit`, the step a worker
runs: a kernel or a weight blob for this host), the link plan step (which the plan's worker runs after it has
dispatched the units, while they compile: the link plan, and the library's entry object compiled into the store,
where the link finds it), and the finish as the farm's link and finish steps run it (the link
plan read back, linking the library and putting the artifact's recipe into a file store: farm.distributed.recipes).
The plan and the finish are serial; the units are list-scheduled longest first on N workers (each unit on the
first free worker), beside the link plan. Speedup on N = (plan + every unit + link plan + finish) / (plan + the
longer of the N-worker schedule and the link plan + finish): what a farm of N idle workers gives at best,
transfers aside; the critical path in seconds (the
denominator, at the most workers asked for) is printed too, since a ratio also moves with the units' total (faster
compiles lower it). The download (`farm download`: the
artifact file written from the recipe, member by member from the store) is timed on its own, off the build's
critical path; a local build's finish writes the same file. Built-in models: the light models shipped
with onnx (light_resnet50, light_densenet121, ...), the examples, and bert_base (bert_style at BERT-base's size).

Targets (issue 29 item 4), the critical path on 64 workers in seconds, not a ratio (a ratio also rewards slower
units): light_resnet50 <= 0.5 s, light_densenet121 <= 1.0 s, bert_base <= 0.5 s.

Usage: python3 benchmarks/bench_critical.py [--models light_resnet50,light_densenet121,bert_base]
                                            [--workers 2,8,64] [--no-fail]
Exit status: 0 when every target (seconds on 64 workers, whatever --workers says) is met (or --no-fail), 1 when
one is not, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from bench_build import ALL_MODELS, model_path  # noqa: E402
from report import markdown_table  # noqa: E402

from farm.backends.llvm.compiler_runtime import runtime_object  # noqa: E402
from farm.backends.llvm.link import check_no_startup_code, linker_identity  # noqa: E402
from farm.backends.llvm.part import entry_object  # noqa: E402
from farm.backends.llvm.target import host_target  # noqa: E402
from farm.build import assembly  # noqa: E402
from farm.build.parts import BuiltUnits  # noqa: E402
from farm.build.units import compile_unit  # noqa: E402
from farm.distributed import recipes  # noqa: E402
from farm.distributed.worker import preload  # noqa: E402
from farm.frontend.external import StoredBlobs  # noqa: E402
from farm.frontend.split import split_model  # noqa: E402
from farm.store import FileStore  # noqa: E402
from farm.tools import examples  # noqa: E402

TARGETS = {"light_resnet50": 0.5, "light_densenet121": 1.0, "bert_base": 0.5}
"""Seconds of critical path on TARGET_WORKERS workers each model's build may take at most."""
TARGET_WORKERS = 64
EXTRA: dict[str, Callable[[], onnx.ModelProto]] = {
    "bert_base": lambda: examples.bert_style(seq=128, width=768, heads=12, layers=12, vocab=30522),
}


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def schedule_length(durations: list[float], workers: int) -> float:
    """The makespan of list scheduling, longest first, on `workers` identical workers."""
    free = [0.0] * workers
    for duration in sorted(durations, reverse=True):
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free)


def farm_plan(path: Path, folder: Path) -> Callable[[], object]:
    """The plan as a farm worker makes it: from the split graph (farm.frontend.split, done by the submitting
    client), each weight read by its key (here from memory, as the store's bytes are once read), so that the
    weights the submitter named are not hashed again (Graph.known_digests)."""
    split = split_model(path)
    blobs = {key: source.read() for key, source in split.blobs.items()}
    graph = folder / "farm-job" / path.name
    graph.parent.mkdir(parents=True, exist_ok=True)
    graph.write_bytes(split.graph)
    return lambda: assembly.plan_model(graph, external=StoredBlobs(lambda key, name: blobs[key]))


def measure(path: Path, folder: Path) -> dict[str, object]:
    """Plan, every unit and the finish of one host build, each timed on its own."""
    target = host_target()
    plan_model = farm_plan(path, folder)
    plan_model()  # a warm-up: the modules a plan imports on first use (the reference evaluator that folds
    # constants, ...) and their first calls' set-up are a long-running coordinator's once, not each job's
    plan_s, plan = _timed(plan_model)
    units = assembly.compile_units(plan, [target])
    compile_unit(units[0], None if not units[0].data_key else memoryview(plan.blobs[units[0].data_key]).cast("B"))
    objects, unit_s = {}, []  # timed after one warm-up unit: LLVM's set-up is a worker's once, not a unit's
    for unit in units:
        data = memoryview(plan.blobs[unit.data_key]).cast("B") if unit.data_key else None
        seconds, objects[unit.name] = _timed(lambda unit=unit, data=data: compile_unit(unit, data))
        unit_s.append(seconds)

    store = FileStore(folder / "store")
    keys = {name: hashlib.sha256(data).hexdigest() for name, data in objects.items()}  # the compile steps' puts
    packed = {unit.name for unit in units if unit.kind == "blob"}

    def link_plan_step() -> tuple[bytes, dict[str, str]]:
        """Farm._put_link_plan: the link plan, and each library's entry compiled and put into the store."""
        plan_json = assembly.link_plan([plan], [target], path.stem, "0" * 64, units)
        entries = {library["id"]: store.put(entry_object(library)) for library in assembly.libraries(plan_json)}
        return json.dumps(plan_json, sort_keys=True).encode(), entries

    def cached_entry(library: dict[str, object]) -> bytes:
        """Farm._entry: the entry the link plan step put, read and checked."""
        data = store.get(entry_keys[library["id"]])
        check_no_startup_code(data, "entry")
        return data

    link_plan_s, (plan_bytes, entry_keys) = _timed(link_plan_step)

    def finish() -> str:
        """The farm's link and finish: the link plan read back, the library from the objects, then the artifact's
        recipe (the weights and packed weights named by store key, unread: Farm._stored)."""
        plan_json = json.loads(plan_bytes)
        libraries: dict[str, bytes] = {}
        built = BuiltUnits(
            lambda name: recipes.stored(store, keys[name], len(objects[name])) if name in packed else objects[name],
            keys.__getitem__,
            libraries.__getitem__,
            lambda sha: recipes.stored(store, sha, plan.blobs[sha].nbytes),
            cached_entry,
        )
        libraries[target.id] = assembly.link_library(plan_json, target.id, built)
        store.put(libraries[target.id])
        manifest, members = assembly.artifact_contents(plan_json, built)
        return recipes.put_recipe(store, manifest, members, lambda keys: None)[0]

    linker_identity(), runtime_object(target)  # a worker's once (its first link), not each job's finish
    finish_s, recipe_key = _timed(finish)
    for weights in plan.blobs.values():  # what planning and the packing units put on the farm
        store.put(memoryview(weights).cast("B"))
    for name in packed:
        store.put(objects[name])
    download_s, _ = _timed(
        lambda: recipes.write_artifact_from(
            folder / f"{path.stem}.farm", recipes.read_recipe(store.get(recipe_key)), store.get
        )
    )
    shutil.rmtree(store.root)
    return {
        "model": path.stem,
        "plan": plan_s,
        "units": unit_s,
        "link_plan": link_plan_s,
        "finish": finish_s,
        "download": download_s,
    }


def critical_path(row: dict[str, object], workers: int) -> float:
    """Seconds a build waits on `workers` idle workers: the plan, then the units' schedule or the link plan, which
    the plan's worker makes while they compile (Farm._put_link_plan), whichever is longer, then the finish."""
    return row["plan"] + max(schedule_length(row["units"], workers), row["link_plan"]) + row["finish"]


def speedups(row: dict[str, object], workers: list[int]) -> dict[int, float]:
    serial = row["plan"] + sum(row["units"]) + row["link_plan"] + row["finish"]
    return {n: serial / critical_path(row, n) for n in workers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--models",
        default="light_resnet50,light_densenet121,bert_base",
        help="comma-separated models (light models, examples, bert_base)",
    )
    parser.add_argument("--workers", default="2,8,64", help="simulated worker counts (default 2,8,64)")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a target is missed")
    args = parser.parse_args(argv)
    names = [name for name in args.models.split(",") if name]
    unknown = [name for name in names if name not in (*ALL_MODELS, *EXTRA)]
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}")
    try:
        workers = sorted({int(n) for n in args.workers.split(",") if n})
    except ValueError:
        parser.error("--workers takes comma-separated integers")
    if not workers or min(workers) < 1:
        parser.error("--workers takes counts of at least 1")
    preload()  # the process as a worker's is before its pool forks: compiler loaded, garbage collected rarely
    rows = []
    with tempfile.TemporaryDirectory(prefix="farm-critical-") as tmp:
        for name in names:
            path = Path(tmp) / f"{name}.onnx"
            if name in EXTRA:
                onnx.save(EXTRA[name](), path)
            else:
                path = model_path(name, Path(tmp))
            rows.append(measure(path, Path(tmp)))
            print(
                f"  {name}: plan {rows[-1]['plan']:.2f} s, {len(rows[-1]['units'])} units "
                f"{sum(rows[-1]['units']):.2f} s, finish {rows[-1]['finish']:.2f} s, "
                f"download {rows[-1]['download']:.2f} s",
                flush=True,
            )
    table = [
        [
            r["model"],
            f"{r['plan']:.2f}",
            str(len(r["units"])),
            f"{sum(r['units']):.2f}",
            f"{max(r['units']):.2f}",
            f"{r['link_plan']:.2f}",
            f"{r['finish']:.2f}",
            f"{r['download']:.2f}",
            f"{critical_path(r, max(workers)):.2f}",
            *(f"{s:.1f}x" for s in speedups(r, workers).values()),
        ]
        for r in rows
    ]
    print(
        markdown_table(
            [
                "model",
                "plan s",
                "units",
                "units s",
                "longest s",
                "link plan s",
                "finish s",
                "download s",
                f"critical s ({max(workers)} workers)",
                *(f"{n} workers" for n in workers),
            ],
            table,
        )
    )
    met = True
    for row in rows:
        target = TARGETS.get(row["model"])
        if target is not None:
            seconds = critical_path(row, TARGET_WORKERS)
            met &= seconds <= target
            print(
                f"target: {row['model']} critical path <= {target:.2f} s on {TARGET_WORKERS} workers: "
                f"{seconds:.2f} s {'MET' if seconds <= target else 'NOT MET'}"
            )
    return 0 if met or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
