"""The build progress bar: silent until compiling starts, then done of total on stderr."""

import io

from rich.console import Console

from farm.cli.progress import BuildProgress


def test_bar_starts_with_the_first_update_and_counts_steps():
    buffer = io.StringIO()
    progress = BuildProgress("m.onnx", Console(file=buffer, force_terminal=False, width=100))
    with progress:
        assert not progress.started
        progress.update(1, 3)
        progress.update(3, 3)
        assert progress.started
    task = progress.progress.tasks[0]
    assert (task.completed, task.total) == (3, 3)
    assert "3/3" in buffer.getvalue()


def test_no_output_when_nothing_was_compiled():
    buffer = io.StringIO()
    progress = BuildProgress("m.onnx", Console(file=buffer))
    with progress:
        pass
    assert buffer.getvalue() == ""
