"""The build progress bars on stderr: kernels timed by --tune, then kernels and blobs done of total, each shown once
its phase starts."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class BuildProgress:
    """Rich progress bars for one build; `update(done, total)` is the build's progress callback and
    `tuning(done, total)` its tuning's."""

    def __init__(self, label: str, console: Console | None = None) -> None:
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[unit]}"), TimeElapsedColumn(),
                                 console=console or Console(stderr=True), transient=False)
        self.task = self.progress.add_task(f"building {label}", total=None, visible=False, start=False,
                                           unit="kernels+blobs")
        self.label = label
        self.tune_task: TaskID | None = None
        self.started = False

    def __enter__(self) -> BuildProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.progress.stop()

    def update(self, done: int, total: int) -> None:
        """Called after each compile step; the bar appears with the first one, so bad input prints no bar."""
        self._start()
        self.progress.start_task(self.task)  # its clock starts now, not while tuning ran
        self.progress.update(self.task, completed=done, total=total, visible=True)

    def tuning(self, done: int, total: int) -> None:
        """Called after each kernel that --tune timed; its bar appears with the first one."""
        self._start()
        if self.tune_task is None:
            self.tune_task = self.progress.add_task(f"tuning {self.label}", total=total, unit="kernels timed")
        self.progress.update(self.tune_task, completed=done, total=total)

    def _start(self) -> None:
        if not self.started:
            self.progress.start()
            self.started = True
