"""Real services for tests: a redis-server per test, on a free port, in a throwaway folder. No mocks.

Tests use the fixtures by importing them into their module (pytest finds fixtures among the module's names):

    from tests.services import RedisServer, redis_server_fixture  # noqa: F401

    def test_something(redis_server: RedisServer) -> None:
        store = RedisStore(redis_server.url)

The functions are named `*_fixture` and registered under the short name (`@pytest.fixture(name=...)`), so the test
argument doesn't shadow the import and `ruff check` stays clean (importing `redis_server` itself would trip F811).

`redis_server` gives a fresh server per test; `redis_servers` is a factory for tests that need several, or one with
a password. Servers run with an append-only file fsynced on every write (`--appendonly yes --appendfsync always`)
and no RDB snapshots, so `restart()` after `stop()` or even `kill()` (SIGKILL) comes back with every write. If
redis-server is not installed the fixtures fail with a clear error rather than skip: CI must not pass without it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

_START_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 10.0
_running: set[RedisServer] = set()
starting_allowed_for: str | None = None
"""The test now running when it is marked `services` (tests/conftest.py sets it), else None: a server started for
an unmarked test fails it, so `-m "not services"` (the fast lane) never starts one and the marker can't drift."""


class ServiceError(RuntimeError):
    """A test service could not be found or started; the message says what to install or read."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it; it may be taken again later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_server_binary() -> str:
    """The redis-server executable ($FARM_REDIS_SERVER, else on PATH), or ServiceError saying how to get one."""
    configured = os.environ.get("FARM_REDIS_SERVER")
    found = (
        configured
        or shutil.which("redis-server")
        or next(
            (path for path in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.access(path, os.X_OK)), None
        )
    )
    if not found or not os.access(found, os.X_OK):
        raise ServiceError(
            "redis-server is not installed (or $FARM_REDIS_SERVER is wrong); install the Debian package "
            "redis-server (scripts/setup.sh does) to run the farm's tests"
        )
    return found


class RedisServer:
    """One redis-server process on 127.0.0.1, its data and log in one folder that restarts reuse.

    The port and folder stay the same over stop()/kill() and restart(), so clients reconnect to the same URL and
    the server reloads its append-only file.
    """

    def __init__(
        self, password: str | None = None, port: int | None = None, folder: Path | None = None, acl: str | None = None
    ) -> None:
        """`acl`: the text of an ACL file (farm.distributed.acl) the server loads; its users log in with
        `url_for`, while `url` stays the default user's."""
        self.password, self.acl = password, acl
        self._own_folder = folder is None
        self.folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="farm-test-redis-"))
        self.port = port or 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The redis:// URL of database 0, with the password when there is one."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def url_for(self, user: str, password: str) -> str:
        """The redis:// URL of database 0 for one of the ACL's users."""
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.folder / "redis.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING; a port taken meanwhile is retried with another one.

        Only the first start may change port: after that the URL is fixed, so a restart that can't bind fails.
        """
        if self.running:
            return self
        attempts = 1 if self.port else 3
        for attempt in range(attempts):
            if not self.port or attempt:
                self.port = free_port()
            self._spawn()
            try:
                self._wait_until_ready()
                return self
            except ServiceError:
                self._reap()
                if attempt + 1 == attempts or "Address already in use" not in self._log_tail():
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Shut the server down cleanly (SIGTERM: it flushes its append-only file and exits)."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would; with fsync always no acknowledged write is lost."""
        self._signal(signal.SIGKILL)

    def restart(self) -> RedisServer:
        """Stop the server if it runs, then start it again on the same port and folder, reloading its data."""
        self.stop()
        return self.start()

    def client(self) -> redis.Redis:
        """A redis-py client for poking at the server directly (e.g. corrupting a value on purpose)."""
        return redis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=10)

    def close(self) -> None:
        """Stop the server and remove its folder if this object made it."""
        self.stop()
        if self._own_folder:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisServer(port={self.port}, folder={str(self.folder)!r}, running={self.running})"

    def _arguments(self) -> list[str]:
        arguments = [
            redis_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.folder),
            "--logfile", str(self.log_path),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.password:
            arguments += ["--requirepass", self.password]
        if self.acl is not None:
            (self.folder / "users.acl").write_text(self.acl)
            arguments += ["--aclfile", str(self.folder / "users.acl")]
        return arguments

    def _spawn(self) -> None:
        """Start redis-server in its own session, so a Ctrl-C aimed at pytest doesn't kill it mid-test."""
        if starting_allowed_for is None and os.environ.get("PYTEST_CURRENT_TEST"):
            raise ServiceError(
                f"{os.environ['PYTEST_CURRENT_TEST']} starts a redis-server but is not marked "
                "services: add its fixture to SERVICE_FIXTURES in tests/conftest.py, or mark it "
                "@pytest.mark.services"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self._arguments(), cwd=self.folder, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        _running.add(self)

    def _wait_until_ready(self) -> None:
        """Return once PING answers; ServiceError (with the server's log) if it exits or stays silent too long."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if not self.running:
                    raise ServiceError(f"redis-server on port {self.port} exited at start:\n{self._log_tail()}")
                with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    if client.ping():
                        return
                time.sleep(0.02)
        finally:
            client.close()
        raise ServiceError(
            f"redis-server on port {self.port} didn't answer within {_START_TIMEOUT_S} s:\n{self._log_tail()}"
        )

    def _signal(self, signum: int) -> None:
        """Send `signum` and wait for the process to exit (SIGKILL if it won't)."""
        if self.running and self.process is not None:
            self.process.send_signal(signum)
        self._reap()

    def _reap(self) -> None:
        """Wait for the process to end, killing it if it outlives the stop timeout."""
        process, self.process = self.process, None
        _running.discard(self)
        if process is None:
            return
        try:
            process.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@atexit.register
def _kill_leftovers() -> None:
    """Kill servers a crashed or interrupted test left running, so no redis-server outlives the test session."""
    for server in list(_running):
        server.kill()


@contextlib.contextmanager
def _started_servers() -> Iterator[Callable[..., RedisServer]]:
    """A function that starts servers, all closed when the block ends (shared by both fixtures below)."""
    started: list[RedisServer] = []

    def start(password: str | None = None, acl: str | None = None) -> RedisServer:
        server = RedisServer(password=password, acl=acl)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.close()


@pytest.fixture(name="redis_servers")
def redis_servers_fixture() -> Iterator[Callable[..., RedisServer]]:
    """Factory fixture: `redis_servers(password=None)` starts a new server; all are stopped after the test."""
    with _started_servers() as start:
        yield start


@pytest.fixture(name="redis_server")
def redis_server_fixture() -> Iterator[RedisServer]:
    """A fresh, empty redis-server (no password) for one test."""
    with _started_servers() as start:
        yield start()


@dataclass(frozen=True)
class TlsFiles:
    """A test certificate authority and a server certificate it signed for 127.0.0.1 and localhost (PEM files)."""

    ca: Path
    cert: Path
    key: Path


def make_tls_files(folder: Path) -> TlsFiles:
    """A fresh CA and a server certificate for 127.0.0.1/localhost in `folder`, made with openssl (one day, 2048-bit
    RSA); two calls give two unrelated CAs, so one can play the wrong CA."""
    folder.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    ca_key, request, extensions = folder / "ca.key", folder / "server.csr", folder / "server.ext"
    extensions.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    for command in (
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=farm test CA",
            "-keyout",
            ca_key,
            "-out",
            files.ca,
        ],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", files.key, "-out", request],
        [
            "x509",
            "-req",
            "-in",
            request,
            "-CA",
            files.ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            extensions,
            "-out",
            files.cert,
        ],
    ):
        subprocess.run(["openssl", *map(str, command)], check=True, capture_output=True)
    return files


class TlsRedisServer(RedisServer):
    """A redis-server that speaks only TLS: `--port 0` closes the plain port and the TLS port takes its number, so
    nothing travels in clear. `url` is the rediss:// URL naming the test CA (ssl_ca_certs)."""

    def __init__(self, tls: TlsFiles, **options: Any) -> None:
        """`options`: RedisServer's (password, port, folder, acl)."""
        super().__init__(**options)
        self.tls = tls

    @property
    def url(self) -> str:
        return self._over_tls(super().url)

    def url_for(self, user: str, password: str) -> str:
        return self._over_tls(super().url_for(user, password))

    def _over_tls(self, url: str) -> str:
        return f"rediss://{url.removeprefix('redis://')}?ssl_ca_certs={quote(str(self.tls.ca))}"

    def _arguments(self) -> list[str]:
        arguments = super()._arguments()
        plain = arguments.index("--port")
        arguments[plain + 1] = "0"
        return arguments + [
            "--tls-port",
            str(self.port),
            "--tls-cert-file",
            str(self.tls.cert),
            "--tls-key-file",
            str(self.tls.key),
            "--tls-ca-cert-file",
            str(self.tls.ca),
            "--tls-auth-clients",
            "no",
        ]
