"""Real farm processes for tests: `farm worker` subprocesses against a real redis-server. No mocks.

A worker runs in its own process group, so `kill()` can SIGKILL it together with its pool children, the way a host
dies. Its log goes to a file in the test's folder, which failures print.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from farm.distributed.acl import ROLES, acl_file, role_named
from tests.services import RedisServer, _started_servers

WORKER_START_TIMEOUT_S = 60.0

FARM_ENV_OVERRIDES = (
    "FARM_TASK_SOFT_TIME_LIMIT",
    "FARM_TASK_TIME_LIMIT",
    "FARM_VISIBILITY_TIMEOUT",
    "FARM_WORKER_LEASE_SECONDS",
    "FARM_MAX_DELIVERIES",
    "FARM_STORE_MAX_BYTES",
    "FARM_STEP_MEMORY_BYTES",
    "FARM_MAX_FOLDED_BYTES",
    "FARM_MAX_LIVE_JOBS",
    "FARM_MAX_STAGED_BYTES",
)
"""Settings a worker takes from the environment: cleared, so every worker here runs with the production defaults
unless a test names a setting it is about."""


class FarmWorker:
    """One `farm worker` process (concurrency 1 unless told otherwise)."""

    def __init__(
        self, broker: str, name: str, folder: Path, env: dict[str, str] | None = None, concurrency: int = 1
    ) -> None:
        self.broker, self.name, self.folder = broker, name, folder
        inherited = {name: value for name, value in os.environ.items() if name not in FARM_ENV_OVERRIDES}
        self.env = {**inherited, **(env or {})}
        self.concurrency = concurrency
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.name.replace('@', '_')}.log"

    def start(self) -> FarmWorker:
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
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self._wait_until_ready()
        return self

    def _wait_until_ready(self) -> None:
        client = redis.Redis.from_url(self.broker, decode_responses=True)
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while not client.hexists("farm:workers", self.name):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} did not start:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the worker and its pool children at once."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it lingers."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


TEAMS = ("vision", "nlp-2")
"""Teams of submitters with their own Redis users in tests (FARM_TEAMS)."""
PASSWORDS = {role: f"{role.replace(':', '-')}-secret" for role in [*ROLES, *(f"team:{team}" for team in TEAMS)]}
"""The farm's Redis users' passwords in tests (farm.distributed.acl), the teams' included."""
FARM_ACL = acl_file(PASSWORDS, default_user="on nopass ~* &* +@all")
"""The ACL a test farm's Redis runs with: the farm's users as production has them, plus the default user for the
tests' own pokes at Redis (production turns it off)."""


class Farm:
    """A redis-server with the farm's ACL users, and the workers started on it; everything stops when the block
    ends. Workers log in as farm-worker; `url` is a submitter's (what users and CI hold), `worker_url` the
    workers' and the operator's, `flower_url` Flower's."""

    def __init__(self, redis_server: RedisServer, folder: Path, blobs: RedisServer | None = None) -> None:
        """`blobs`: a blob Redis (FARM_BLOB_STORE=redis://...) with the same ACL, where workers keep the bytes."""
        self.redis, self.folder, self.workers, self.blobs = redis_server, folder, [], blobs

    def role_url(self, role: str) -> str:
        return self.redis.url_for(role_named(role).user, PASSWORDS[role])

    def team_url(self, team: str) -> str:
        """The URL of a team's submitters (`farm-submitter-<team>`)."""
        return self.role_url(f"team:{team}")

    @property
    def url(self) -> str:
        return self.role_url("submitter")

    @property
    def worker_url(self) -> str:
        return self.role_url("worker")

    @property
    def flower_url(self) -> str:
        return self.role_url("flower")

    def add_worker(self, name: str, **options) -> FarmWorker:
        if self.blobs is not None:
            blob_store = self.blobs.url_for(ROLES["worker"].user, PASSWORDS["worker"])
            options["env"] = {"FARM_BLOB_STORE": blob_store, **options.get("env", {})}
        self.workers.append(FarmWorker(self.worker_url, name, self.folder, **options).start())
        return self.workers[-1]

    def logs(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.log_tail()}" for w in self.workers)

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()


def farm_cli(
    *args: str, broker: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `farm ARGS` in a fresh process with FARM_BROKER_URL set, as a user or CI would."""
    return subprocess.run(
        [sys.executable, "-m", "farm", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FARM_BROKER_URL": broker, **(env or {})},
    )


@pytest.fixture(name="farm_factory")
def farm_factory_fixture(tmp_path: Path) -> Iterator:
    """`farm_factory(workers=2)`: a fresh redis-server with that many workers; all stopped after the test.
    `blob_redis=True`: a second redis-server, the farm's blob Redis (FARM_BLOB_STORE), beside it."""
    farms: list[Farm] = []
    with _started_servers() as start_redis:

        def make(workers: int = 2, blob_redis: bool = False, **worker_options) -> Farm:
            farm = Farm(start_redis(acl=FARM_ACL), tmp_path, start_redis(acl=FARM_ACL) if blob_redis else None)
            farms.append(farm)
            for index in range(workers):
                farm.add_worker(f"w{index + 1}-{len(farms)}@test", **worker_options)
            return farm

        try:
            yield make
        finally:
            for farm in farms:
                farm.close()


def packed_weight_symbol(model: Path) -> str:
    """The symbol of a weight `model`'s host build packs in panels: one unit of the farm.pack_blob task (plain
    weights are artifact members with no unit), for the fault-injection drills."""
    from farm.backends.llvm.target import host_target
    from farm.build.assembly import compile_units, plan_model

    return next(unit.spec.symbol for unit in compile_units(plan_model(model), [host_target()]) if unit.kind == "blob")
