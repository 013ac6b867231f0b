"""How a waiting command stops: Ctrl-C or SIGTERM (what GitLab, GitHub Actions and Kubernetes send a cancelled CI
job) while `farm submit`, `wait` or `download` waits on the farm ends with one line on stderr saying how it was
stopped and what became of the job (cancelled, left running, nothing written), and exit status 130 or 143; never a
traceback, never a job left running that the user meant to cancel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

import click

from farm.errors import ExitStatus


class Terminated(BaseException):
    """SIGTERM while a farm job is waited on: what GitLab, GitHub Actions and Kubernetes send a cancelled CI job.
    Raised by the handler `on_stop` installs, so that it ends the wait as Ctrl-C's KeyboardInterrupt does
    (a BaseException like it, so no `except Exception` on the way swallows it); Python's default would end the
    process at once, silently, and the job would go on."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


STOPS: dict[type[BaseException], tuple[str, ExitStatus]] = {
    KeyboardInterrupt: ("interrupted", ExitStatus.INTERRUPTED),
    Terminated: ("terminated (SIGTERM)", ExitStatus.TERMINATED),
}
"""How the user (or the CI runner) stopped a wait: the word said on stderr and the exit status."""


@contextlib.contextmanager
def on_stop(react: Callable[[str, ExitStatus], NoReturn]) -> Iterator[None]:
    """Ctrl-C or SIGTERM while the block runs: `react(how it was stopped, exit status)` once the exception has
    unwound the block (what it was writing is removed). SIGTERM's previous handler is back when the block ends."""
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except (KeyboardInterrupt, Terminated) as stop:
        react(*STOPS[type(stop)])
    finally:
        signal.signal(signal.SIGTERM, previous)


def stoppable(client, job_id: str, cancel: bool) -> contextlib.AbstractContextManager[None]:
    """Ctrl-C or SIGTERM while the block waits on the job: cancel it (or leave it running), say which, exit 130 or
    143 (`_stop`)."""
    return on_stop(lambda how, status: _stop(client, job_id, cancel, how, status))


def stops_saying(where: str) -> contextlib.AbstractContextManager[None]:
    """Ctrl-C or SIGTERM while the block runs (a download: no job to cancel): say how it was stopped and `where`,
    exit 130 or 143."""

    def say_and_exit(how: str, status: ExitStatus) -> NoReturn:
        click.echo(f"farm: {how} {where}", err=True)
        sys.exit(int(status))

    return on_stop(say_and_exit)


@contextlib.contextmanager
def exits_saying(where: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM while the block runs (an upload: nothing of it is this machine's to clean up, its staged
    bytes expire): say how it was stopped and `where`, and exit 130 or 143 from the signal's handler, without
    unwinding through the Redis client that the signal may have cut off mid-command (a SIGTERM raised during an
    upload once ended a CI run's client with a segmentation fault, not reproduced since). The previous handlers are
    back when the block ends."""

    def exit_now(signum: int, frame: object) -> None:
        how, status = STOPS[Terminated if signum == signal.SIGTERM else KeyboardInterrupt]
        sys.stderr.write(f"farm: {how} {where}\n")
        sys.stderr.flush()
        os._exit(int(status))

    previous = {signum: signal.signal(signum, exit_now) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _stop(client, job_id: str, cancel: bool, how: str, status: ExitStatus) -> NoReturn:
    """The wait was stopped: cancel the job (or leave it running), say which and how it was stopped, exit with
    `status`. A second Ctrl-C or SIGTERM can't cut the cancel short."""
    from farm.errors import UnreachableError

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not cancel:
        click.echo(f"farm: {how}; job {job_id} goes on: farm wait {job_id} / farm cancel {job_id}", err=True)
    else:
        try:
            cancelled = client.cancel(job_id)
            click.echo(
                f"farm: {how}; job {job_id} "
                + ("cancelled" if cancelled else f"had already ended: farm status {job_id}"),
                err=True,
            )
        except UnreachableError as error:
            click.echo(
                f"farm: {how}, but job {job_id} could not be cancelled ({error}): farm cancel {job_id}", err=True
            )
    sys.exit(int(status))
