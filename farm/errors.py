"""Errors that farm raises on purpose, each tied to the exit status the CLI documents.

Every error names what is wrong (the node, the op, the file) so that a user can act on it without a traceback.
"""

from __future__ import annotations

import ssl
from enum import IntEnum
from urllib.parse import urlsplit, urlunsplit


class ExitStatus(IntEnum):
    """Exit statuses of the `farm` CLI (documented in README.md)."""

    OK = 0
    BUILD_FAILED = 1
    BAD_INPUT = 2
    CANCELLED_OR_UNKNOWN = 3
    UNREACHABLE = 4
    REGRESSION = 5
    STILL_RUNNING = 6
    INTERRUPTED = 130
    TERMINATED = 143


class FarmError(Exception):
    """Base of every error farm raises deliberately."""

    exit_status: ExitStatus = ExitStatus.BUILD_FAILED


class BadInputError(FarmError):
    """The user's input (model, artifact, arguments, input arrays) is wrong; nothing was built."""

    exit_status = ExitStatus.BAD_INPUT


class ModelLoadError(BadInputError):
    """The model file can't be read or parsed, or refers to files it must not read."""


class UnsupportedError(BadInputError):
    """A node uses an op, attribute, dtype or dynamic shape outside farm's op set."""

    def __init__(self, reason: str, *, node: str = "", op: str = "", domain: str = "", opset: int = 0) -> None:
        self.reason, self.node, self.op, self.domain, self.opset = reason, node, op, domain, opset
        where = f"node {node!r} (op {op!r}, domain {domain or 'ai.onnx'!r}, opset {opset})" if op else "model"
        super().__init__(f"{where}: {reason}")


class ArtifactError(BadInputError):
    """An artifact is tampered, truncated, unsafe or not for this host."""


class EmulationError(BadInputError):
    """A CPU target of another architecture can't run here under emulation (qemu or the target's C library is
    missing, or its architecture has no emulator), or its emulated run failed (a signal, a timeout)."""


class RunInputError(BadInputError):
    """The arrays given to a model at run time don't match its inputs."""


class StillRunningError(FarmError):
    """`farm wait --timeout` ran out while the job goes on: neither a failed build nor a finished one."""

    exit_status = ExitStatus.STILL_RUNNING


EXTRA_OF_PACKAGE = {
    "numpy": "worker",
    "ml_dtypes": "worker",
    "onnx": "worker",
    "llvmlite": "worker",
    "celery": "worker",
    "kombu": "worker",
    "cryptography": "worker",
    "pyopencl": "opencl",
    "flower": "flower",
}
"""The extra of pyproject.toml that brings each package (by module) a client install (pip install farm) lacks."""


class MissingPackageError(BadInputError):
    """A command needs a package this install lacks: building, running or serving on a client install."""

    def __init__(self, module: str) -> None:
        super().__init__(
            f"this command needs {module}, which a client install (pip install farm: submit to a farm "
            f"and fetch from it) lacks: pip install 'farm[{EXTRA_OF_PACKAGE[module]}]'"
        )


def missing_package(error: ModuleNotFoundError) -> MissingPackageError | None:
    """The error to report for a failed import of a package one of farm's extras brings; None for any other."""
    module = (error.name or "").partition(".")[0]
    return MissingPackageError(module) if module in EXTRA_OF_PACKAGE else None


class UnreachableError(FarmError):
    """The farm's Redis (broker, job board or store) can't be reached: down, wrong address, refused credentials."""

    exit_status = ExitStatus.UNREACHABLE


class CredentialsRefusedError(UnreachableError):
    """The farm's Redis answered but refused the URL's credentials. Unlike a server that is down, this won't pass
    by waiting, so a worker exits at once rather than retrying."""

    def __init__(self, url: str) -> None:
        super().__init__(credentials_refused(url))


class TlsRefusedError(UnreachableError):
    """The farm's Redis answered a rediss:// URL with a certificate that fails verification (another CA than the
    URL's ssl_ca_certs, a name it wasn't issued for). Like refused credentials, no wait fixes it."""

    def __init__(self, url: str, failure: ssl.SSLCertVerificationError) -> None:
        super().__init__(tls_refused(url, failure))


def tls_refused(url: str, failure: ssl.SSLCertVerificationError) -> str:
    """The message for a Redis at `url` whose certificate failed verification: why, and which option to check."""
    reason = getattr(failure, "verify_message", None) or str(failure)
    return (
        f"the farm's Redis at {redact_url(url)} failed TLS verification: {reason} (check that the URL's "
        "ssl_ca_certs is the CA that signed the server's certificate and that the certificate names the URL's host)"
    )


def tls_verification_failure(error: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind a client's connection error, if that is what it was (redis-py
    raises its own ConnectionError while handling the ssl module's error, so the cause is in the chain)."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, ssl.SSLCertVerificationError):
        seen = seen.__cause__ or seen.__context__
    return seen


def credentials_refused(url: str) -> str:
    """The message for a Redis that refused `url`'s credentials: whether the URL lacks a password or has a wrong
    one (never the password itself)."""
    wrong = "has a wrong password (or user)" if urlsplit(url).password else "lacks the password the server requires"
    return f"the farm's Redis at {redact_url(url)} refused the connection: the URL {wrong}"


class NotPermittedError(CredentialsRefusedError):
    """The farm's Redis took the URL's user but refused it a command or key (its ACL, farm.distributed.acl): a
    submitter's credentials used for what only workers and the operator may do."""

    def __init__(self, url: str, refusal: str) -> None:
        FarmError.__init__(
            self,
            f"the farm's Redis at {redact_url(url)} refused this to the URL's user ({refusal}): "
            "submitters' credentials submit, follow, cancel and download jobs; workers and "
            "`farm store` need the workers' credentials",
        )


class FarmStateError(FarmError):
    """The farm's Redis answered a call with an error: a farm key holds another kind of value than the farm keeps
    there (an operator's mistake, or an older farm's), or the server is at its maxmemory. Like an unreachable farm,
    nothing the user changes fixes it (exit status 4); the message says who can."""

    exit_status = ExitStatus.UNREACHABLE

    HINTS = {
        "WRONGTYPE": "a farm key holds another kind of value than the farm keeps there (the workers delete "
        "such keys within a minute; if this persists, tell the farm's operator)",
        "OOM": "the server is at its maxmemory (deploy/redis.conf): tell the farm's operator",
    }
    """What to do, by the first word of Redis's error."""

    def __init__(self, url: str, error: str) -> None:
        first_line = error.splitlines()[0][:200] if error else "an error"
        hint = self.HINTS.get(first_line.split(" ", 1)[0], "")
        super().__init__(
            f"the farm's Redis at {redact_url(url)} refused a call ({first_line})" + (f": {hint}" if hint else "")
        )


class JobError(FarmError):
    """A farm job is unknown (expired or never submitted) or was cancelled."""

    exit_status = ExitStatus.CANCELLED_OR_UNKNOWN


class JobFailed(FarmError):
    """A farm step failed its job with one of farm's own errors (the job record holds it): the task ends in Celery
    state FAILURE with this error, so Flower shows the task that failed the job and why. It is a refusal, not a bug,
    so workers log it in one line (Celery's expected exceptions: farm.distributed.tasks.FarmTask.throws)."""

    def __init__(self, message: str, exit_status: ExitStatus = ExitStatus.BUILD_FAILED) -> None:
        super().__init__(message)
        self.exit_status = exit_status


class BuildError(FarmError):
    """A compile, pack or link step failed; carries the failing kernel or blob and the tool's log."""


def redact_url(url: str) -> str:
    """`url` with its password replaced by ***, fit for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
