#!/usr/bin/env python3
"""Benchmark the farm (Celery workers over Redis) against the bars of the farm issue, in one run.

It starts its own redis-server and `farm worker` processes (each `--concurrency 1`, started the way the tests start
them: tests.services.RedisServer, tests.farm_services.FarmWorker) and measures, on light ResNet-50 (the onnx
package's light_resnet50.onnx):

- local: wall seconds of `farm submit MODEL` without a broker (the local executor, one process per core), from the
  command's start to its exit (the artifact written);
- farm, 1 worker and 2 workers: wall seconds of `farm submit MODEL --no-cache` against the farm, from the command's
  start to the artifact downloaded (every kernel and blob compiled again); also the job's own seconds as the farm
  records them (created -> finished) and the client's share (the rest: start-up, upload, polling, download);
- warm resubmit: the same with the cache on, after the builds above (zero compile tasks: planning, link, finish);
- worker time per task name: from the workers' logs ("Task farm.X[...] succeeded in Ys"), summed per run, which
  shows what a build's time goes to, and the best 2 workers could do over 1 if only compile and pack split;
- broker throughput: `farm.finish` on an unknown job id (the task returns at once) sent --tasks times with
  `app.send_task` while the 2 workers don't consume `control` (send rate), then consumed by them: tasks/s from
  the resume until the `control` queue is empty and no message is left unacknowledged;
- Redis used memory across a stream of distinct builds under the cap: --store-builds resnet18_style models (a
  seed each: the same kernels, different weights) built one after the other by `farm submit` on a fresh Redis
  and 2 workers with FARM_STORE_MAX_BYTES=--store-cap; after each build, Redis' used memory (INFO memory
  used_memory) and its high-water mark (used_memory_peak), and the store's own count (`farm store stats`).
  `--store-only` runs this measurement alone.

With --waiting-clients N it measures only what idle waiting costs Redis: N `farm wait` processes, each on a job of
its own that makes no progress (a record in state compiling, no worker: every client also checks for live workers),
and Redis' `INFO stats` total_commands_processed over --window seconds, less the same window without them:
commands per second per waiting client.

Every timed figure is the median of --repeat runs; before the timed runs the workers are warmed by a build of
tiny_cnn (their first task imports LLVM). Workers use production time limits, not the tests' short ones, and
redis-server fsyncs its append-only file every second, as deploy/redis.conf does. The machine's load average
before the run is printed: other processes on the cores skew every figure, the 2-worker ones most.

With --failover, only this (production defaults, WORKER_ENV): light ResNet-50 `--no-cache` on 2 workers, timed
without a fault, then again with one worker SIGKILLed (its whole process group, as when a host dies) as soon as
it runs a task; the figure is the extra seconds the kill costs the job (bar: <= FAILOVER_BAR_S). The lost tasks
are dispatched again when the dead worker's lease lapses (FARM_WORKER_LEASE_SECONDS), not after Redis'
visibility timeout (720 s).

With --data-plane, only this (issue 29: what a model's bytes cost on their way through the farm), per model of
--models (light_densenet121, light_resnet50, bert_base: farm.tools.examples.bert_style at BERT-base's size,
bert_base_external: the same saved as a dynamo export is, every tensor in model.onnx.data, and huge: --huge-layers
8192x8192 float32 MatMuls in external data, 1.88 GB by default, --huge-full for issue 15's 2.68 GB):

- local cold and warm: `farm submit MODEL` without a broker, with --no-cache, then without it (after one untimed
  run): wall seconds of the command;
- farm cold: on a fresh farm per model and per repeat (a redis-server loading deploy/redis.conf itself, only its
  port, bind address, folder and log overridden, with the ACL file `farm acl` writes; 2 workers logged in as
  farm-worker, warmed by tiny_cnn builds, so the store holds no entry of the model), `farm submit MODEL --no-cache`
  as farm-submitter: wall seconds to the artifact downloaded, the job's phases (the states its events channel
  publishes), the bytes Redis read and wrote meanwhile (INFO stats total_net_input_bytes and
  total_net_output_bytes; the benchmark's own INFO calls and subscription taken off) against the model's size
  (external data included), and Redis' used_memory sampled every SAMPLE_S against the store's cap
  (FARM_STORE_MAX_BYTES of this environment, default 2 GiB, given to the workers); then `farm store stats`;
- farm warm resubmit: the same submission without --no-cache, wall seconds;
- whether every farm artifact is the local build's, byte for byte (sha256).

Usage: python3 benchmarks/bench_farm.py [--repeat N] [--tasks N] [--store-builds N] [--store-cap BYTES]
                                       [--store-only] [--failover] [--json out.json] [--no-fail]
       python3 benchmarks/bench_farm.py --waiting-clients N [--window S] [--json out.json]
       python3 benchmarks/bench_farm.py --data-plane [--models a,b] [--huge-layers N | --huge-full] [--repeat N]
                                       [--json out.json] [--no-fail]
Exit status: 0 when every bar passes (or --no-fail), 1 when a bar fails, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests/ holds the real-service helpers the benchmark reuses

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import redis  # noqa: E402
from onnx import helper  # noqa: E402
from redis.connection import Connection, parse_url  # noqa: E402
from report import cell, markdown_table  # noqa: E402

from farm.backends.llvm.target import host_target  # noqa: E402
from farm.defaults import store_max_bytes  # noqa: E402
from farm.distributed import redis_keys  # noqa: E402
from farm.distributed.acl import ROLES, Role, user_line  # noqa: E402
from farm.distributed.task_messages import TaskName  # noqa: E402
from farm.tools.examples import EXAMPLES, bert_style, resnet18_style  # noqa: E402
from tests.farm_services import FarmWorker  # noqa: E402
from tests.services import RedisServer, redis_server_binary  # noqa: E402

MODEL = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"
SCALING_BAR = 1.7  # 2 workers at least this many times faster than 1
WARM_BAR_S = 2.0  # warm resubmit under this many seconds
LOCAL_BAR = 1.2  # the farm on 2 workers within this factor of the local executor
STORE_BAR = 1.25  # Redis' peak used memory under the store's cap at most this many times the cap
MIB = 1 << 20
# Production limits (farm.defaults), not the tests' short ones: a benchmark must not trigger redelivery.
WORKER_ENV = {
    "FARM_TASK_SOFT_TIME_LIMIT": "600",
    "FARM_TASK_TIME_LIMIT": "660",
    "FARM_VISIBILITY_TIMEOUT": "720",
    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
}
TASK_NAMES = tuple(task.value for task in TaskName if task not in (TaskName.TUNE_KERNEL, TaskName.COMPILE_CL_KERNEL))
CLI_TIMEOUT_S = 600
FAILOVER_BAR_S = 30.0  # a SIGKILLed worker costs a job at most this many seconds
DRAIN_TIMEOUT_S = 300
CLIENT_START_TIMEOUT_S = 120


@dataclass
class Bar:
    """One bar of the issue: what was measured, against what limit, and whether it passed."""

    name: str
    measured: str
    limit: str
    passed: bool

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass
class Build:
    """The median of several timed `farm submit` runs of one configuration."""

    config: str
    wall_s: float  # median wall seconds of the CLI, start to artifact on disk
    job_s: float | None  # median seconds the farm recorded for the job (created -> finished); None when local
    compile_tasks: int | None  # compile tasks of one run (kernels + blobs dispatched); None when local
    runs: list[float]  # every run's wall seconds
    task_s: dict[str, float] = field(default_factory=dict)  # per run: seconds the workers spent in each task name

    @property
    def client_s(self) -> float | None:
        """What the job's record doesn't cover: CLI start-up, upload, enqueueing, polling and download."""
        return None if self.job_s is None else self.wall_s - self.job_s


# -- running farm --------------------------------------------------------------------------------------------------


def cli(
    args: Sequence[str], cwd: Path, broker: str | None, extra_env: dict[str, str] | None = None
) -> tuple[float, dict[str, Any]]:
    """Run `farm ARGS --json` as a user would; (wall seconds, its JSON). Without a broker the build is local.
    `extra_env` is added to this process's environment (FARM_CACHE_DIR, say)."""
    env = {key: value for key, value in os.environ.items() if key != "FARM_BROKER_URL"} | (extra_env or {})
    if broker:
        env["FARM_BROKER_URL"] = broker
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "farm", *args, "--json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"farm {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return wall, json.loads(done.stdout.strip().splitlines()[-1])


def timed_builds(
    config: str,
    model: Path,
    folder: Path,
    broker: str | None,
    repeat: int,
    no_cache: bool = True,
    workers: Sequence[FarmWorker] = (),
) -> Build:
    """`farm submit MODEL` `repeat` times (with --no-cache on a farm unless told otherwise); the medians.

    With `workers`, their logs over these runs give the seconds spent in each task name (mean per run).
    """
    walls, jobs, tasks = [], [], None
    offsets = [log_size(worker) for worker in workers]
    for index in range(repeat):
        out = folder / f"{config}-{index}"
        args = ["submit", str(model), "-o", str(out)] + (["--no-cache"] if broker and no_cache else [])
        wall, result = cli(args, folder, broker)
        if not Path(result["artifact"]).is_file():
            raise RuntimeError(f"{config}: no artifact at {result['artifact']}")
        walls.append(wall)
        if broker:
            jobs.append(float(result["seconds"]))
            tasks = int(result["compiled"])  # `submit --json` names the units it compiled (schemas.BUILD_KEYS)
        print(
            f"  {config} run {index + 1}: {wall:.2f} s"
            + (f" (job {result['seconds']:.2f} s, {result['compiled']} compile tasks)" if broker else ""),
            flush=True,
        )
    spent = task_seconds(workers, offsets)
    return Build(
        config,
        statistics.median(walls),
        statistics.median(jobs) if jobs else None,
        tasks,
        walls,
        {name: seconds / repeat for name, seconds in spent.items()},
    )


TASK_DONE = re.compile(r"Task (farm\.\w+)\[[^\]]+\] succeeded in ([0-9.eE+-]+)s")


def log_size(worker: FarmWorker) -> int:
    return worker.log_path.stat().st_size if worker.log_path.exists() else 0


def task_seconds(workers: Sequence[FarmWorker], offsets: Sequence[int]) -> dict[str, float]:
    """Seconds spent in each task name, summed over the workers' log lines written since `offsets` ({}: none)."""
    if not workers:
        return {}
    spent = dict.fromkeys(TASK_NAMES, 0.0)
    for worker, offset in zip(workers, offsets):
        with open(worker.log_path, "rb") as log:
            log.seek(offset)
            for match in TASK_DONE.finditer(log.read().decode(errors="replace")):
                spent[match.group(1)] = spent.get(match.group(1), 0.0) + float(match.group(2))
    return spent


def warm_up(folder: Path, broker: str, extra_env: dict[str, str] | None = None) -> None:
    """Build tiny_cnn with the cache off, so that every worker's pool has imported LLVM before timing starts."""
    model = folder / "tiny_cnn.onnx"
    if not model.exists():
        onnx.save(EXAMPLES["tiny_cnn"](), str(model))
    for _ in range(2):
        cli(["submit", str(model), "-o", str(folder / "warmup"), "--no-cache"], folder, broker, extra_env)


def broker_throughput(broker: str, workers: Sequence[FarmWorker], tasks: int) -> dict[str, float]:
    """Tasks/s through the broker: `tasks` farm.finish tasks on an unknown job id (each returns at once).

    The workers stop consuming `control` while the tasks are sent (timed on its own: what one client, or plan_job
    dispatching a job's units, pays per task), then resume; consumption is timed from the resume until the queue
    is empty and no message is left unacknowledged.
    """
    from farm.distributed.celery_app import make_app

    app = make_app(broker)
    names = [worker.name for worker in workers]
    connection = redis.Redis.from_url(broker)
    try:
        app.control.cancel_consumer("control", destination=names, reply=True, timeout=5)
        started = time.perf_counter()
        with app.producer_or_acquire() as producer:
            for index in range(tasks):
                app.send_task("farm.finish", args=[f"bench-unknown-{index}"], queue="control", producer=producer)
        sent = time.perf_counter() - started
        queued = connection.llen("control")
        started = time.perf_counter()
        app.control.add_consumer("control", destination=names, reply=True, timeout=5)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while connection.llen("control") or connection.hlen("unacked"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{connection.llen('control')} tasks still queued after {DRAIN_TIMEOUT_S} s")
            time.sleep(0.002)
        consumed = time.perf_counter() - started
    finally:
        app.control.add_consumer("control", destination=names, reply=True, timeout=5)
        connection.close()
    if queued != tasks:
        raise RuntimeError(f"{queued} of {tasks} tasks were queued while the workers were paused")
    return {
        "tasks": tasks,
        "workers": len(names),
        "send_s": sent,
        "sent_per_s": tasks / sent,
        "send_ms_per_task": sent / tasks * 1e3,
        "consume_s": consumed,
        "tasks_per_s": tasks / consumed,
        "ms_per_task": consumed / tasks * 1e3,
    }


@dataclass
class StoreSample:
    """Redis and the store after one build of the stream under the cap."""

    build: int
    wall_s: float
    used_memory: int  # INFO memory used_memory
    peak_memory: int  # INFO memory used_memory_peak, since the server started
    store_bytes: int  # the entries' bytes the store counts (farm store stats)
    store_entries: int
    pinned_bytes: int


def store_stream(folder: Path, builds: int, cap: int) -> list[StoreSample]:
    """Distinct resnet18_style builds, one after another, on a fresh Redis whose workers cap the store at `cap`."""
    from farm.store import RedisStore

    samples = []
    workers: list[FarmWorker] = []
    with ProductionRedis() as server:
        with workers_logged(workers):
            for index in range(2):
                workers.append(
                    FarmWorker(
                        server.url,
                        f"store{index + 1}@farm",
                        folder,
                        env={**WORKER_ENV, "FARM_STORE_MAX_BYTES": str(cap)},
                    ).start()
                )
            client, store = server.client(), RedisStore(server.url)
            for seed in range(builds):
                model = folder / f"resnet18_style_{seed}.onnx"
                onnx.save(resnet18_style(seed=seed), str(model))
                wall, _ = cli(["submit", str(model), "-o", str(folder / "store-stream")], folder, server.url)
                memory, stats = client.info("memory"), store.stats()
                samples.append(
                    StoreSample(
                        seed + 1,
                        wall,
                        int(memory["used_memory"]),
                        int(memory["used_memory_peak"]),
                        stats.bytes,
                        stats.entries,
                        stats.pinned_bytes,
                    )
                )
                print(
                    f"  store stream build {seed + 1}: {wall:.2f} s, Redis used {memory['used_memory'] / MIB:.0f} "
                    f"MiB (peak {memory['used_memory_peak'] / MIB:.0f}), store {stats.bytes / MIB:.0f} MiB in "
                    f"{stats.entries} entries",
                    flush=True,
                )
    return samples


def store_figures(samples: Sequence[StoreSample], cap: int) -> dict[str, Any]:
    """The stream's figures: what one build adds to the store (the first build's count, before any eviction when
    one build fits), what the stream would hold without the cap, and Redis' peak against the cap."""
    per_build = samples[0].store_bytes
    peak = max(sample.peak_memory for sample in samples)
    return {
        "cap_bytes": cap,
        "builds": len(samples),
        "store_bytes_per_build": per_build,
        "uncapped_store_bytes": per_build * len(samples),
        "peak_used_memory": peak,
        "peak_over_cap": peak / cap,
        "last_used_memory": samples[-1].used_memory,
        "samples": [asdict(sample) for sample in samples],
    }


def store_table(samples: Sequence[StoreSample]) -> str:
    rows = [
        [
            str(s.build),
            f"{s.wall_s:.2f}",
            f"{s.used_memory / MIB:.0f}",
            f"{s.peak_memory / MIB:.0f}",
            f"{s.store_bytes / MIB:.0f}",
            str(s.store_entries),
            f"{s.pinned_bytes / MIB:.0f}",
        ]
        for s in samples
    ]
    return markdown_table(
        ["build", "wall s", "Redis used MiB", "Redis peak MiB", "store MiB", "store entries", "pinned MiB"], rows
    )


def store_bar(figures: dict[str, Any]) -> Bar:
    ratio = figures["peak_over_cap"]
    return Bar(
        "Redis peak used memory / store cap, distinct builds", f"{ratio:.2f}x", f"<= {STORE_BAR}x", ratio <= STORE_BAR
    )


def print_store(figures: dict[str, Any]) -> None:
    samples = [StoreSample(**sample) for sample in figures["samples"]]
    print(
        f"\nstore under the cap (FARM_STORE_MAX_BYTES={figures['cap_bytes']}, {figures['cap_bytes'] / MIB:.0f} MiB): "
        f"{figures['builds']} distinct resnet18_style builds, {figures['store_bytes_per_build'] / MIB:.0f} MiB of "
        f"store entries each ({figures['uncapped_store_bytes'] / MIB:.0f} MiB for the stream without a cap); "
        f"Redis used memory peaked at {figures['peak_used_memory'] / MIB:.0f} MiB "
        f"({figures['peak_over_cap']:.2f}x the cap)\n"
    )
    print(store_table(samples) + "\n")


def commands_per_second(connection: redis.Redis, window: float) -> float:
    """Commands Redis processed per second over `window` seconds (INFO stats; the two INFO calls included)."""
    before = connection.info("stats")["total_commands_processed"]
    time.sleep(window)
    return (connection.info("stats")["total_commands_processed"] - before) / window


def waiting_cost(clients: int, window: float) -> dict[str, float]:
    """Redis commands per second per idle waiting client: `clients` `farm wait` processes on jobs of their own that
    make no progress (records in state compiling, made through the job board; no worker), measured once every
    client has connected and had --window seconds' head start, less the rate with none waiting."""
    from farm.distributed.board import JobBoard
    from farm.distributed.job_record import JobRecord, JobState

    env = {**os.environ, "PYTHONPATH": WORKER_ENV["PYTHONPATH"]}
    with ProductionRedis() as server:
        board, connection = JobBoard(server.url), redis.Redis.from_url(server.url)
        ids = [f"{index:016x}" for index in range(clients)]
        for job_id in ids:
            now = time.time()
            board.create(
                job_id,
                JobRecord(JobState.QUEUED, "0" * 64, "bench", "0" * 64, [host_target()], created=now, updated=now),
            )
            board.advance(job_id, JobState.COMPILING, total=100)
        idle = commands_per_second(connection, window)
        connected = len(connection.client_list())
        waiting = [
            subprocess.Popen(
                [sys.executable, "-m", "farm", "wait", job_id],
                env={**env, "FARM_BROKER_URL": server.url},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for job_id in ids
        ]
        try:
            deadline = time.monotonic() + CLIENT_START_TIMEOUT_S
            while len(connection.client_list()) < connected + clients:
                if time.monotonic() > deadline or any(p.poll() is not None for p in waiting):
                    raise RuntimeError(f"{clients} `farm wait` clients didn't all connect")
                time.sleep(0.2)
            time.sleep(window)
            busy = commands_per_second(connection, window)
        finally:
            for process in waiting:
                process.terminate()
                process.wait(30)
    per_client = (busy - idle) / clients
    print(
        f"  waiting: {clients} idle `farm wait` clients: {busy:.1f} commands/s (idle Redis {idle:.1f}/s): "
        f"{per_client:.2f} commands/s per waiting client",
        flush=True,
    )
    return {
        "clients": clients,
        "window_s": window,
        "idle_commands_per_s": idle,
        "commands_per_s": busy,
        "commands_per_s_per_client": per_client,
    }


# -- report --------------------------------------------------------------------------------------------------------


def builds_table(builds: Sequence[Build]) -> str:
    rows = [
        [
            b.config,
            cell(b.compile_tasks, "d"),
            f"{b.wall_s:.2f}",
            cell(b.job_s, ".2f"),
            cell(b.client_s, ".2f"),
            " ".join(f"{r:.2f}" for r in b.runs),
        ]
        for b in builds
    ]
    return markdown_table(["build", "compile tasks", "wall s", "job s", "client s", "runs s"], rows)


def breakdown_table(builds: Sequence[Build]) -> str:
    """Seconds per run the workers spent in each task name (summed over tasks and workers) for the farm builds."""
    farm = [b for b in builds if b.task_s]
    rows = [[name.removeprefix("farm."), *(f"{b.task_s.get(name, 0.0):.2f}" for b in farm)] for name in TASK_NAMES]
    rows.append(["all tasks", *(f"{sum(b.task_s.values()):.2f}" for b in farm)])
    return markdown_table(["task seconds per run", *(b.config.removeprefix("farm, ") for b in farm)], rows)


def amdahl_bound(one: Build) -> float | None:
    """The best 2 workers could do over 1 if compile and pack tasks split perfectly and nothing else changed:
    everything else (client, plan, link, finish, dispatch gaps) stays serial."""
    parallel = one.task_s.get("farm.compile_cpu_kernel", 0.0) + one.task_s.get("farm.pack_blob", 0.0)
    return one.wall_s / (one.wall_s - parallel / 2) if parallel else None


def bars_for(local: Build, one: Build, two: Build, warm: Build) -> list[Bar]:
    scaling, vs_local = one.wall_s / two.wall_s, two.wall_s / local.wall_s
    return [
        Bar(
            "2 workers vs 1 (1 worker s / 2 workers s)", f"{scaling:.2f}x", f">= {SCALING_BAR}x", scaling >= SCALING_BAR
        ),
        Bar(
            "warm resubmit (cache on, 0 compile tasks)",
            f"{warm.wall_s:.2f} s",
            f"< {WARM_BAR_S:.0f} s",
            warm.wall_s < WARM_BAR_S and warm.compile_tasks == 0,
        ),
        Bar(
            "farm on 2 workers vs local (farm s / local s)",
            f"{vs_local:.2f}x",
            f"<= {LOCAL_BAR}x",
            vs_local <= LOCAL_BAR,
        ),
    ]


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    import celery

    return {
        "cpu": cpu,
        "llvm_cpu": host_target().cpu,
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "celery": celery.__version__,
        "redis_server": next((w.split("=", 1)[1] for w in redis_version if w.startswith("v=")), "?"),
    }


@contextlib.contextmanager
def workers_logged(workers: list[FarmWorker]) -> Iterator[None]:
    """Print each worker's log tail when the block fails, and stop every worker after it (the list may grow)."""
    try:
        yield
    except Exception:
        for worker in workers:
            print(f"--- {worker.name}\n{worker.log_tail()}", file=sys.stderr)
        raise
    finally:
        for worker in workers:
            worker.stop()


# -- failover ------------------------------------------------------------------------------------------------------


def submitted_job(model: Path, folder: Path, broker: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "farm", "submit", str(model), "--no-cache", "--no-wait", "--json"],
        cwd=folder,
        env={**os.environ, "FARM_BROKER_URL": broker},
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=True,
    )
    return json.loads(done.stdout)["job_id"]


def job_seconds(broker: str, job_id: str) -> float:
    """Wait for the job (its own record's created -> finished seconds)."""
    _, status = cli(["wait", job_id], REPO, broker)
    if status["state"] != "done":
        raise RuntimeError(f"job {job_id} ended {status['state']}: {status.get('error')}")
    return float(status["seconds"])


def kill_when_running(broker: str, worker: FarmWorker) -> None:
    """SIGKILL `worker` with its pool as soon as it runs a farm task."""
    from farm.distributed.redis_keys import RUNNING_KEY
    from farm.distributed.task_messages import RunningTask

    client = redis.Redis.from_url(broker, decode_responses=True)
    deadline = time.monotonic() + 120
    while not any(RunningTask.decode(text).worker == worker.name for text in client.hgetall(RUNNING_KEY).values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{worker.name} never ran a task")
        time.sleep(0.01)
    worker.kill()


def failover(folder: Path, repeat: int) -> dict[str, Any]:
    """Seconds of a job on 2 workers without a fault (median) and with one worker killed mid-job (median)."""
    clean, killed = [], []
    with ProductionRedis() as server:
        workers = [FarmWorker(server.url, f"fo{i}@farm", folder, env=WORKER_ENV).start() for i in (1, 2)]
        with workers_logged(workers):
            warm_up(folder, server.url)
            for index in range(repeat):
                clean.append(job_seconds(server.url, submitted_job(MODEL, folder, server.url)))
                job_id = submitted_job(MODEL, folder, server.url)
                kill_when_running(server.url, workers[0])
                killed.append(job_seconds(server.url, job_id))
                workers[0] = FarmWorker(server.url, f"fo1-{index}@farm", folder, env=WORKER_ENV).start()
                print(
                    f"  failover run {index + 1}: {clean[-1]:.2f} s clean, {killed[-1]:.2f} s with a worker killed",
                    flush=True,
                )
    extra = statistics.median(killed) - statistics.median(clean)
    return {
        "clean_s": clean,
        "killed_s": killed,
        "extra_s": extra,
        "bar": asdict(
            Bar(
                "extra seconds a SIGKILLed worker costs a job",
                f"{extra:.1f} s",
                f"<= {FAILOVER_BAR_S:.0f} s",
                extra <= FAILOVER_BAR_S,
            )
        ),
    }


# -- data plane (issue 29) -----------------------------------------------------------------------------------------


DATA_PLANE_MODELS = ("light_densenet121", "light_resnet50", "bert_base", "bert_base_external", "huge")
EXTERNAL_DATA_MODELS = ("bert_base_external", "huge")
HUGE_WIDTH = 8192
HUGE_LAYERS = 7  # 7 x 8192 x 8192 float32 weights: 1.88 GB, the model issue 29 measured
HUGE_FULL_LAYERS = 10  # issue 15's model: 2.68 GB in external data
MB = 1_000_000
GIB = 1 << 30
COLD_BAR = 1.2  # BERT-base: the farm's cold build at most this many times the local cold build
BYTES_BAR = 2.5  # BERT-base: bytes through Redis for its cold job at most this many times the model's size
RESUBMIT_BAR_S = 1.0  # light models: warm resubmit at most this many seconds
MEMORY_BAR = 1.1  # Redis used_memory never above the store's cap plus 10%
SAMPLE_S = 0.05  # used_memory is sampled this often
REDIS_CONF = REPO / "deploy" / "redis.conf"
BLOB_REDIS_CONF = REPO / "deploy" / "redis-blobs.conf"
BLOB_STORES = ("blob-redis", "redis", "file")
"""Where --data-plane's workers keep the store's bytes: a Redis of their own (deploy/redis-blobs.conf, as
docker-compose.yml runs it), the broker's Redis (FARM_BLOB_STORE unset), or a folder (FARM_BLOB_STORE=file://)."""
OBSERVER = "farm-bench"
OBSERVER_RULES = (
    "resetkeys resetchannels -@all +ping +auth +hello +info +psubscribe +punsubscribe "
    f"&{redis_keys.job_events_channel('*')}"
)
"""The benchmark's own Redis user: INFO and the jobs' events channels, nothing else (the farm's users may not run
INFO, a dangerous command)."""
PHASES = (
    ("upload + intake", "start", "planning"),
    ("plan", "planning", "compiling"),
    ("compile", "compiling", "linking"),
    ("link + finish", "linking", "done"),
    ("download", "done", "exit"),
)
"""A cold job's phases: from the `farm submit` command's start, through the states the job's events channel
publishes, to the command's exit."""


def bert_base() -> onnx.ModelProto:
    """BERT-base's size (benchmarks/bench_critical.py EXTRA): 110 M weights, 435 MB."""
    return bert_style(seq=128, width=768, heads=12, layers=12, vocab=30522)


def write_huge(path: Path, layers: int, width: int = HUGE_WIDTH) -> None:
    """benchmarks/bench_huge.py's model: a chain of `layers` MatMuls of width x width float32 weights, every weight
    in one external data file beside the model, written one at a time (never more than one in memory)."""
    data = path.with_suffix(".data")
    rng = np.random.default_rng(0)
    weights = []
    with open(data, "wb") as out:
        for index in range(layers):
            weight = (rng.standard_normal((width, width), dtype=np.float32) / np.sqrt(width)).astype(np.float32)
            tensor = onnx.TensorProto(
                name=f"w{index}",
                data_type=onnx.TensorProto.FLOAT,
                dims=[width, width],
                data_location=onnx.TensorProto.EXTERNAL,
            )
            for key, value in (("location", data.name), ("offset", out.tell()), ("length", weight.nbytes)):
                tensor.external_data.add(key=key, value=str(value))
            weight.tofile(out)
            weights.append(tensor)
    nodes = [
        helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"], name=f"mm{i}")
        for i in range(layers)
    ]
    graph = helper.make_graph(
        nodes,
        "huge",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(f"y{layers - 1}", onnx.TensorProto.FLOAT, [1, width])],
        weights,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def write_data_plane_model(name: str, folder: Path, huge_layers: int) -> Path:
    """The model `name` in a folder of its own (so its size, external data included, is the folder's); its path."""
    home = folder / "models" / name
    home.mkdir(parents=True)
    if name.startswith("light_"):
        path = home / f"{name}.onnx"
        shutil.copyfile(MODEL.parent / path.name, path)
    elif name == "bert_base":
        path = home / "bert_base.onnx"
        onnx.save(bert_base(), str(path))
    elif name == "bert_base_external":  # as torch.onnx.export(dynamo=True) writes a big model
        path = home / "model.onnx"
        onnx.save(bert_base(), str(path), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    else:
        path = home / "huge.onnx"
        write_huge(path, huge_layers)
    return path


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file())


def size_text(count: int) -> str:
    """Bytes in decimal units, as the issue writes them (435 MB, 1.88 GB)."""
    if count >= 1e9:
        return f"{count / 1e9:.2f} GB"
    return f"{count / MB:.0f} MB" if count >= MB else f"{count / 1e3:.0f} kB"


def artifact_digest(result: dict[str, Any]) -> str:
    """The sha256 of the artifact a `farm submit --json` wrote, which is then deleted (huge ones fill the disk)."""
    path, digest = Path(result["artifact"]), hashlib.sha256()
    with open(path, "rb") as artifact:
        while piece := artifact.read(MIB):
            digest.update(piece)
    path.unlink()
    return digest.hexdigest()


# Redis as deployed, and what the benchmark sees of it.


class DeployedRedis(RedisServer):
    """redis-server as deploy/redis.conf configures it (the file itself; only port, bind, dir and the log file
    overridden, as tests/test_deploy.py starts it: persistence and memory settings are production's) with the ACL
    file `farm acl` writes from the roles' passwords, plus the benchmark's own user (OBSERVER_RULES). The default
    user is off, so `url` is the workers' (readiness is checked as farm-worker). `conf`: deploy/redis-blobs.conf
    for the blob Redis, whose users are `users_of`'s (the same ACL file, as docker-compose.yml gives both)."""

    def __init__(self, conf: Path = REDIS_CONF, users_of: DeployedRedis | None = None) -> None:
        super().__init__()
        self.conf, self.aclfile = conf, self.folder / "users.acl"
        if users_of is not None:
            self.passwords, self.observer_password = users_of.passwords, users_of.observer_password
            self.aclfile.write_text(users_of.aclfile.read_text())
            return
        self.passwords = {role: secrets.token_hex(16) for role in ROLES}
        self.observer_password = secrets.token_hex(16)
        variables = {ROLES[role].password_variable: password for role, password in self.passwords.items()}
        subprocess.run(
            [sys.executable, "-m", "farm", "acl", "-o", str(self.aclfile)],
            check=True,
            env={**os.environ, **variables, "PYTHONPATH": WORKER_ENV["PYTHONPATH"]},
            capture_output=True,
        )
        with open(self.aclfile, "a") as aclfile:
            aclfile.write(user_line(Role(OBSERVER, "", OBSERVER_RULES), self.observer_password) + "\n")

    def role_url(self, role: str) -> str:
        return self.url_for(ROLES[role].user, self.passwords[role])

    @property
    def url(self) -> str:
        return self.role_url("worker")

    @property
    def observer_url(self) -> str:
        return self.url_for(OBSERVER, self.observer_password)

    def _arguments(self) -> list[str]:
        return [
            redis_server_binary(),
            str(self.conf),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.folder),
            "--logfile",
            str(self.log_path),
            "--aclfile",
            str(self.aclfile),
        ]


@dataclass
class Traffic:
    """Bytes Redis read from (inbound) and wrote to (outbound) some connection."""

    inbound: int = 0
    outbound: int = 0

    def add(self, other: Traffic) -> None:
        self.inbound, self.outbound = self.inbound + other.inbound, self.outbound + other.outbound


def resp_size(*items: bytes) -> int:
    """Bytes of the RESP reply carrying `items`: one bulk string, or an array of them."""
    bulks = sum(len(f"${len(item)}\r\n") + len(item) + 2 for item in items)
    return bulks if len(items) == 1 else len(f"*{len(items)}\r\n") + bulks


class InfoConnection:
    """INFO on a connection of the benchmark's own, read raw, so that what each call costs Redis is known."""

    def __init__(self, url: str) -> None:
        self.connection = Connection(**parse_url(url))
        self.connection.connect()

    def info(self, section: str) -> tuple[dict[str, str], Traffic]:
        """The section's fields, and the bytes of the request and of the reply."""
        request = self.connection.pack_command("INFO", section)
        self.connection.send_packed_command(request)
        reply = self.connection.read_response()
        fields = dict(line.split(":", 1) for line in reply.decode().splitlines() if ":" in line)
        return fields, Traffic(sum(map(len, request)), resp_size(reply))

    def close(self) -> None:
        self.connection.disconnect()


class MemorySampler:
    """The farm's Redis servers' used_memory, summed, every SAMPLE_S seconds, in a thread (used_memory_peak can't be
    reset on Redis 7.0, and would hold the warm-up's); `peak` is the highest sample, `traffic` what the samples
    cost the servers."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.connections = [InfoConnection(url) for url in urls]
        self.peak = self.samples = 0
        self.traffic = Traffic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="used_memory sampler", daemon=True)

    def _run(self) -> None:
        while True:
            used = 0
            for connection in self.connections:
                fields, traffic = connection.info("memory")
                used += int(fields["used_memory"])
                self.traffic.add(traffic)
            self.peak, self.samples = max(self.peak, used), self.samples + 1
            if self._stop.wait(SAMPLE_S):
                return

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        for connection in self.connections:
            connection.close()


class StateStamps:
    """When each job state is first published on a job's events channel (perf_counter), seen by a thread subscribed
    to every job's channel; `traffic` counts the messages Redis wrote to it since the last `reset`."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(redis_keys.job_events_channel("*"))
        self.stamps: dict[str, float] = {}
        self.traffic = Traffic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job events", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.stamps, self.traffic = {}, Traffic()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                self.stamps.setdefault(message["data"].decode(), time.perf_counter())
                self.traffic.outbound += resp_size(b"pmessage", message["pattern"], message["channel"], message["data"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pubsub.close()
        self.client.close()


@dataclass
class Watched:
    """One `farm submit` on the data-plane farm, watched from Redis."""

    wall_s: float
    artifact_sha256: str
    compiled: int | None  # compile tasks the job ran
    net_in: int  # INFO stats total_net_input_bytes over the command, less the benchmark's own requests
    net_out: int  # total_net_output_bytes, less the replies and messages the benchmark received
    peak_used_memory: int  # the highest used_memory sample over the command
    used_memory_before: int
    samples: int
    observer_bytes: int  # what the benchmark's own INFO calls and subscription cost, taken off net_in and net_out
    phases: dict[str, float | None]
    task_s: dict[str, float]  # seconds the workers spent in each task name (their logs)


class DataPlaneFarm:
    """A fresh DeployedRedis (and, for the blob-redis store, a blob Redis beside it) with 2 `farm worker`s
    (farm-worker credentials, production time limits, the store capped at `cap`); submissions go in with the
    submitter's credentials, watched as `watched_submit` says."""

    def __init__(self, folder: Path, cap: int, tag: str, client_env: dict[str, str], blob_store: str) -> None:
        self.folder, self.client_env = folder, client_env
        self.redis = DeployedRedis().start()
        self.servers = [self.redis]
        self.workers: list[FarmWorker] = []
        env = {**WORKER_ENV, "FARM_STORE_MAX_BYTES": str(cap), "FARM_CACHE_DIR": str(folder / f"worker-cache-{tag}")}
        try:
            if blob_store == "file":
                env["FARM_BLOB_STORE"] = f"file://{folder / f'cas-{tag}'}"
            elif blob_store == "blob-redis":
                self.servers.append(DeployedRedis(BLOB_REDIS_CONF, users_of=self.redis).start())
                env["FARM_BLOB_STORE"] = self.servers[-1].role_url("worker")
            for index in (1, 2):
                self.workers.append(
                    FarmWorker(self.redis.role_url("worker"), f"{tag}-{index}@farm", folder, env=env).start()
                )
            self.infos = [InfoConnection(server.observer_url) for server in self.servers]
            self.events = StateStamps(self.redis.observer_url)
        except Exception:
            self.close()
            raise

    @property
    def submitter_url(self) -> str:
        return self.redis.role_url("submitter")

    def watched_submit(self, model: Path, out: Path, no_cache: bool) -> Watched:
        """`farm submit MODEL` as the submitter, between two INFO stats; used_memory sampled all along."""
        args = ["submit", str(model), "-o", str(out)] + (["--no-cache"] if no_cache else [])
        offsets = [log_size(worker) for worker in self.workers]
        memory = sum(int(info.info("memory")[0]["used_memory"]) for info in self.infos)
        before = [info.info("stats") for info in self.infos]  # their replies are output after the count
        self.events.reset()
        with MemorySampler([server.observer_url for server in self.servers]) as sampler:
            started = time.perf_counter()
            wall, result = cli(args, self.folder, self.submitter_url, self.client_env)
            ended = time.perf_counter()
        after = [info.info("stats") for info in self.infos]
        own = Traffic(
            sampler.traffic.inbound + sum(closing.inbound for _, closing in after),
            sampler.traffic.outbound + sum(asked.outbound for _, asked in before) + self.events.traffic.outbound,
        )
        moved = {
            field: sum(int(end[field]) - int(start[field]) for (start, _), (end, _) in zip(before, after))
            for field in ("total_net_input_bytes", "total_net_output_bytes")
        }
        return Watched(
            wall,
            artifact_digest(result),
            result.get("compiled"),
            moved["total_net_input_bytes"] - own.inbound,
            moved["total_net_output_bytes"] - own.outbound,
            sampler.peak,
            memory,
            sampler.samples,
            own.inbound + own.outbound,
            phase_seconds(self.events.stamps, started, ended),
            task_seconds(self.workers, offsets),
        )

    def settings(self) -> dict[str, str]:
        """What the servers say they run with (INFO), to show that deploy/redis.conf (and redis-blobs.conf) is what
        each loaded; the blob Redis' fields are prefixed `blobs_`."""
        settings = {}
        for prefix, info in zip(("", "blobs_"), self.infos):
            fields = {**info.info("server")[0], **info.info("persistence")[0], **info.info("memory")[0]}
            settings.update(
                {
                    prefix + name: fields.get(name, "?")
                    for name in ("redis_version", "config_file", "aof_enabled", "maxmemory_policy", "maxmemory")
                }
            )
        return settings

    def store_stats(self) -> dict[str, Any]:
        """`farm store stats --json` as the operator (the workers' credentials)."""
        return cli(["store", "stats"], self.folder, self.redis.role_url("worker"), self.client_env)[1]

    def close(self) -> None:
        for closing in (getattr(self, "events", None), *getattr(self, "infos", [])):
            if closing is not None:
                closing.close()
        for worker in self.workers:
            worker.stop()
        for server in self.servers:
            server.close()


def phase_seconds(stamps: dict[str, float], started: float, ended: float) -> dict[str, float | None]:
    """Seconds of each of PHASES (None for a phase whose states weren't published: a reused artifact's job)."""
    times = {**stamps, "start": started, "exit": ended}
    return {
        name: times[last] - times[first] if first in times and last in times else None for name, first, last in PHASES
    }


# One model.


@dataclass
class FarmRound:
    """One fresh farm's figures for a model: its cold job, the store after the download, the warm resubmit."""

    cold: Watched
    warm: Watched
    store: dict[str, Any]
    redis: dict[str, str]  # what the server runs with: its config file, append-only file, eviction policy


def farm_round(
    model: Path, folder: Path, cap: int, tag: str, client_env: dict[str, str], blob_store: str = BLOB_STORES[0]
) -> FarmRound:
    """A fresh redis-server and 2 workers (warmed by tiny_cnn builds, so the store holds no entry of the model: no
    blob, object or artifact), then the cold job, `farm store stats` after its download, and the warm resubmit."""
    farm = DataPlaneFarm(folder, cap, tag, client_env, blob_store)
    try:
        warm_up(folder, farm.submitter_url, client_env)
        cold = farm.watched_submit(model, folder / f"farm-cold-{tag}", no_cache=True)
        store = farm.store_stats()
        warm = farm.watched_submit(model, folder / f"farm-warm-{tag}", no_cache=False)
        return FarmRound(cold, warm, store, farm.settings())
    except Exception:
        print("\n".join(f"--- {w.name}\n{w.log_tail()}" for w in farm.workers), file=sys.stderr)
        raise
    finally:
        farm.close()


def local_runs(
    model: Path, folder: Path, client_env: dict[str, str], repeat: int, no_cache: bool, untimed: int = 0
) -> tuple[list[float], str]:
    """`farm submit MODEL` without a broker, `untimed` + `repeat` times; the timed runs' wall seconds and the last
    artifact's sha256."""
    walls, digest = [], ""
    for index in range(untimed + repeat):
        args = ["submit", str(model), "-o", str(folder / "local")] + (["--no-cache"] if no_cache else [])
        wall, result = cli(args, folder, None, client_env)
        digest = artifact_digest(result)
        if index >= untimed:
            walls.append(wall)
    return walls, digest


@dataclass
class ModelFigures:
    """Every figure of one model (medians over --repeat; Redis' peak the highest); `error` says what failed."""

    model: str
    size_bytes: int = 0
    cap: int = 0
    local_cold_s: float | None = None
    local_warm_s: float | None = None
    farm_cold_s: float | None = None
    farm_warm_s: float | None = None
    net_in: int | None = None
    net_out: int | None = None
    peak_used_memory: int | None = None
    local_sha256: str = ""
    farm_sha256: list[str] = field(default_factory=list)  # every farm artifact's, cold and warm
    phases: dict[str, float | None] = field(default_factory=dict)
    compiled: int | None = None
    store: dict[str, Any] = field(default_factory=dict)
    redis: dict[str, str] = field(default_factory=dict)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""

    @property
    def through(self) -> int | None:
        return None if self.net_in is None or self.net_out is None else self.net_in + self.net_out

    @property
    def ratio(self) -> float | None:
        return None if self.through is None else self.through / self.size_bytes

    @property
    def identical(self) -> bool | None:
        """Whether every farm artifact is the local build's, byte for byte (None: no farm artifact)."""
        return all(digest == self.local_sha256 for digest in self.farm_sha256) if self.farm_sha256 else None


def median_of(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def add_rounds(figures: ModelFigures, rounds: Sequence[FarmRound]) -> None:
    """The farm rounds' medians (Redis' peak: the highest) into `figures`."""
    colds = [r.cold for r in rounds]
    figures.farm_cold_s = statistics.median(c.wall_s for c in colds)
    figures.farm_warm_s = statistics.median(r.warm.wall_s for r in rounds)
    figures.net_in = int(statistics.median(c.net_in for c in colds))
    figures.net_out = int(statistics.median(c.net_out for c in colds))
    figures.peak_used_memory = max(c.peak_used_memory for c in colds)
    figures.farm_sha256 = [digest for r in rounds for digest in (r.cold.artifact_sha256, r.warm.artifact_sha256)]
    figures.phases = {name: median_of([c.phases[name] for c in colds]) for name, _, _ in PHASES}
    figures.compiled, figures.store, figures.redis = colds[-1].compiled, rounds[-1].store, rounds[-1].redis
    figures.rounds = [asdict(r) for r in rounds]


def bench_data_plane_model(name: str, folder: Path, args: argparse.Namespace, cap: int) -> ModelFigures:
    """Local cold and warm builds, then --repeat farm rounds; a step that fails ends the model with its error."""
    figures = ModelFigures(name, cap=cap)
    client_env = {"FARM_CACHE_DIR": str(folder / "cache" / name), "PYTHONPATH": WORKER_ENV["PYTHONPATH"]}
    try:
        model = write_data_plane_model(name, folder, args.huge_layers)
        figures.size_bytes = folder_bytes(model.parent)
        print(
            f"{name}: {size_text(figures.size_bytes)} ({', '.join(p.name for p in sorted(model.parent.iterdir()))})",
            flush=True,
        )
        cold, figures.local_sha256 = local_runs(model, folder, client_env, args.repeat, no_cache=True)
        warm, _ = local_runs(model, folder, client_env, args.repeat, no_cache=False, untimed=1)
        figures.local_cold_s, figures.local_warm_s = statistics.median(cold), statistics.median(warm)
        print(
            f"  local: cold {' '.join(f'{s:.2f}' for s in cold)} s, warm {' '.join(f'{s:.2f}' for s in warm)} s",
            flush=True,
        )
        rounds = []
        for index in range(args.repeat):
            rounds.append(farm_round(model, folder, cap, f"{name}-{index + 1}", client_env, args.blob_store))
            print(f"  farm round {index + 1}: {round_line(rounds[-1])}", flush=True)
        add_rounds(figures, rounds)
    except Exception as error:  # any failure ends this model, not the run, and is reported as it reads
        figures.error = str(error).strip() if isinstance(error, RuntimeError) else f"{type(error).__name__}: {error}"
        print(f"  {name} FAILED: {figures.error}", flush=True)
    finally:
        shutil.rmtree(folder / "models" / name, ignore_errors=True)
    return figures


def round_line(done: FarmRound) -> str:
    cold = done.cold
    return (
        f"cold {cold.wall_s:.2f} s ({cold.compiled} compile tasks), in {cold.net_in / MB:.1f} MB, out "
        f"{cold.net_out / MB:.1f} MB, used_memory peak {cold.peak_used_memory / MIB:.0f} MiB; warm resubmit "
        f"{done.warm.wall_s:.2f} s; store {done.store['bytes'] / MIB:.0f} MiB in {done.store['entries']} entries"
    )


# Bars and report.


def checked_bar(name: str, value: float | None, limit: float | None, unit: str) -> Bar:
    """A bar `value <= limit`; no value or no limit (a build failed) fails it."""
    if value is None or limit is None:
        return Bar(name, cell(value, ".2f") + unit, cell(limit, "g") + unit, False)
    return Bar(name, f"{value:.2f}{unit}", f"<= {limit:g}{unit}", value <= limit)


def data_plane_bars(figures: Sequence[ModelFigures]) -> list[Bar]:
    """Issue 29's bars for the models measured."""
    bars, by_name = [], {f.model: f for f in figures}
    bert = by_name.get("bert_base")
    if bert:
        ratio = bert.farm_cold_s / bert.local_cold_s if bert.farm_cold_s and bert.local_cold_s else None
        local_warm = None if bert.local_warm_s is None else round(bert.local_warm_s, 2)
        bars.append(checked_bar("bert_base cold: farm / local", ratio, COLD_BAR, "x"))
        bars.append(checked_bar("bert_base cold job: bytes through Redis / model size", bert.ratio, BYTES_BAR, "x"))
        bars.append(
            checked_bar("bert_base warm resubmit (limit: the warm local build)", bert.farm_warm_s, local_warm, " s")
        )
    for name in ("light_resnet50", "light_densenet121"):
        if name in by_name:
            bars.append(checked_bar(f"{name} warm resubmit", by_name[name].farm_warm_s, RESUBMIT_BAR_S, " s"))
    for f in figures:
        built = "builds on the farm and its " if f.model in EXTERNAL_DATA_MODELS else ""
        bars.append(
            Bar(
                f"{f.model}: {built}farm artifact = local artifact (sha256)",
                {True: "identical", False: "differs", None: "no farm artifact"}[f.identical],
                "identical",
                bool(f.identical),
            )
        )
        peak = None if f.peak_used_memory is None else f.peak_used_memory / f.cap
        bars.append(checked_bar(f"{f.model} cold job: Redis used_memory peak / store cap", peak, MEMORY_BAR, "x"))
    return bars


def data_plane_table(figures: Sequence[ModelFigures]) -> str:
    """The issue's table: one row per model."""
    rows = []
    for f in figures:
        peak = (
            "-"
            if f.peak_used_memory is None
            else f"{f.peak_used_memory / MIB:.0f} MiB ({f.peak_used_memory / f.cap:.2f}x cap)"
        )
        through = "-" if f.through is None else f"{f.net_in / MB:.0f} / {f.net_out / MB:.0f} MB"
        same = {True: "yes", False: "NO", None: "-"}[f.identical]
        rows.append(
            [
                f.model,
                size_text(f.size_bytes),
                cell(f.local_cold_s, ".2f"),
                cell(f.farm_cold_s, ".2f"),
                cell(f.farm_warm_s, ".2f"),
                peak,
                through,
                cell(f.ratio, ".2f"),
                cell(f.local_warm_s, ".2f"),
                same,
            ]
        )
    return markdown_table(
        [
            "model",
            "size",
            "local cold s",
            "farm cold s",
            "farm warm resubmit s",
            "Redis peak",
            "bytes through Redis in / out",
            "ratio to model size",
            "local warm s",
            "farm = local",
        ],
        rows,
    )


def phases_table(figures: Sequence[ModelFigures]) -> str:
    """The cold farm job's phases (seconds), its compile tasks and the store after its download."""
    rows = [
        [
            f.model,
            *(cell(f.phases.get(name), ".2f") for name, _, _ in PHASES),
            cell(f.compiled, "d"),
            f"{f.store['entries']}, {f.store['bytes'] / MIB:.0f} MiB ({f.store['bytes'] / f.store['max_bytes']:.0%})"
            if f.store
            else "-",
            f"{f.store['pinned_bytes'] / MIB:.0f}" if f.store else "-",
        ]
        for f in figures
    ]
    return markdown_table(
        [
            "cold farm job",
            *(f"{name} s" for name, _, _ in PHASES),
            "compile tasks",
            "store after download: entries, bytes (of cap)",
            "pinned MiB",
        ],
        rows,
    )


def data_plane(args: argparse.Namespace) -> int:
    """`--data-plane`: every model of --models, then the tables and the bars."""
    cap, load_before = store_max_bytes(), os.getloadavg()
    print(
        f"data plane: models {', '.join(args.models)}; store cap {cap / MIB:.0f} MiB; blob store "
        f"{args.blob_store}; repeat {args.repeat}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="farm-bench-data-plane-") as tmp:
        figures = [bench_data_plane_model(name, Path(tmp), args, cap) for name in args.models]
    bars = data_plane_bars(figures)
    load = " ".join(f"{value:.2f}" for value in load_before)
    print(f"\nmachine: {json.dumps(machine_info())}\nload average before the run: {load}")
    server = next((f.redis for f in figures if f.redis), None)
    print(f"Redis (INFO, last farm): {json.dumps(server)}\n" if server else "")
    print(f"{data_plane_table(figures)}\n\n{phases_table(figures)}\n")
    for f in figures:
        if f.error:
            print(f"{f.model} failed: {f.error}\n")
    print(
        markdown_table(["bar", "measured", "limit", "result"], [[b.name, b.measured, b.limit, b.verdict] for b in bars])
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_info(),
                    "load_average_before": load_before,
                    "load_average_after": os.getloadavg(),
                    "repeat": args.repeat,
                    "cap_bytes": cap,
                    "huge_layers": args.huge_layers,
                    "models": [
                        {**asdict(f), "through": f.through, "ratio": f.ratio, "identical": f.identical} for f in figures
                    ],
                    "bars": [{**asdict(b), "verdict": b.verdict} for b in bars],
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if any(not b.passed for b in bars) and not args.no_fail else 0


# -- main ----------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per configuration (default 3; median)")
    parser.add_argument("--tasks", type=int, default=500, help="trivial tasks for the broker figure (default 500)")
    parser.add_argument("--store-builds", type=int, default=8, help="distinct builds for the store figure (default 8)")
    parser.add_argument(
        "--store-cap",
        type=int,
        default=512 * MIB,
        help="FARM_STORE_MAX_BYTES for the store figure (default 512 MiB: about two builds)",
    )
    parser.add_argument(
        "--store-only", action="store_true", help="measure only Redis' used memory across distinct builds under the cap"
    )
    parser.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    parser.add_argument("--no-fail", action="store_true", help="exit 0 even when a bar fails")
    parser.add_argument("--failover", action="store_true", help="only measure what a SIGKILLed worker costs a job")
    parser.add_argument(
        "--waiting-clients",
        type=int,
        metavar="N",
        help="measure only the Redis commands per second that N idle `farm wait` clients cost",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=60.0,
        help="seconds of the --waiting-clients measurement, and of the head start before it (default 60)",
    )
    parser.add_argument(
        "--data-plane",
        action="store_true",
        help="only measure each model's data path (issue 29): local and farm builds, cold and warm, "
        "bytes through Redis, Redis' memory",
    )
    parser.add_argument(
        "--models", help=f"with --data-plane: comma-separated, of {', '.join(DATA_PLANE_MODELS)} (default: all)"
    )
    parser.add_argument(
        "--huge-layers",
        type=int,
        help=f"with --data-plane: 8192x8192 MatMuls of the huge model (default {HUGE_LAYERS}: 1.88 GB)",
    )
    parser.add_argument(
        "--blob-store",
        choices=BLOB_STORES,
        default=BLOB_STORES[0],
        help="with --data-plane: where the workers keep the store's bytes (blob-redis, the default: "
        "a Redis of their own with deploy/redis-blobs.conf, as docker-compose.yml runs it; "
        "redis: the broker's; file: a folder beside the run)",
    )
    parser.add_argument(
        "--huge-full",
        action="store_true",
        help=f"with --data-plane: the huge model of issue 15, {HUGE_FULL_LAYERS} layers (2.68 GB)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.tasks < 1 or args.store_builds < 1 or args.store_cap < 1:
        parser.error("--repeat, --tasks, --store-builds and --store-cap must be >= 1")
    if (args.waiting_clients is not None and args.waiting_clients < 1) or args.window <= 0:
        parser.error("--waiting-clients and --window must be > 0")
    check_data_plane_args(parser, args)
    return args


def check_data_plane_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--models, --huge-layers and --huge-full: only with --data-plane, known names, at least one layer."""
    given = [
        name
        for name, value in (
            ("--models", args.models),
            ("--huge-layers", args.huge_layers),
            ("--huge-full", args.huge_full),
        )
        if value not in (None, False)
    ]
    if given and not args.data_plane:
        parser.error(f"{', '.join(given)} need --data-plane")
    if args.huge_full and args.huge_layers is not None:
        parser.error("--huge-full and --huge-layers exclude each other")
    args.huge_layers = (
        HUGE_FULL_LAYERS if args.huge_full else HUGE_LAYERS if args.huge_layers is None else args.huge_layers
    )
    if args.huge_layers < 1:
        parser.error("--huge-layers must be >= 1")
    names = [name.strip() for name in (args.models or ",".join(DATA_PLANE_MODELS)).split(",") if name.strip()]
    unknown = [name for name in names if name not in DATA_PLANE_MODELS]
    if unknown or not names:
        parser.error(f"unknown models {unknown}; known: {', '.join(DATA_PLANE_MODELS)}")
    args.models = list(dict.fromkeys(names))


class ProductionRedis(RedisServer):
    """The tests' redis-server, but with the durability of deploy/redis.conf (fsync every second, not every write)."""

    def _arguments(self) -> list[str]:
        arguments = super()._arguments()
        if "--appendfsync" in arguments:
            arguments[arguments.index("--appendfsync") + 1] = "everysec"
        return arguments


def run_benchmarks(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Every measurement of one run, as a JSON-ready dict (Builds and Bars kept under `_builds`, `_bars`)."""
    print(f"model: {MODEL}", flush=True)
    load_before = os.getloadavg()
    local = timed_builds("local executor", MODEL, folder, None, args.repeat)
    workers: list[FarmWorker] = []
    with ProductionRedis() as server:
        with workers_logged(workers):
            workers.append(FarmWorker(server.url, "bench1@farm", folder, env=WORKER_ENV).start())
            warm_up(folder, server.url)
            one = timed_builds("farm, 1 worker", MODEL, folder, server.url, args.repeat, workers=workers)
            workers.append(FarmWorker(server.url, "bench2@farm", folder, env=WORKER_ENV).start())
            warm_up(folder, server.url)
            two = timed_builds("farm, 2 workers", MODEL, folder, server.url, args.repeat, workers=workers)
            warm = timed_builds(
                "farm, 2 workers, warm resubmit",
                MODEL,
                folder,
                server.url,
                args.repeat,
                no_cache=False,
                workers=workers,
            )
            broker = broker_throughput(server.url, workers, args.tasks)
            print(f"  broker: {broker['tasks']} tasks consumed in {broker['consume_s']:.2f} s", flush=True)
    builds = [local, one, two, warm]
    store = store_figures(store_stream(folder, args.store_builds, args.store_cap), args.store_cap)
    bars = [*bars_for(local, one, two, warm), store_bar(store)]
    return {
        "machine": machine_info(),
        "model": MODEL.name,
        "repeat": args.repeat,
        "store": store,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "builds": [{**asdict(b), "client_s": b.client_s} for b in builds],
        "ratios": {
            "two_vs_one_worker": one.wall_s / two.wall_s,
            "farm_two_vs_local": two.wall_s / local.wall_s,
            "job_two_vs_one_worker": one.job_s / two.job_s,
            "two_vs_one_bound": amdahl_bound(one),
        },
        "broker": broker,
        "bars": [{**asdict(b), "verdict": b.verdict} for b in bars],
        "_builds": builds,
        "_bars": bars,
    }


def store_only(args: argparse.Namespace) -> int:
    """`--store-only`: the stream of distinct builds under the cap, alone."""
    with tempfile.TemporaryDirectory(prefix="farm-bench-farm-") as tmp:
        figures = store_figures(store_stream(Path(tmp), args.store_builds, args.store_cap), args.store_cap)
    print(f"\nmachine: {json.dumps(machine_info())}")
    print_store(figures)
    bar = store_bar(figures)
    print(markdown_table(["bar", "measured", "limit", "result"], [[bar.name, bar.measured, bar.limit, bar.verdict]]))
    if args.json:
        args.json.write_text(
            json.dumps({"machine": machine_info(), "store": figures, "bars": [asdict(bar)]}, indent=2) + "\n"
        )
    return 1 if not bar.passed and not args.no_fail else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.data_plane:
        return data_plane(args)
    if args.failover:
        return report_failover(args)
    if args.store_only:
        return store_only(args)
    if args.waiting_clients:
        report = {"machine": machine_info(), "waiting": waiting_cost(args.waiting_clients, args.window)}
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    with tempfile.TemporaryDirectory(prefix="farm-bench-farm-") as tmp:
        report = run_benchmarks(args, Path(tmp))
    builds, bars = report.pop("_builds"), report.pop("_bars")
    broker, ratios = report["broker"], report["ratios"]
    load = " ".join(f"{value:.2f}" for value in report["load_average_before"])
    print(f"\nmachine: {json.dumps(report['machine'])}\nload average before the run: {load}\n")
    print(f"{builds_table(builds)}\n\n{breakdown_table(builds)}\n")
    bound = ratios["two_vs_one_bound"]
    print(
        f"2 workers vs 1: {ratios['two_vs_one_worker']:.2f}x wall, {ratios['job_two_vs_one_worker']:.2f}x job "
        f"(at best {cell(bound, '.2f')}x with compile and pack split perfectly and the rest serial); "
        f"farm (2 workers) / local: {ratios['farm_two_vs_local']:.2f}x"
    )
    print(
        f"broker: {broker['tasks']} farm.finish tasks sent by one client in {broker['send_s']:.2f} s "
        f"({broker['sent_per_s']:.0f}/s, {broker['send_ms_per_task']:.1f} ms each), consumed by "
        f"{broker['workers']} workers in {broker['consume_s']:.2f} s: {broker['tasks_per_s']:.0f} tasks/s, "
        f"{broker['ms_per_task']:.1f} ms per task"
    )
    print_store(report["store"])
    print(
        markdown_table(["bar", "measured", "limit", "result"], [[b.name, b.measured, b.limit, b.verdict] for b in bars])
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    failed = any(not b.passed for b in bars)
    return 1 if failed and not args.no_fail else 0


def report_failover(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="farm-bench-failover-") as tmp:
        figures = failover(Path(tmp), args.repeat)
    bar = figures["bar"]
    print(
        markdown_table(
            ["bar", "measured", "limit", "result"],
            [[bar["name"], bar["measured"], bar["limit"], "PASS" if bar["passed"] else "FAIL"]],
        )
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if bar["passed"] or args.no_fail else 1


if __name__ == "__main__":
    sys.exit(main())
