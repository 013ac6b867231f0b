#!/usr/bin/env python3
"""A long fuzz run of the whole CLI (issue 13): seeded mutants of the example models through `farm submit` and, for
those that build, `farm run` on random inputs, each command a child process under a time and memory limit.

tests/test_fuzz.py plans 300 mutants in one process on every test run; this puts thousands through the real
commands, so that it also meets what only a build or a run does (code generation, linking, loading, the kernels
themselves). The mutants come from farm/tools/fuzz.py: a seed names the same models in both.

Every case ends in one outcome:

    ok            built (exit 0) and ran (exit 0)
    refused       exit 2 with one line on stderr (bad input, as the README's exit statuses say)
    build-failed  exit 1 (a build that failed: a bug unless the message says why the input is at fault)
    traceback     a Python traceback on stderr, or exit 2 with more than one line
    signal        killed by a signal (SIGSEGV, SIGABRT, ...)
    timeout       over --timeout seconds (the child is killed)
    over-memory   MemoryError or an allocator abort under the --memory-limit address-space cap

and the table lists the count per outcome, the slowest cases and the peak memory (largest resident set of one
command), then every case that is not ok or refused, with its kind and the last line it printed.

Usage: nice python3 benchmarks/bench_fuzz.py [--count N] [--seed S] [--timeout SECONDS] [--memory-limit GIB]
                                            [--duration SECONDS] [--keep DIR] [--json out.json]
Exit status: 0 when every case is ok or refused, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from farm.tools.fuzz import mutants  # noqa: E402

CLEAN = ("ok", "refused")
OUTCOMES = (*CLEAN, "build-failed", "traceback", "signal", "timeout", "over-memory")
_MEMORY_MARKERS = ("MemoryError", "std::bad_alloc", "out of memory", "Cannot allocate memory")


@dataclass
class Command:
    """One child command's end: exit status (negative: the signal), stderr, seconds, peak resident KiB."""

    returncode: int | None
    stderr: str
    seconds: float
    max_rss_kib: int


@dataclass
class Case:
    index: int
    kind: str
    outcome: str
    seconds: float
    max_rss_kib: int
    last_line: str


def run_limited(argv: list[str], timeout: float, memory_bytes: int) -> Command:
    """Run argv in its own process group under RLIMIT_AS; returncode None when it ran past `timeout`."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=limit,
                                 start_new_session=True)
        status, usage = _wait(child.pid, started + timeout)
        err.seek(0)
        text = err.read()[-20000:].decode(errors="replace")
    returncode = None if status is None else os.waitstatus_to_exitcode(status)
    return Command(returncode, text, time.monotonic() - started, usage.ru_maxrss if usage else 0)


def _wait(pid: int, deadline: float) -> tuple[int | None, resource.struct_rusage | None]:
    """The child's wait status and resource usage, or (None, usage) after killing its group at the deadline."""
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            _, _, usage = os.wait4(pid, 0)
            return None, usage
        time.sleep(0.02)


def classify(command: Command) -> str:
    """The outcome of a command that did not end in exit 0."""
    if command.returncode is None:
        return "timeout"
    if any(marker in command.stderr for marker in _MEMORY_MARKERS):
        return "over-memory"
    if command.returncode < 0:
        return "signal"
    if "Traceback (most recent call last)" in command.stderr:
        return "traceback"
    if command.returncode == 2:
        return "refused" if len(_lines(command.stderr)) == 1 else "traceback"
    return "build-failed"


def _lines(stderr: str) -> list[str]:
    """What a command printed on stderr, less the progress display of `farm submit`."""
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith("building ")]


def _random_inputs(model_path: Path, folder: Path) -> list[str]:
    """`--input NAME=FILE.npy` arguments with random values for every graph input that is not an initializer."""
    model = onnx.load(str(model_path), load_external_data=False)
    initialized = {tensor.name for tensor in model.graph.initializer}
    rng = np.random.default_rng(0)
    arguments = []
    for vi in model.graph.input:
        if vi.name in initialized:
            continue
        tensor_type = vi.type.tensor_type
        shape = [dim.dim_value for dim in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        values = rng.standard_normal(shape) if np.dtype(dtype).kind == "f" else rng.integers(0, 2, shape)
        path = folder / f"input{len(arguments)}.npy"
        np.save(path, values.astype(dtype))
        arguments += ["--input", f"{vi.name}={path}"]
    return arguments


def run_case(index: int, kind: str, data: bytes, folder: Path, timeout: float, memory_bytes: int) -> Case:
    """Submit the mutant (a local build) and, when it builds, run the artifact."""
    model = folder / f"case{index}.onnx"
    model.write_bytes(data)
    out = folder / f"out{index}"
    built = run_limited([sys.executable, "-m", "farm", "submit", str(model), "-o", str(out)], timeout, memory_bytes)
    commands = [built]
    if built.returncode == 0:
        artifacts = sorted(out.glob("*.farm"))
        ran = run_limited([sys.executable, "-m", "farm", "run", str(artifacts[0]),
                           *_random_inputs(model, folder)], timeout, memory_bytes) if artifacts else None
        if ran is None:
            outcome = "build-failed"
        else:
            commands.append(ran)
            outcome = "ok" if ran.returncode == 0 else classify(ran)
    else:
        outcome = classify(built)
    last = commands[-1]
    lines = _lines(last.stderr)
    return Case(index, kind, outcome, round(sum(c.seconds for c in commands), 2),
                max(c.max_rss_kib for c in commands), lines[-1][:240] if lines else "")


def report(cases: list[Case], args: argparse.Namespace, seconds: float) -> str:
    counts = {outcome: sum(case.outcome == outcome for case in cases) for outcome in OUTCOMES}
    peak = max(cases, key=lambda case: case.max_rss_kib, default=None)
    lines = [f"farm fuzz run: {len(cases)} of {args.count} mutants, seed {args.seed}, {seconds:.0f} s, timeout {args.timeout:g} s, "
             f"memory limit {args.memory_limit:g} GiB, {platform.node()} ({os.cpu_count()} CPUs, "
             f"{platform.machine()}, Python {platform.python_version()})", "",
             f"{'outcome':<14}{'count':>7}"]
    lines += [f"{outcome:<14}{count:>7}" for outcome, count in counts.items()]
    lines += ["", "slowest cases:"]
    lines += [f"  #{case.index:<6} {case.kind:<11} {case.outcome:<13} {case.seconds:6.1f} s"
              for case in sorted(cases, key=lambda case: -case.seconds)[:5]]
    if peak is not None:
        lines += ["", f"peak memory: {peak.max_rss_kib / 1024:.0f} MiB (case #{peak.index}, {peak.kind})"]
    bad = [case for case in cases if case.outcome not in CLEAN]
    if bad:
        lines += ["", "cases that are neither ok nor refused:"]
        lines += [f"  #{case.index:<6} {case.kind:<11} {case.outcome:<13} {case.last_line}" for case in bad]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000, help="mutants to run (default 3000)")
    parser.add_argument("--seed", type=int, default=13, help="the mutants' seed (default 13, test_fuzz's)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per command (default 60)")
    parser.add_argument("--memory-limit", type=float, default=4.0, help="GiB of address space per command (default 4)")
    parser.add_argument("--duration", type=float, help="start no new case after this many seconds (default: no cap)")
    parser.add_argument("--keep", type=Path, help="keep the cases that are neither ok nor refused in this folder")
    parser.add_argument("--json", type=Path, help="also write every case as JSON here")
    args = parser.parse_args()
    if args.count < 1 or args.timeout <= 0 or args.memory_limit <= 0:
        parser.error("--count, --timeout and --memory-limit must be positive")
    memory_bytes = int(args.memory_limit * (1 << 30))
    cases: list[Case] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="farm-fuzz-") as scratch:
        for index, (kind, data) in enumerate(mutants(random.Random(args.seed), args.count)):
            if args.duration and time.monotonic() - started > args.duration:
                break
            folder = Path(scratch) / str(index)
            folder.mkdir()
            case = run_case(index, kind, data, folder, args.timeout, memory_bytes)
            cases.append(case)
            if case.outcome not in CLEAN:
                print(f"#{index} {kind}: {case.outcome}: {case.last_line}", file=sys.stderr, flush=True)
                if args.keep:
                    args.keep.mkdir(parents=True, exist_ok=True)
                    (args.keep / f"case{index}-{kind}-{case.outcome}.onnx").write_bytes(data)
            subprocess.run(["rm", "-rf", str(folder)], check=False)
    print(report(cases, args, time.monotonic() - started))
    if args.json:
        args.json.write_text(json.dumps([asdict(case) for case in cases], indent=1))
    return 0 if all(case.outcome in CLEAN for case in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
