"""Documented defaults of the farm, in one place; each can be overridden by the environment variable named."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from farm.errors import BadInputError

REDIS_URL_FORM = "redis://[:password@]host:port/db or rediss://..."


def _seconds(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask): the default number of local compile processes and of
    runtime threads."""
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def cache_dir() -> Path:
    """FARM_CACHE_DIR: farm's cache root (the embedded store, the runtime's libraries and programs); default
    ~/.cache/farm."""
    configured = os.environ.get("FARM_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "farm"


def trusted_keys() -> list[str]:
    """FARM_TRUSTED_KEYS: the Ed25519 public keys the runtime trusts, separated by os.pathsep, each a PEM file's path
    or 64 hex digits; unset or empty means artifacts need no signature (unless `farm run --trust` names a key)."""
    return [entry for entry in os.environ.get("FARM_TRUSTED_KEYS", "").split(os.pathsep) if entry]


def broker_url() -> str | None:
    """FARM_BROKER_URL: the Redis URL of the farm; unset means builds run on this machine."""
    return os.environ.get("FARM_BROKER_URL") or None


def redis_url(url: str, source: str = "--broker") -> str:
    """`url` when it is a Redis URL the farm can use (redis:// or rediss://, a host, a numeric port if any, a
    numeric database if any), else BadInputError naming `source` (where the URL came from) and the URL without its
    password. Every command that takes --broker and the worker check here before anything connects (redis-py's own
    answer to a URL without a scheme is a long traceback)."""
    try:
        parts = urlsplit(url)
        usable = (
            parts.scheme in ("redis", "rediss")
            and bool(parts.hostname)
            and (parts.port is None or parts.port > 0)
            and re.fullmatch(r"/?|/\d+", parts.path) is not None
        )
    except ValueError:  # a port that is no number, a malformed IPv6 address
        usable = False
    if not usable:
        raise BadInputError(f"{source} {_hide_credentials(url)}: not a Redis URL ({REDIS_URL_FORM})")
    _check_tls_parameters(url, source)
    return url


TLS_CERT_REQS = ("required", "optional", "none")
"""What a rediss:// URL's ssl_cert_reqs may say (redis-py's spellings, lower case); absent means `required`."""

TLS_FILE_PARAMETERS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
"""A rediss:// URL's files: the CA that signed the server's certificate, the client's certificate and its key."""


def redis_tls_options(url: str) -> dict[str, str] | None:
    """The TLS options of a rediss:// URL as redis-py, Celery's result backend, kombu and Flower all take them
    (`ssl_cert_reqs` plus the files of TLS_FILE_PARAMETERS that the URL names), None for redis://.
    ssl_cert_reqs defaults to `required`, redis-py's own default: Celery refuses a rediss:// URL without it and
    kombu would then skip the certificate check altogether."""
    if urlsplit(url).scheme != "rediss":
        return None
    query = _query(url)
    options = {"ssl_cert_reqs": query.get("ssl_cert_reqs", "required")}
    return options | {name: query[name] for name in TLS_FILE_PARAMETERS if name in query}


def _query(url: str) -> dict[str, str]:
    """The URL's query parameters, the last value of each (as redis-py reads them)."""
    return {name: values[-1] for name, values in parse_qs(urlsplit(url).query).items()}


def _check_tls_parameters(url: str, source: str) -> None:
    """BadInputError for TLS parameters the URL's clients would choke on later, deep in a connection attempt: ssl_*
    on a plain redis:// URL, an ssl_cert_reqs outside TLS_CERT_REQS, a certificate or key file that can't be read."""
    query, shown = _query(url), _hide_credentials(url)
    options = redis_tls_options(url)
    if options is None:
        if any(name.startswith("ssl_") for name in query):
            raise BadInputError(f"{source} {shown}: ssl_* parameters need a rediss:// URL")
        return
    if options["ssl_cert_reqs"] not in TLS_CERT_REQS:
        raise BadInputError(f"{source} {shown}: ssl_cert_reqs must be one of {', '.join(TLS_CERT_REQS)}")
    for name in TLS_FILE_PARAMETERS:
        if name in options and not os.access(options[name], os.R_OK):
            raise BadInputError(f"{source} {shown}: {name} {options[name]}: no such readable file")


def _hide_credentials(text: str) -> str:
    """`text` with whatever precedes its host (user and password) replaced by ***, even when it doesn't parse."""
    before, at, host = text.rpartition("@")
    if not at:
        return text
    scheme = re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", before)
    return f"{scheme.group(0) if scheme else ''}***@{host}"


def store_url(broker: str) -> str:
    """FARM_STORE_URL: where the store lives (its entries' headers, count, refs and pins, and their bytes unless
    FARM_BLOB_STORE says otherwise); defaults to the broker's Redis."""
    return os.environ.get("FARM_STORE_URL") or broker


def blob_store_url() -> str | None:
    """FARM_BLOB_STORE: where a Redis store keeps its entries' bytes. Unset or `redis`: chunks in that Redis (fine
    for small farms); `redis://HOST:PORT/DB` (or rediss://): chunks in a Redis of their own, run as a cache (no
    append-only file, no snapshots), so that the durable Redis holds the queues and the metadata only and never
    rewrites gigabytes of cache; `file:///mnt/farm-cas`: files in a folder every worker mounts at that path (NFS,
    EFS, CephFS: the usual scale-out choice). The workers publish it (without credentials): clients that upload
    or download log in to a blob Redis with their own user, and read a blob folder where it is mounted."""
    text = os.environ.get("FARM_BLOB_STORE", "").strip()
    return None if text in ("", "redis") else _blob_store_location("FARM_BLOB_STORE", text, "redis, ")


def blob_store_client_url() -> str | None:
    """FARM_BLOB_STORE_CLIENT_URL: the blob store as clients reach it, when the workers reach it by another name (a
    compose service name, an internal address): the workers publish it instead of FARM_BLOB_STORE (always without
    credentials: each client logs in with its own user). Unset: FARM_BLOB_STORE's address."""
    text = os.environ.get("FARM_BLOB_STORE_CLIENT_URL", "").strip()
    return _blob_store_location("FARM_BLOB_STORE_CLIENT_URL", text) if text else None


def _blob_store_location(variable: str, text: str, also: str = "") -> str:
    """`text` when it names a blob store (a Redis URL the farm can use, or an absolute folder), else BadInputError
    naming `variable` and what it may be (`also`: the other spellings it takes), never its password."""
    if text.startswith(("redis://", "rediss://")):
        return redis_url(text, variable)
    if not text.startswith("file:///"):
        raise BadInputError(
            f"{variable}={_hide_credentials(text)[:80]!r}: expected {also}redis://HOST:PORT/DB, "
            "rediss://HOST:PORT/DB or file:///ABSOLUTE/PATH"
        )
    return text


def task_soft_time_limit() -> float:
    """FARM_TASK_SOFT_TIME_LIMIT: seconds a task may run before it is asked to stop (default 600)."""
    return _seconds("FARM_TASK_SOFT_TIME_LIMIT", 600)


def task_time_limit() -> float:
    """FARM_TASK_TIME_LIMIT: seconds after which a task's process is killed (default 660)."""
    return _seconds("FARM_TASK_TIME_LIMIT", 660)


def visibility_timeout() -> float:
    """FARM_VISIBILITY_TIMEOUT: seconds before Redis redelivers an unacknowledged task; longer than any task. A lost
    worker's tasks are normally sent again much sooner, when its lease lapses (worker_lease_seconds)."""
    return _seconds("FARM_VISIBILITY_TIMEOUT", task_time_limit() + 60)


def worker_lease_seconds() -> float:
    """FARM_WORKER_LEASE_SECONDS: how long a worker's liveness lease lasts without renewal (default 10; renewed
    every quarter of that). When it lapses, the tasks the worker had started are dispatched again."""
    return _seconds("FARM_WORKER_LEASE_SECONDS", 10)


def max_deliveries() -> int:
    """FARM_MAX_DELIVERIES: deliveries of one task (its first run included) before its job fails (default 3)."""
    return int(os.environ.get("FARM_MAX_DELIVERIES", 3))


def worker_redis_retries() -> int:
    """FARM_WORKER_REDIS_RETRIES: reconnections a worker tries (about 0.5 s apart) before a step fails, so that
    a Redis restart in the middle of a job is waited out (default 60)."""
    return int(os.environ.get("FARM_WORKER_REDIS_RETRIES", 60))


MAX_TENSOR_BYTES = 4 << 30
"""The largest value (model input, output, weight or intermediate) a model may have: 4 GiB. Shapes are multiplied
in exact integers and checked against it before anything is allocated, so a tiny file that claims a 2**40-element
tensor is refused (exit 2) instead of exhausting memory or wrapping int64 arithmetic."""

MAX_FOLDED_CONSTANT_BYTES = 1 << 30
"""The largest constant that constant folding evaluates at build time: 1 GiB (real models make weights of a few
hundred MiB with ConstantOfShape). A bigger result (Range(0, 2**28) is 2 GiB) stays a node that the artifact
computes, within MAX_TENSOR_BYTES."""

STORE_MAX_BYTES = 2 << 30
"""The default FARM_STORE_MAX_BYTES: 2 GiB. The farm's store shares one Redis with the queues, which must never be
refused a write (deploy/redis.conf runs with noeviction), so the store is kept well below the memory a small farm
host gives Redis: Redis uses 5-10% more than the entries' bytes (measured in benchmarks/bench_farm.py), so
about 2.2 GiB, which leaves room on a 4 GiB host for the queues and for the copy-on-write of an append-only-file
rewrite's fork. A job keeps about five times its model's weights in the store (model, weights, weight objects,
library, artifact), so the cap holds four jobs of a ResNet-50-sized model (100 MB of weights) at once, and a
running job of a model with up to about 400 MB of weights still fits under it (what a running job pins is never
evicted, so a bigger one takes the store above the cap until it ends)."""


def store_max_bytes() -> int:
    """FARM_STORE_MAX_BYTES: the cap on the bytes of the store's entries (default STORE_MAX_BYTES, 2 GiB). The
    farm's workers publish it in the store at start; least recently used entries that no live job pins are
    evicted to stay under it."""
    text = os.environ.get("FARM_STORE_MAX_BYTES", "").strip()
    if not text:
        return STORE_MAX_BYTES
    if not text.isdigit() or int(text) <= 0:
        raise BadInputError(f"FARM_STORE_MAX_BYTES={text[:40]!r}: expected a positive whole number of bytes")
    return int(text)


def tune_seconds_per_variant() -> float:
    """FARM_TUNE_SECONDS_PER_VARIANT: about how long tuning times each variant of a kernel (default 0.03; at least
    3 rounds whatever it says)."""
    return _seconds("FARM_TUNE_SECONDS_PER_VARIANT", 0.03)


def tune_lock_timeout() -> float:
    """FARM_TUNE_LOCK_TIMEOUT: seconds tuning waits for this host's tuning lock (another process timing a kernel)
    before it gives up on that kernel, which keeps its default variant (default 120; a kernel's timing holds the
    lock about a second)."""
    return _seconds("FARM_TUNE_LOCK_TIMEOUT", 120)


def emulation_timeout() -> float:
    """FARM_EMULATION_TIMEOUT: seconds one run of a cross-compiled target under qemu may take before it is stopped
    (default 600; emulated code runs a few hundred times slower than a host's own)."""
    return _seconds("FARM_EMULATION_TIMEOUT", 600)


def toolchain_label() -> str:
    """FARM_TOOLCHAIN_LABEL: a mark added to this process's toolchain identity, so that its compile and artifact
    cache entries are kept apart from those of processes with another label (default: none). It can only split
    caches, never make two toolchains share one (farm.backends.llvm.toolchain)."""
    return os.environ.get("FARM_TOOLCHAIN_LABEL", "")


def wait_fallback_seconds() -> float:
    """FARM_WAIT_FALLBACK_SECONDS: a waiting client blocks on its job's notifications and reads the job again at
    least this often anyway, so a missed notification (a dropped connection) only delays it (default 5)."""
    return _seconds("FARM_WAIT_FALLBACK_SECONDS", 5)


POLL_SECONDS = 0.05
"""The least time between two reads of a job by one waiting client: a burst of notifications is one read."""
LIVENESS_FIRST_CHECK_SECONDS = 2.0
"""A waiting client first asks which of its job's queues have no live worker this long after it starts, unless the
job ended: a check may take a second (it pings the workers), and a job a live farm ends at once needs none."""
LIVENESS_CHECK_SECONDS = 5.0
"""It asks again after the job has shown no change for this long; the pause doubles after each check while the job
still shows none."""
LIVENESS_CHECK_MAX_SECONDS = 60.0
"""The longest pause between two such checks of a job that shows no change."""
JOB_TTL_SECONDS = 7 * 24 * 3600
STAGED_TTL_SECONDS = 24 * 3600
"""How long a submitter's uploaded model waits beside the store for a worker to accept its job (it is dropped at
acceptance; this bounds what an abandoned upload holds)."""
UPLOAD_PIN_SECONDS = 3600
"""How long a blob admitted during a streamed upload stays pinned for the upload, until its job is accepted and
pins it (an hour: longer than uploading any model a farm takes, shorter than holding a dead upload's bytes)."""


def prefetch_bytes() -> int:
    """FARM_PREFETCH_BYTES: how many bytes of a job's packed weights a waiting client makes from their weights while
    the job still compiles (default 512 MiB; 0 turns it off), held in its memory until the download writes them
    (farm.distributed.client.Prefetch): the download after the link then reads the libraries and makes what is
    left."""
    text = os.environ.get("FARM_PREFETCH_BYTES", "").strip()
    if not text:
        return 512 << 20
    if not text.isdigit():
        raise BadInputError(f"FARM_PREFETCH_BYTES={text[:40]!r}: expected a whole number of bytes (0: off)")
    return int(text)


def upload_window_bytes() -> int:
    """FARM_UPLOAD_WINDOW_BYTES: how many staged bytes a client uploading into a farm with a file blob store lets
    wait in Redis for the workers to take them in before it sends more (default 256 MiB): a model of any size then
    streams through Redis instead of piling up in it."""
    text = os.environ.get("FARM_UPLOAD_WINDOW_BYTES", "").strip()
    if not text:
        return 256 << 20
    if not text.isdigit() or int(text) <= 0:
        raise BadInputError(f"FARM_UPLOAD_WINDOW_BYTES={text[:40]!r}: expected a positive whole number of bytes")
    return int(text)


def _whole_bytes(name: str, default: int, zero_means: str = "") -> int:
    """The whole number of bytes environment variable `name` holds (`default` when it is unset or blank), else
    BadInputError naming it; 0 is taken only where `zero_means` says what it turns off."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or (int(text) == 0 and not zero_means):
        expected = f"a whole number of bytes (0: {zero_means})" if zero_means else "a positive whole number of bytes"
        raise BadInputError(f"{name}={text[:40]!r}: expected {expected}")
    return int(text)


MAX_FOLDED_BYTES = 1 << 30
"""The default FARM_MAX_FOLDED_BYTES: 1 GiB. The largest light model of the onnx package, light VGG-19, folds 548
MiB of ConstantOfShape weights; a 1.4 KB model of eight ConstantOfShape([1, 64Mi]) feeding Add asks for 4 GiB,
which without a budget had its planning worker killed by the kernel on every delivery."""


def max_folded_bytes() -> int:
    """FARM_MAX_FOLDED_BYTES: the bytes constant folding may make in one plan, summed over every constant it folds
    (default MAX_FOLDED_BYTES, 1 GiB; each one is also bounded by MAX_FOLDED_CONSTANT_BYTES). Only new memory
    counts: a folded view of a constant (Unsqueeze, Reshape) is free. A model that folds more fails its
    build, locally and on the farm, naming the node that took the sum over it (exit 2). Folding stops at that node,
    so a plan holds at most this plus that node's outputs."""
    return _whole_bytes("FARM_MAX_FOLDED_BYTES", MAX_FOLDED_BYTES)


STEP_MEMORY_MIN_BYTES = 4 << 30
"""The least default FARM_STEP_MEMORY_BYTES on a host of at least twice as much memory: 4 GiB. A worker pool process
holds 0.15 GB of data when it starts (Python, numpy, LLVM) and 0.57 GB after building light ResNet-50; the light
VGG-19 (548 MiB of folded weights) takes it to 1.9 GB. A host's share per process (64 cores and 128 GiB: 2 GiB) would
fail such a build; most steps are far smaller, so several rarely peak together."""


def host_memory_bytes() -> int:
    """The memory this host gives its processes: its physical memory, or its cgroup's limit when that is lower (a
    container run with --memory: cgroup v2's memory.max, v1's memory.limit_in_bytes)."""
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limits = [physical]
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    return min(limits)


def step_memory_bytes(processes: int) -> int:
    """FARM_STEP_MEMORY_BYTES: the memory one worker pool process may write while it runs a step (plan, tune,
    compile, link, finish), enforced as its RLIMIT_DATA (farm.distributed.worker): an allocation past it fails, and
    the job fails at once with an error naming this limit, instead of the kernel's OOM killer killing the process (or
    a neighbour) on every redelivery. RLIMIT_DATA counts what a process writes (heap, anonymous mappings, thread
    stacks), not address space it reserves and never touches as RLIMIT_AS does: LLVM and PoCL's threads took a pool
    process's address space from 0.4 to 1.0 GB on its first OpenCL compile (its data: 0.5 GB), and GPU drivers
    reserve address space by the GB. Default: three quarters of the host's memory (host_memory_bytes; the rest is
    the worker's main process, a Redis beside it and the page cache) shared among the worker's `processes`, but at
    least STEP_MEMORY_MIN_BYTES (4 GiB) when the host has twice that; 0 turns it off (for a host that bounds its
    workers with a cgroup instead). A process that dies in native code past the limit (LLVM aborts on a failed
    allocation) is bounded by FARM_MAX_DELIVERIES like any death."""
    host = host_memory_bytes()
    share = host * 3 // 4 // max(1, processes)
    return _whole_bytes(
        "FARM_STEP_MEMORY_BYTES", max(share, min(STEP_MEMORY_MIN_BYTES, host // 2)), zero_means="no limit"
    )


MAX_LIVE_JOBS = 100
"""The default FARM_MAX_LIVE_JOBS: 100 jobs queued or running per team of submitters."""


def max_live_jobs() -> int:
    """FARM_MAX_LIVE_JOBS (read by the workers' intake): how many jobs one team of submitters (a Redis user of
    `farm acl`: the default submitters, or FARM_TEAMS' `farm-submitter-<team>`) may have accepted and not ended; a
    job past it fails at once, naming the quota (exit 2). Default MAX_LIVE_JOBS (100), so that one team's flood of
    real jobs queues behind its own quota, not in front of every other team's jobs forever."""
    return _whole_bytes("FARM_MAX_LIVE_JOBS", MAX_LIVE_JOBS)


def max_staged_bytes(store_cap: int) -> int:
    """FARM_MAX_STAGED_BYTES (read by the workers): the bytes of uploads one team of submitters may have staged and
    not yet taken in (a Redis user of `farm acl`: the default submitters, or a FARM_TEAMS team). Past it, a worker
    drops the team's oldest uploads (within STAGING_SWEEP_SECONDS, 30 s) and its jobs that needed them fail,
    saying why. Default: the store's cap (`store_cap`, what the workers published of FARM_STORE_MAX_BYTES), the
    most one model may stage; each team's uploads then hold at most that of Redis's memory, whatever another team
    stages."""
    return _whole_bytes("FARM_MAX_STAGED_BYTES", store_cap)


MAX_TARGETS = 64
"""The most targets one artifact holds (the runtime refuses a manifest with more: farm.runtime.manifest), so the
most a build, or a farm job's request, may name (farm.backends.registry.check_target_count)."""
