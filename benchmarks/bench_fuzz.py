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

--farm (issue 30) builds the mutants on a real farm instead: a redis-server with the farm's production ACL
(tests/farm_services.py's FARM_ACL), two `farm worker` processes logged in as farm-worker with the production
defaults (no shortened time limits), each under --memory-limit as its RLIMIT_DATA (inherited by its pool processes)
and as FARM_STEP_MEMORY_BYTES (the worker's own limit on each step), and every mutant sent by
`farm submit --broker URL` with a submitter's credentials, --jobs of them at once. Each case is classified as above
(`farm run` stays local), and the run also reports, all of which must be zero:

    worker deaths   a worker process that exited (restarted at once, and the run goes on), or a pool process that
                    died and Celery replaced (billiard's "Process ... exited with" in the worker's log)
    hung jobs       a `farm submit` still waiting at --timeout (the job is then cancelled with `farm cancel`)
    tracebacks      a Python traceback on a submit's stderr, or in a worker's log (a step that failed its job with
                    farm's own error, JobFailed, is logged in one line as an expected exception: counted apart)

and after the last mutant, whether the farm still builds and runs a legitimate model (examples/tiny_cnn.onnx).

Usage: nice python3 benchmarks/bench_fuzz.py [--count N] [--seed S] [--timeout SECONDS] [--memory-limit GIB]
                                            [--duration SECONDS] [--keep DIR] [--json out.json]
                                            [--farm [--jobs N]]
Exit status: 0 when every case is ok or refused (and with --farm: no worker death, hung job or traceback, and the
legitimate model built and ran), 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

from farm.tools.fuzz import mutants  # noqa: E402

FARM_WORKERS = 2
LOCAL_TIMEOUT_S, FARM_TIMEOUT_S = 60.0, 300.0
"""--timeout's default per command: a local build or run, and a farm submit (its upload, the job on the farm and
the download): past it a farm job counts as hung."""
LEGITIMATE_MODEL = CHECKOUT / "examples" / "tiny_cnn.onnx"
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
    stage: str = "submit"
    """The command that ended the case: submit, or run once it built."""
    job: str = ""
    """The farm job's id (--farm), from submit's first line on stderr."""
    traceback: bool = False
    """Whether a command of the case printed a Python traceback, whatever its exit status."""


def run_limited(argv: list[str], timeout: float, memory_bytes: int) -> Command:
    """Run argv in its own process group under RLIMIT_AS; returncode None when it ran past `timeout`. Threads may
    call it at once (--farm --jobs): the child runs only setrlimit before exec, which takes no lock."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)}
    started = time.monotonic()
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=err, env=env, preexec_fn=limit, start_new_session=True
        )
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


_PROGRESS = re.compile(r"^(building |farm: job \S+ submitted; |farm: [\w.-]+\.onnx(?: on the farm)?: )")
"""Lines of `farm submit`'s progress on stderr: a local build's row, and on a farm the job id, the upload's and the
job's phase lines (`farm: MODEL.onnx[ on the farm]: ...`; an error line is `farm: error: ...`)."""
_JOB_ID = re.compile(r"^farm: job (\S+) submitted; ", re.MULTILINE)


def _lines(stderr: str) -> list[str]:
    """What a command printed on stderr, less the progress display of `farm submit`."""
    return [line for line in stderr.splitlines() if line.strip() and not _PROGRESS.match(line)]


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


def run_case(
    index: int, kind: str, data: bytes, folder: Path, timeout: float, memory_bytes: int, broker: str | None = None
) -> Case:
    """Submit the mutant (a local build, or a farm job with `broker`) and, when it builds, run the artifact here."""
    model = folder / f"case{index}.onnx"
    model.write_bytes(data)
    out = folder / f"out{index}"
    on_farm = ["--broker", broker] if broker else []
    built = run_limited(
        [sys.executable, "-m", "farm", "submit", str(model), "-o", str(out), *on_farm], timeout, memory_bytes
    )
    commands = [built]
    if built.returncode == 0:
        artifacts = sorted(out.glob("*.farm"))
        ran = (
            run_limited(
                [sys.executable, "-m", "farm", "run", str(artifacts[0]), *_random_inputs(model, folder)],
                timeout,
                memory_bytes,
            )
            if artifacts
            else None
        )
        if ran is None:
            outcome = "build-failed"
        else:
            commands.append(ran)
            outcome = "ok" if ran.returncode == 0 else classify(ran)
    else:
        outcome = classify(built)
    last = commands[-1]
    lines = _lines(last.stderr)
    job = _JOB_ID.search(built.stderr)
    return Case(
        index,
        kind,
        outcome,
        round(sum(c.seconds for c in commands), 2),
        max(c.max_rss_kib for c in commands),
        lines[-1][:240] if lines else "",
        "run" if len(commands) > 1 else "submit",
        job.group(1) if job else "",
        any("Traceback (most recent call last)" in c.stderr for c in commands),
    )


def report(cases: list[Case], args: argparse.Namespace, seconds: float, farm: FarmFindings | None = None) -> str:
    counts = {outcome: sum(case.outcome == outcome for case in cases) for outcome in OUTCOMES}
    peak = max(cases, key=lambda case: case.max_rss_kib, default=None)
    where = (
        f"on a farm of {FARM_WORKERS} workers ({args.memory_limit:g} GiB each), {args.jobs} submits at once"
        if farm
        else "local builds"
    )
    lines = [
        f"farm fuzz run: {len(cases)} of {args.count} mutants, {where}, seed {args.seed}, {seconds:.0f} s "
        f"({60 * len(cases) / max(seconds, 1e-9):.1f} mutants a minute), timeout {args.timeout:g} s, "
        f"memory limit {args.memory_limit:g} GiB, {platform.node()} ({os.cpu_count()} CPUs, {_cpu_model()}, "
        f"{platform.machine()}, Python {platform.python_version()})",
        "",
        f"{'outcome':<14}{'count':>7}",
    ]
    lines += [f"{outcome:<14}{count:>7}" for outcome, count in counts.items()]
    lines += ["", "slowest cases:"]
    lines += [
        f"  #{case.index:<6} {case.kind:<11} {case.outcome:<13} {case.seconds:6.1f} s"
        for case in sorted(cases, key=lambda case: -case.seconds)[:5]
    ]
    if peak is not None:
        whose = "of one client command" if farm else "of one command"
        lines += ["", f"peak memory {whose}: {peak.max_rss_kib / 1024:.0f} MiB (case #{peak.index}, {peak.kind})"]
    bad = [case for case in cases if case.outcome not in CLEAN]
    if bad:
        lines += ["", "cases that are neither ok nor refused:"]
        lines += [f"  #{case.index:<6} {case.kind:<11} {case.outcome:<13} {case.last_line}" for case in bad]
    if farm:
        lines += ["", farm.report()]
    return "\n".join(lines)


def _cpu_model() -> str:
    """The host's CPU model name (lscpu's), or its architecture where /proc/cpuinfo doesn't say."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU model unknown"


# -- --farm: the mutants through a real farm -------------------------------------------------------------------


@dataclass
class FarmFindings:
    """What a farm run found besides the cases' outcomes: each list must stay empty."""

    worker_exits: list[str] = field(default_factory=list)
    """Worker processes that exited (each was started again): name, exit status, the last line of its log."""
    pool_deaths: list[str] = field(default_factory=list)
    """Pool processes that died and Celery replaced: billiard's log line."""
    hung: list[str] = field(default_factory=list)
    """Submits that ran past --timeout: the case, its job and what `farm cancel` answered."""
    submit_tracebacks: list[str] = field(default_factory=list)
    """Cases whose submit or run printed a Python traceback."""
    log_tracebacks: list[str] = field(default_factory=list)
    """Worker log records holding a traceback that is not a handled task failure: the record's first line and
    the exception's last line."""
    handled_failures: int = 0
    """Celery's one-line records of a step that failed its job (JobFailed, the tasks' expected exception): counted
    apart."""
    memory_failures: int = 0
    """Of those, the jobs a step failed for needing more than the step memory limit (FARM_STEP_MEMORY_BYTES)."""
    legitimate: str = "not run"
    """How the legitimate model fared after the mutants: ok, or what went wrong."""

    @property
    def clean(self) -> bool:
        return not (
            self.worker_exits or self.pool_deaths or self.hung or self.submit_tracebacks or self.log_tracebacks
        ) and self.legitimate.startswith("ok")

    def report(self) -> str:
        rows = [
            ("worker deaths (worker exits, restarted)", self.worker_exits),
            ("worker deaths (pool processes replaced)", self.pool_deaths),
            ("hung jobs (cancelled)", self.hung),
            ("tracebacks in submit or run output", self.submit_tracebacks),
            ("tracebacks in worker logs", self.log_tracebacks),
        ]
        lines = [f"{label:<42}{len(found):>6}" for label, found in rows]
        lines += [
            f"{'handled task failures (JobFailed) in logs':<42}{self.handled_failures:>6}",
            f"{'  of which over the step memory limit':<42}{self.memory_failures:>6}",
            f"legitimate model afterwards ({LEGITIMATE_MODEL.name}): {self.legitimate}",
        ]
        for label, found in rows:
            lines += [f"  {label}: {item}" for item in found[:20]]
            if len(found) > 20:
                lines.append(f"  {label}: ... and {len(found) - 20} more")
        return "\n".join(lines)


_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+: [A-Z]+/[^\]]*\] ")
"""The first line of a record in a Celery worker's log: `[2026-12-01 10:00:00,123: ERROR/ForkPoolWorker-1] ...`."""
_HANDLED = re.compile(r"Task farm\.\w+\[[^\]]+\] raised expected: JobFailed\(")
"""Celery's one line for a step that failed its job with farm's own error (FarmTask.throws)."""
_POOL_DEATH = re.compile(r"Process '[^']+' pid:\d+ exited with ")


_CHAINS = (
    "Traceback (most recent call last)",
    "The above exception was the direct cause",
    "During handling of the above exception",
)


def scan_worker_log(text: str, findings: FarmFindings, name: str) -> None:
    """Count a worker log's pool deaths, handled task failures and tracebacks into `findings`.

    A log is a series of records, each a first line in Celery's format and the lines below it (a traceback); the
    text before the first record is the worker's banner. A record is a handled task failure when Celery reports a
    task that raised JobFailed, the expected exception of farm's tasks (a step failed its job with one of farm's own
    errors, a refusal naming what is wrong), in one line; any traceback is a finding (an unexpected exception, even
    one that failed its job through the task's on_failure).
    """
    records: list[list[str]] = [[]]
    for line in text.splitlines():
        if _RECORD.match(line):
            records.append([line])
        else:
            records[-1].append(line)
    for record in records:
        head = record[0] if record else ""
        if _POOL_DEATH.search(head):
            findings.pool_deaths.append(f"{name}: {head[:240]}")
        if _HANDLED.search(head):
            findings.handled_failures += 1
            findings.memory_failures += "needed more memory than" in head
        if any(line.startswith(_CHAINS[0]) for line in record):
            raised = [line for line in record[1:] if line.strip() and not line.startswith((" ", "\t", *_CHAINS))]
            findings.log_tracebacks.append(f"{name}: {head[:160]} | {(raised[-1] if raised else '')[:160]}")


class FuzzFarm:
    """A redis-server with the farm's production ACL and FARM_WORKERS `farm worker` processes logged in as
    farm-worker, each under a memory limit; a worker that exits is counted and started again."""

    def __init__(self, start_redis, folder: Path, memory_bytes: int, findings: FarmFindings) -> None:
        from tests.farm_services import FARM_ACL, Farm

        self.folder, self.memory_bytes, self.findings = folder, memory_bytes, findings
        self.farm = Farm(start_redis(acl=FARM_ACL), folder)
        for number in range(1, FARM_WORKERS + 1):
            self.farm.workers.append(self._worker(f"fuzz{number}@{platform.node()}").start())

    @property
    def url(self) -> str:
        """A submitter's URL (farm-submitter): what every submit and cancel uses."""
        return self.farm.url

    def _worker(self, name: str):
        """A `farm worker` (concurrency 1, the production defaults: tests/farm_services.py clears the FARM_*
        overrides) whose process starts under RLIMIT_DATA, which its pool processes inherit, with
        FARM_STEP_MEMORY_BYTES the same (a tree without that setting ignores it)."""
        from tests.farm_services import FarmWorker

        memory_bytes = self.memory_bytes

        class LimitedWorker(FarmWorker):
            def start(self) -> LimitedWorker:
                command = [
                    sys.executable,
                    "-m",
                    "farm",
                    "worker",
                    "--broker",
                    self.broker,
                    "--hostname",
                    self.name,
                    "--concurrency",
                    str(self.concurrency),
                    "--loglevel",
                    "INFO",
                ]

                def limit() -> None:
                    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
                    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

                with open(self.log_path, "ab") as log:
                    self.process = subprocess.Popen(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=self.env,
                        preexec_fn=limit,
                        start_new_session=True,
                    )
                self._wait_until_ready()
                return self

        return LimitedWorker(self.farm.worker_url, name, self.folder, env={"FARM_STEP_MEMORY_BYTES": str(memory_bytes)})

    def check(self) -> None:
        """Start again every worker whose process has exited, noting it as a death."""
        for worker in self.farm.workers:
            status = worker.process.poll() if worker.process else None
            if status is not None:
                tail = worker.log_tail(1).strip()
                self.findings.worker_exits.append(f"{worker.name} exited with {status}: {tail[:200]}")
                print(f"worker {worker.name} exited with {status}; starting it again", file=sys.stderr, flush=True)
                worker.start()

    def cancel(self, case: Case) -> None:
        """Cancel a hung case's job and note it."""
        if not case.job:
            self.findings.hung.append(f"#{case.index} {case.kind}: no job id on stderr (the upload hung)")
            return
        cancelled = subprocess.run(
            [sys.executable, "-m", "farm", "cancel", case.job, "--broker", self.url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        answer = (cancelled.stdout + cancelled.stderr).strip().splitlines()
        self.findings.hung.append(
            f"#{case.index} {case.kind} job {case.job}: farm cancel: "
            f"{answer[-1][:160] if answer else cancelled.returncode}"
        )

    def legitimate_build(self, folder: Path, timeout: float, memory_bytes: int) -> str:
        """Build the example model on the farm and run it here: `ok (seconds)`, or what went wrong."""
        folder.mkdir()
        model = folder / LEGITIMATE_MODEL.name
        model.write_bytes(LEGITIMATE_MODEL.read_bytes())
        out = folder / "out"
        built = run_limited(
            [sys.executable, "-m", "farm", "submit", str(model), "-o", str(out), "--broker", self.url],
            timeout,
            memory_bytes,
        )
        if built.returncode != 0:
            return f"submit {classify(built)}: {(_lines(built.stderr) or [''])[-1][:200]}"
        artifact = out / f"{model.stem}.farm"
        ran = run_limited(
            [sys.executable, "-m", "farm", "run", str(artifact), *_random_inputs(model, folder)], timeout, memory_bytes
        )
        if ran.returncode != 0:
            return f"run {classify(ran)}: {(_lines(ran.stderr) or [''])[-1][:200]}"
        return f"ok (built on the farm in {built.seconds:.1f} s, ran in {ran.seconds:.1f} s)"

    def scan_logs(self, keep: Path | None) -> None:
        for worker in self.farm.workers:
            text = worker.log_path.read_text(errors="replace") if worker.log_path.exists() else ""
            scan_worker_log(text, self.findings, worker.name)
            if keep:
                keep.mkdir(parents=True, exist_ok=True)
                (keep / worker.log_path.name).write_text(text)

    def close(self) -> None:
        self.farm.close()


def run_on_farm(args: argparse.Namespace, memory_bytes: int) -> tuple[list[Case], FarmFindings]:
    """Every mutant through `farm submit --broker` on a fresh farm, args.jobs at once; then the legitimate model."""
    from tests.services import _started_servers

    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
    findings = FarmFindings()
    cases: list[Case] = []
    started = time.monotonic()
    source = enumerate(mutants(random.Random(args.seed), args.count))
    with tempfile.TemporaryDirectory(prefix="farm-fuzz-") as scratch, _started_servers() as start_redis:
        farm = FuzzFarm(start_redis, Path(scratch), memory_bytes, findings)
        try:
            pending: dict[Future[Case], tuple[bytes, Path]] = {}
            more = True
            with ThreadPoolExecutor(args.jobs) as pool:
                while more or pending:
                    while more and len(pending) < args.jobs:
                        item = next(source, None)
                        if item is None or (args.duration and time.monotonic() - started > args.duration):
                            more = False
                            break
                        index, (kind, data) = item
                        folder = Path(scratch) / str(index)
                        folder.mkdir()
                        pending[
                            pool.submit(run_case, index, kind, data, folder, args.timeout, memory_bytes, farm.url)
                        ] = (data, folder)
                    done, _ = wait(pending, timeout=5, return_when=FIRST_COMPLETED)
                    farm.check()
                    for future in done:
                        data, folder = pending.pop(future)
                        case = future.result()
                        if case.outcome == "timeout" and case.stage == "submit":
                            farm.cancel(case)
                        if case.traceback:
                            findings.submit_tracebacks.append(
                                f"#{case.index} {case.kind} {case.stage}: {case.last_line}"
                            )
                        cases.append(case)
                        _note(case, data, args)
                        subprocess.run(["rm", "-rf", str(folder)], check=False)
            farm.check()
            findings.legitimate = farm.legitimate_build(Path(scratch) / "legitimate", args.timeout, memory_bytes)
            farm.check()
        finally:
            farm.close()
            farm.scan_logs(args.keep)
    return sorted(cases, key=lambda case: case.index), findings


def _note(case: Case, data: bytes, args: argparse.Namespace) -> None:
    """Say a case that is neither ok nor refused on stderr at once, and keep its model with --keep."""
    if case.outcome in CLEAN:
        return
    print(f"#{case.index} {case.kind}: {case.outcome}: {case.last_line}", file=sys.stderr, flush=True)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        (args.keep / f"case{case.index}-{case.kind}-{case.outcome}.onnx").write_bytes(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000, help="mutants to run (default 3000)")
    parser.add_argument("--seed", type=int, default=13, help="the mutants' seed (default 13, test_fuzz's)")
    parser.add_argument(
        "--timeout",
        type=float,
        help=f"seconds per command (default {LOCAL_TIMEOUT_S:g}; with --farm "
        f"{FARM_TIMEOUT_S:g}, past which a submit's job counts as hung)",
    )
    parser.add_argument(
        "--memory-limit",
        type=float,
        default=4.0,
        help="GiB of address space per command, and with --farm each worker's RLIMIT_DATA and "
        "FARM_STEP_MEMORY_BYTES (default 4)",
    )
    parser.add_argument("--duration", type=float, help="start no new case after this many seconds (default: no cap)")
    parser.add_argument("--keep", type=Path, help="keep the cases that are neither ok nor refused in this folder")
    parser.add_argument("--json", type=Path, help="also write every case as JSON here")
    parser.add_argument(
        "--farm",
        action="store_true",
        help=f"build on a real farm of {FARM_WORKERS} workers (a redis-server, `farm worker`s) started "
        "here, and report worker deaths, hung jobs and tracebacks",
    )
    parser.add_argument("--jobs", type=int, default=2, help="--farm: submits at once (default 2)")
    args = parser.parse_args()
    if args.timeout is None:
        args.timeout = FARM_TIMEOUT_S if args.farm else LOCAL_TIMEOUT_S
    if args.count < 1 or args.timeout <= 0 or args.memory_limit <= 0 or args.jobs < 1:
        parser.error("--count, --timeout, --memory-limit and --jobs must be positive")
    memory_bytes = int(args.memory_limit * (1 << 30))
    started = time.monotonic()
    if args.farm:
        cases, findings = run_on_farm(args, memory_bytes)
        print(report(cases, args, time.monotonic() - started, findings))
        if args.json:
            args.json.write_text(
                json.dumps({"cases": [asdict(case) for case in cases], "farm": asdict(findings)}, indent=1)
            )
        return 0 if findings.clean and all(case.outcome in CLEAN for case in cases) else 1
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="farm-fuzz-") as scratch:
        for index, (kind, data) in enumerate(mutants(random.Random(args.seed), args.count)):
            if args.duration and time.monotonic() - started > args.duration:
                break
            folder = Path(scratch) / str(index)
            folder.mkdir()
            case = run_case(index, kind, data, folder, args.timeout, memory_bytes)
            cases.append(case)
            _note(case, data, args)
            subprocess.run(["rm", "-rf", str(folder)], check=False)
    print(report(cases, args, time.monotonic() - started))
    if args.json:
        args.json.write_text(json.dumps([asdict(case) for case in cases], indent=1))
    return 0 if all(case.outcome in CLEAN for case in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
