"""The runtime's source build: every missing kernel built at once, across processes.

Drivers compile one program at a time per process (PoCL holds one compiler lock; threads gave 1.0x on 2 cores),
so parallelism needs processes. The calling thread builds too, from the same work list, so helpers that are still
starting (0.4 s for Python and pyopencl) cost nothing and a host with one core builds in-process. Helpers are plain
`python -m farm.backends.opencl.builder` subprocesses (farm.backends.opencl.child_python), so a caller's unguarded `__main__` is
never re-imported. A helper that dies hands its kernel back to the list; a kernel that fails to build raises
BuildError with the driver's log.

Protocol on a helper's pipes: one JSON request line per kernel in; one JSON header line out, `{"size": N}`
followed by N bytes of program binary, or `{"error": message}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO, Any

from farm import defaults
from farm.backends.opencl.child_python import module_command
from farm.backends.opencl.kernel import build_binary
from farm.errors import BuildError


@dataclass(frozen=True)
class SourceJob:
    """One kernel to build: its source, how errors name it, and the launches and argument sizes to run once."""

    source: str
    what: str
    launches: list[list[Any]]
    arguments: list[int]

    def build(self, device_fingerprint: str) -> bytes:
        return build_binary(self.source, self.what, device_fingerprint, self.launches, self.arguments)


class _WorkList:
    """Jobs handed out one at a time (largest source first, for balance); results filed by job index."""

    def __init__(self, jobs: Sequence[SourceJob]) -> None:
        order = sorted(range(len(jobs)), key=lambda index: -len(jobs[index].source))
        self.jobs, self.pending, self.results = jobs, deque(order), [b""] * len(jobs)
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def take(self) -> int | None:
        with self.lock:
            return None if self.errors or not self.pending else self.pending.popleft()

    def give_back(self, index: int) -> None:
        with self.lock:
            self.pending.appendleft(index)


def build_all(jobs: Sequence[SourceJob], device_fingerprint: str, processes: int | None = None) -> list[bytes]:
    """Program binaries for `jobs`, in order, built by this thread and up to `processes - 1` helper processes."""
    work = _WorkList(jobs)
    helpers = min(max(0, (processes or defaults.cpu_count()) - 1), max(0, len(jobs) - 1))
    threads = [
        threading.Thread(target=_feed_helper, args=(work, device_fingerprint), daemon=True) for _ in range(helpers)
    ]
    for thread in threads:
        thread.start()
    _build_here(work, device_fingerprint)
    for thread in threads:
        thread.join()
    if work.errors:
        raise work.errors[0]
    return work.results


def _build_here(work: _WorkList, device_fingerprint: str) -> None:
    while (index := work.take()) is not None:
        try:
            work.results[index] = work.jobs[index].build(device_fingerprint)
        except BaseException as error:  # noqa: BLE001 - recorded, raised by build_all after the helpers stop
            work.errors.append(error)


def _feed_helper(work: _WorkList, device_fingerprint: str) -> None:
    """Start a helper process and hand it jobs until the list is empty; if it dies, its job goes back (and closing
    its stdin, which may still hold a request, must not raise: the pipe is broken)."""
    try:
        helper = subprocess.Popen(
            module_command("farm.backends.opencl.builder"), stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
    except OSError:
        return
    try:
        while (index := work.take()) is not None:
            try:
                work.results[index] = _ask(helper, work.jobs[index], device_fingerprint)
            except BuildError as error:
                work.errors.append(error)
            except (OSError, ValueError):
                work.give_back(index)
                return
    finally:
        with contextlib.suppress(BrokenPipeError):
            _pipes(helper)[0].close()
        helper.wait()


def _pipes(helper: subprocess.Popen) -> tuple[IO[bytes], IO[bytes]]:
    """A helper's stdin and stdout, which _feed_helper starts it with."""
    assert helper.stdin is not None and helper.stdout is not None, "a helper is started with both pipes"
    return helper.stdin, helper.stdout


def _ask(helper: subprocess.Popen, job: SourceJob, device_fingerprint: str) -> bytes:
    """Send one job to a helper and read its binary; OSError/ValueError when the helper is gone or garbled."""
    stdin, stdout = _pipes(helper)
    stdin.write(json.dumps({"job": asdict(job), "fingerprint": device_fingerprint}).encode() + b"\n")
    stdin.flush()
    header = json.loads(stdout.readline() or b"null")
    if not isinstance(header, dict):
        raise ValueError("the build helper exited")
    if "error" in header:
        raise BuildError(str(header["error"]))
    binary = stdout.read(int(header["size"]))
    if len(binary) != int(header["size"]):
        raise ValueError("the build helper exited mid-binary")
    return binary


def serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """A helper's loop: build each requested kernel and reply with its binary or its error."""
    for line in requests:
        request = json.loads(line)
        try:
            binary = SourceJob(**request["job"]).build(request["fingerprint"])
        except BuildError as error:
            replies.write(json.dumps({"error": str(error)}).encode() + b"\n")
        else:
            replies.write(json.dumps({"size": len(binary)}).encode() + b"\n" + binary)
        replies.flush()


def main() -> None:
    """Serve on stdin and a private copy of stdout; anything else that writes to stdout lands on stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
