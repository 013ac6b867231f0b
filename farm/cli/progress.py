"""Build progress on stderr, never stdout (which holds the artifact's path or the --json object).

A build goes through phases (a local build: planning, tuning when asked, compiling, linking, writing, done; a farm
job: the board's states, queued to done) and counts two of them: the kernels `--tune` times and the units it
compiles. On a terminal one live row shows the label, the phase, a bar and the count (`TerminalProgress`);
anywhere else, CI logs above all, plain lines do (`PlainProgress`): one per phase, and during a count one every
COUNT_LINE_SECONDS or each COUNT_LINE_FRACTION of it, printable text only:

    farm: resnet18.onnx: planning
    farm: resnet18.onnx: compiling
    farm: resnet18.onnx: compiling 57/312 (18%), 4.2 s

Nothing shows until the first phase has run QUIET_START_SECONDS or a second phase starts, so a model refused at
import is answered by its one error line alone.
"""

from __future__ import annotations

import datetime
import sys
import threading
import time
import unicodedata
from abc import ABC, abstractmethod
from typing import IO, Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

QUIET_START_SECONDS = 1.0
COUNT_LINE_SECONDS = 5.0
COUNT_LINE_FRACTION = 0.1
COUNTED_PHASES = ("tuning", "compiling")
"""The phases that count: --tune's kernels timed (`tuning`), the units compiled (`update`)."""
UNFINISHED_ENDS = ("failed", "cancelled")
"""The farm's states that end a job before its count did (JobState)."""
BAR_WIDTH = 20


class BuildProgress(ABC):
    """What both forms share: the phase, its count, when to start showing; callable from any thread (a local
    build's compile count comes from the executor's threads).

    `phase(name)`, `update(done, total)` and `tuning(done, total)` are build_model's callbacks; `status(dict)` takes
    a farm job's status (FarmClient.wait's on_progress). A count that arrives after its phase ended (the executor's
    last callback can run after the build went on) is dropped, and a counted phase that ends has counted all.
    """

    def __init__(self, label: str, quiet_start: float) -> None:
        self.label = label
        self.quiet_start = quiet_start
        self.current: str | None = None
        self.ended: set[str] = set()
        self.done = self.total = 0
        self.started = self.phase_started = time.monotonic()
        self.shown = self.closed = False
        self.lock = threading.RLock()
        self.timer: threading.Timer | None = None

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.closed = True
            if self.timer is not None:
                self.timer.cancel()
            if self.shown:
                self._close()

    def phase(self, name: str) -> None:
        """A phase starts (the same name again changes nothing)."""
        with self.lock:
            if name == self.current or self.closed:
                return
            first = self.current is None
            if not first:
                self._reveal()  # the phase that ends now, if it ended within the quiet start
                self._end_phase(name)
            self.current, self.done, self.total, self.phase_started = name, 0, 0, time.monotonic()
            if self.shown:
                self._show_phase()
            elif self.quiet_start <= 0:
                self._reveal()
            else:
                self.timer = threading.Timer(self.quiet_start, self._reveal)
                self.timer.daemon = True
                self.timer.start()

    def update(self, done: int, total: int) -> None:
        """`done` of `total` units compiled."""
        self._count("compiling", done, total)

    def tuning(self, done: int, total: int) -> None:
        """`done` of `total` kernels timed by --tune."""
        self._count("tuning", done, total)

    def status(self, status: dict[str, Any]) -> None:
        """A farm job's status (FarmClient.status): its state is the phase; compiling and tuning carry counts."""
        self.phase(status["state"])
        tuning = status.get("tuning") or {}
        if status["state"] == "compiling" and status.get("total"):
            self.update(status["done"], status["total"])
        elif status["state"] == "tuning" and tuning.get("total"):
            self.tuning(tuning["done"], tuning["total"])

    def _count(self, name: str, done: int, total: int) -> None:
        with self.lock:
            if name in self.ended or self.closed:
                return
            self.phase(name)
            self.done, self.total = done, total
            if self.shown:
                self._show_count()
            else:
                self._reveal()

    def _end_phase(self, following: str) -> None:
        """The current phase ends: a counted one has counted everything when the build went on (not when the job
        failed or was cancelled)."""
        if self.current in COUNTED_PHASES:
            self.ended.add(self.current)
            if self.shown and self.total and self.done < self.total and following not in UNFINISHED_ENDS:
                self.done = self.total
                self._show_count()

    def _reveal(self) -> None:
        with self.lock:
            if self.shown or self.closed:
                return
            self.shown = True
            self._open()
            self._show_phase()
            if self.total:
                self._show_count()

    @abstractmethod
    def _open(self) -> None:
        """Start showing (once)."""

    @abstractmethod
    def _show_phase(self) -> None:
        """Show that `current` started."""

    @abstractmethod
    def _show_count(self) -> None:
        """Show `done` of `total` in the current phase."""

    @abstractmethod
    def _close(self) -> None:
        """Stop showing."""


def printable(text: str) -> str:
    """`text` with every control character (C0, C1, DEL, line breaks) as '?': a file name may hold any of them."""
    return "".join("?" if unicodedata.category(char).startswith("C") else char for char in text)


def escaped(text: str) -> str:
    """`text` with every control character (C0, C1, DEL, line breaks, bidi overrides) as its Python escape (\\x1b,
    \\u202e) and the rest as is: a name that farm prints but didn't choose stays readable and can't move the cursor,
    recolour the terminal or end the line. The one helper for that: `farm inspect` and every command of
    farm/cli/ print untrusted strings (model names, errors, worker names, manifests' strings) through it."""
    return "".join(
        char.encode("unicode_escape").decode() if unicodedata.category(char).startswith("C") else char for char in text
    )


class PlainProgress(BuildProgress):
    """Lines for logs: `farm: LABEL: PHASE` at each phase; during a count `farm: LABEL: PHASE DONE/TOTAL (P%), S s`
    (S: seconds in the phase) each COUNT_LINE_FRACTION, after COUNT_LINE_SECONDS without one, and at its end;
    `farm: LABEL: done, S s` (S: seconds since the start). No control characters, no colour, nothing drawn."""

    def __init__(self, label: str, stream: IO[str], quiet_start: float = QUIET_START_SECONDS) -> None:
        super().__init__(printable(label), quiet_start)
        self.stream = stream
        self.said = (0, 0)
        self.said_at = 0.0

    def _open(self) -> None:
        pass

    def _show_phase(self) -> None:
        now = time.monotonic()
        self._say(f"done, {now - self.started:.1f} s" if self.current == "done" else printable(self.current or ""))
        self.said, self.said_at = (0, 0), now

    def _show_count(self) -> None:
        if not self.total or (self.done, self.total) == self.said:
            return
        now = time.monotonic()
        said_step = self._step(*self.said) if self.said[1] == self.total else -1
        if (
            self.done >= self.total
            or self._step(self.done, self.total) > said_step
            or now - self.said_at >= COUNT_LINE_SECONDS
        ):
            self._say(
                f"{self.current} {self.done}/{self.total} ({100 * self.done // self.total}%), "
                f"{now - self.phase_started:.1f} s"
            )
            self.said, self.said_at = (self.done, self.total), now

    @staticmethod
    def _step(done: int, total: int) -> int:
        return int(done / total / COUNT_LINE_FRACTION)

    def _close(self) -> None:
        pass

    def _say(self, text: str) -> None:
        self.stream.write(f"farm: {self.label}: {text}\n")
        self.stream.flush()


class TerminalProgress(BuildProgress):
    """One live row: spinner, label, phase, bar, count, time since the start. The bar pulses while no count is
    known (planning, the first seconds of a compile) and stays as the last count left it through linking and
    writing; the spinner turns until done.

    Only the label gives way when the row is too wide (cut with an ellipsis, then the bar shrinks with it), so the
    phase and the count always show whole. Lines written to stderr meanwhile (farm: no live worker ...) print
    above the row; stdout is left alone. The label (a file's name) is shown `escaped`: rich would write its escape
    sequences to the terminal as they are."""

    def __init__(self, label: str, console: Console, quiet_start: float = QUIET_START_SECONDS) -> None:
        super().__init__(escaped(label), quiet_start)
        self.spinner = Spinner("dots")
        self.row: tuple[str, int, int] = ("", 0, 0)
        """(phase, done, total) as shown: read by the refresh thread without the lock, so replaced whole."""
        self.live = Live(
            console=console,
            get_renderable=self.render,
            refresh_per_second=10,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=True,
        )

    def render(self) -> RenderableType:
        """The row as it stands (called by the live display's refresh thread)."""
        phase, done, total = self.row
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)  # spinner
        grid.add_column()  # label: the first to give way
        grid.add_column(no_wrap=True)  # phase
        grid.add_column()  # bar: gives way once the label is as narrow
        grid.add_column(no_wrap=True)  # count
        grid.add_column(no_wrap=True)  # elapsed
        ended = phase == "done" or phase in UNFINISHED_ENDS
        grid.add_row(
            "" if ended else self.spinner.render(time.monotonic()),
            Text(self.label, no_wrap=True, overflow="ellipsis"),
            phase,
            self._bar(phase, done, total),
            f"{done}/{total}" if total else "",
            str(datetime.timedelta(seconds=int(time.monotonic() - self.started))),
        )
        return grid

    @staticmethod
    def _bar(phase: str, done: int, total: int) -> ProgressBar:
        """Full when done, pulsing while no count is known, else done of total."""
        if phase == "done":
            return ProgressBar(total=1, completed=1, width=BAR_WIDTH)
        return ProgressBar(total=total or None, completed=done, width=BAR_WIDTH, pulse=not total)

    def _open(self) -> None:
        self.live.start()

    def _show_phase(self) -> None:
        _, done, total = self.row
        self.row = (
            "" if self.current is None else self.current,
            *((0, 0) if self.current in COUNTED_PHASES else (done, total)),
        )

    def _show_count(self) -> None:
        self.row = (self.row[0], self.done, self.total)

    def _close(self) -> None:
        self.live.stop()


def build_progress(
    label: str, console: Console | None = None, quiet_start: float = QUIET_START_SECONDS
) -> BuildProgress:
    """The progress for stderr (or `console`): a live row on an interactive terminal, plain lines elsewhere (CI
    logs, files, TERM=dumb). Only a real terminal gets the row: FORCE_COLOR, which CI setups often export, would
    make rich draw it into the log."""
    console = console or Console(stderr=True, force_terminal=None if _is_a_terminal(sys.stderr) else False)
    if console.is_interactive:
        return TerminalProgress(label, console, quiet_start)
    return PlainProgress(label, console.file, quiet_start)


def _is_a_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty (a replaced stream), or closed
        return False


def megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


class UploadLines:
    """A farm submit's upload on stderr, as plain lines: what the farm lacks of the model when the upload starts,
    a line every COUNT_LINE_SECONDS or COUNT_LINE_FRACTION of the bytes, and the total when it ends (an upload
    of nothing but the graph says so in one line)."""

    def __init__(self, label: str, stream: IO[str] | None = None) -> None:
        self.label, self.stream = printable(label), stream or sys.stderr
        self.started = self.said_at = time.monotonic()
        self.said_bytes = 0
        self.opened = False

    def __call__(self, upload: Any) -> None:
        """Takes a farm.distributed.uploads.Upload."""
        now = time.monotonic()
        if not self.opened:
            self.opened = True
            self._say(
                f"uploading {upload.missing_blobs} of {upload.blobs} weights ({megabytes(upload.missing_bytes)} "
                f"of {megabytes(upload.bytes)}; the farm has the rest)"
                if upload.missing_blobs
                else f"the farm has all {upload.blobs} weights ({megabytes(upload.bytes)}); uploading the graph"
            )
        elif upload.stalled:
            self._say("waiting for the farm's workers to take the upload in (is a 'farm worker' running?)")
        elif upload.done:
            if upload.sent_bytes:
                self._say(f"uploaded {megabytes(upload.sent_bytes)} in {now - self.started:.1f} s")
        elif (
            upload.sent_bytes - self.said_bytes >= COUNT_LINE_FRACTION * upload.missing_bytes
            or now - self.said_at >= COUNT_LINE_SECONDS
        ):
            self.said_at, self.said_bytes = now, upload.sent_bytes
            self._say(
                f"uploaded {megabytes(upload.sent_bytes)} of {megabytes(upload.missing_bytes)} "
                f"({100 * upload.sent_bytes // max(1, upload.missing_bytes)}%)"
            )

    def _say(self, text: str) -> None:
        self.stream.write(f"farm: {self.label}: {text}\n")
        self.stream.flush()
