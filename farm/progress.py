"""The build progress bar on stderr: kernels and blobs done of total, shown once compiling starts."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class BuildProgress:
    """A rich progress bar for one build; `update(done, total)` is the build's progress callback."""

    def __init__(self, label: str, console: Console | None = None) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("kernels+blobs"), TimeElapsedColumn(),
                                 console=console or Console(stderr=True), transient=False)
        self.task = self.progress.add_task(f"building {label}", total=None)
        self.started = False

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.progress.stop()

    def update(self, done: int, total: int) -> None:
        """Called after each compile step; the bar appears with the first one, so bad input prints no bar."""
        if not self.started:
            self.progress.start()
            self.started = True
        self.progress.update(self.task, completed=done, total=total)
