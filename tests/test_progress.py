"""Build progress on stderr (farm/cli/progress.py): plain lines where stderr is not a terminal (CI logs), one live row
on a terminal, the phases of a local build and the states of a farm job, and nothing but stderr."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnx
import pytest
from rich.cells import cell_len
from rich.console import Console

from farm.backends.llvm.target import host_target
from farm.cli.progress import PlainProgress, TerminalProgress, build_progress, escaped
from farm.distributed.client import FarmClient
from farm.distributed.job_record import JobState
from farm.distributed.steps import Farm
from farm.tools import examples
from tests.services import RedisServer, redis_server_fixture  # noqa: F401
from tests.test_cli import CHECKOUT

LOCAL_PHASES = ["planning", "compiling", "linking", "writing"]
COUNT_LINE = re.compile(r"(compiling|tuning) (\d+)/(\d+) \((\d+)%\), \d+\.\d s")
CONTROL_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("progress")
    onnx.save(examples.tiny_cnn(), folder / "tiny_cnn.onnx")
    return folder


def _farm(*args: object, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`farm ARGS` with stdout and stderr pipes, as CI runs it; the bytes kept as written."""
    path = os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "farm", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        timeout=300,
    )


def _plain_lines(stderr: bytes, label: str) -> list[str]:
    """The lines after `farm: LABEL: `, once every byte was checked to be printable ASCII or a newline."""
    assert all(32 <= byte < 127 or byte == 10 for byte in stderr), stderr
    lines = stderr.decode().splitlines()
    assert all(line.startswith(f"farm: {label}: ") for line in lines), lines
    return [line[len(f"farm: {label}: ") :] for line in lines]


def _phases(lines: list[str]) -> list[str]:
    return [line for line in lines if not COUNT_LINE.fullmatch(line) and not line.startswith("done, ")]


def _counts(lines: list[str], phase: str = "compiling") -> list[tuple[int, int]]:
    return [(int(m[2]), int(m[3])) for m in map(COUNT_LINE.fullmatch, lines) if m and m[1] == phase]


def test_submit_without_a_terminal_prints_a_line_per_phase_and_counts_every_unit_opencl_too(
    model_folder: Path, tmp_path: Path, fingerprint: str
) -> None:
    """CI's case: stderr a pipe (and FORCE_COLOR set, as many CI setups do): plain lines in phase order, counts up
    to every unit (the OpenCL program binaries too: each is a unit, built and run once before the count moves),
    and stdout the one JSON object."""
    result = _farm(
        "submit",
        model_folder / "tiny_cnn.onnx",
        "--target",
        "cpu",
        "--target",
        f"opencl:{fingerprint}",
        "--json",
        "-o",
        tmp_path,
        cwd=tmp_path,
        env={"FORCE_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    lines = _plain_lines(result.stderr, "tiny_cnn.onnx")
    assert _phases(lines) == LOCAL_PHASES and re.fullmatch(r"done, \d+\.\d s", lines[-1])
    counts = _counts(lines)
    units = job["kernels"]  # the CPU kernels and the OpenCL binaries
    assert counts[-1] == (units, units) and all(total == units for _, total in counts)
    assert [done for done, _ in counts] == sorted(done for done, _ in counts)
    assert _counts([lines[lines.index("linking") - 1]]) == [(units, units)]


def test_a_model_refused_at_import_gets_its_error_line_alone(tmp_path: Path) -> None:
    (tmp_path / "bad.onnx").write_bytes(b"not a model")
    result = _farm("submit", "bad.onnx", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(b"farm: error: ")
    assert result.stderr.count(b"\n") == 1 and result.stdout == b""


def test_count_lines_come_each_tenth_and_at_the_end_and_a_late_count_is_dropped() -> None:
    stream = io.StringIO()
    with PlainProgress("m.onnx", stream, quiet_start=0) as progress:
        progress.phase("planning")
        progress.phase("compiling")
        for done in range(1, 312):
            progress.update(done, 312)
        progress.phase("linking")  # the executor's last callback may come after the build went on
        progress.update(312, 312)
    lines = _plain_lines(stream.getvalue().encode(), "m.onnx")
    assert _phases(lines) == ["planning", "compiling", "linking"]
    counts = _counts(lines)
    assert counts[0] == (1, 312) and counts[-1] == (312, 312) and 11 <= len(counts) <= 12
    assert lines[-2].startswith("compiling 312/312 (100%), ") and lines[-1] == "linking"


def test_a_failed_farm_job_keeps_the_count_it_reached() -> None:
    """Statuses as FarmClient.status gives them: a job that failed at a unit did not compile the rest."""
    stream = io.StringIO()
    with PlainProgress("j on the farm", stream, quiet_start=0) as progress:
        for state, done in (("queued", 0), ("planning", 0), ("compiling", 2), ("failed", 2)):
            progress.status(
                {
                    "job_id": "j",
                    "state": state,
                    "model": "m",
                    "done": done,
                    "total": 4 * (done > 0),
                    "kernels": 3,
                    "blobs": 1,
                    "seconds": 0.5,
                }
            )
    lines = _plain_lines(stream.getvalue().encode(), "j on the farm")
    assert _phases(lines) == ["queued", "planning", "compiling", "failed"] and _counts(lines) == [(2, 4)]


def test_nothing_shows_within_the_quiet_start_and_a_slow_phase_shows_after_it() -> None:
    quiet = io.StringIO()
    with pytest.raises(ValueError), PlainProgress("m.onnx", quiet, quiet_start=0.5) as progress:
        progress.phase("planning")
        raise ValueError("refused")
    slow = io.StringIO()
    with PlainProgress("m.onnx", slow, quiet_start=0.2) as progress:
        progress.phase("planning")
        deadline = time.monotonic() + 10
        while not slow.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slow.getvalue() == "farm: m.onnx: planning\n"
    time.sleep(0.7)
    assert quiet.getvalue() == ""


def test_a_label_with_control_characters_prints_them_as_question_marks() -> None:
    stream = io.StringIO()
    with PlainProgress("m\x1b[31m\r\n.onnx", stream, quiet_start=0) as progress:
        progress.phase("compiling")
    assert stream.getvalue() == "farm: m?[31m??.onnx: compiling\n"


def test_a_worker_name_prints_its_control_characters_escaped() -> None:
    """A lost worker's name (it names itself) stays readable and can't recolour the terminal, move the cursor or end
    the line: `farm: worker w2\\x1b[2J lost; ...`."""
    assert escaped("w2@host-7.example") == "w2@host-7.example"
    assert escaped("w2\x1b[2J\r\n\u202eé") == "w2\\x1b[2J\\r\\n\\u202eé"


def _frames(console_file: io.StringIO) -> list[str]:
    """What each refresh of a live row left on screen, without control sequences."""
    text = CONTROL_SEQUENCE.sub("", console_file.getvalue())
    return [frame for frame in re.split(r"[\r\n]", text) if frame.strip()]


def test_terminal_row_at_80_columns_shortens_the_label_never_the_phase_or_count() -> None:
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80, color_system=None)
    progress = build_progress("resnet18_exported_with_a_long_name.onnx on the farm", console, quiet_start=0)
    assert isinstance(progress, TerminalProgress)
    with progress:
        for event in (
            lambda: progress.phase("planning"),
            lambda: progress.phase("compiling"),
            lambda: progress.update(57, 312),
            lambda: progress.update(12345, 123456),
            lambda: progress.phase("linking"),
            lambda: progress.phase("done"),
        ):
            event()
            progress.live.refresh()
    frames = _frames(screen)
    assert all(cell_len(frame) <= 80 for frame in frames), frames
    assert any(" planning " in frame for frame in frames)
    assert any(frame.endswith(" 57/312 0:00:00") and " compiling " in frame for frame in frames), frames
    assert any(" 12345/123456 " in frame for frame in frames), frames
    assert any(" linking " in frame and " 123456/123456 " in frame for frame in frames), frames
    assert all("resnet18_exported" in frame and "…" in frame for frame in frames)


def test_terminal_row_fits_the_label_whole_when_there_is_room() -> None:
    screen = io.StringIO()
    with build_progress("m.onnx", Console(file=screen, force_terminal=True, width=80), quiet_start=0) as progress:
        progress.phase("compiling")
        progress.update(3, 7)
        progress.live.refresh()
    assert any(" m.onnx compiling " in frame and " 3/7 " in frame for frame in _frames(screen))


def test_no_terminal_means_plain_lines_even_when_rich_would_draw() -> None:
    assert isinstance(build_progress("m.onnx", Console(file=io.StringIO(), force_terminal=False)), PlainProgress)
    dumb = Console(file=io.StringIO(), force_terminal=True, _environ={"TERM": "dumb"})
    assert isinstance(build_progress("m.onnx", dumb), PlainProgress)


def test_a_farm_job_shows_the_boards_states_in_order_with_its_counts(
    redis_server: RedisServer, model_folder: Path
) -> None:
    """The real client's statuses (FarmClient.wait on a real Redis), the board moved as workers move it, each
    move made once the client has read the one before."""
    client = FarmClient(redis_server.url)
    job_id = client.submit(model_folder / "tiny_cnn.onnx", [host_target()])
    Farm(client.board, client.store, lambda message: None).accept(job_id)
    board, artifact_key = client.board, client.store.put(b"artifact")
    seen: list[dict] = []
    moves = [
        (lambda: board.advance(job_id, JobState.PLANNING), lambda s: s["state"] == "planning"),
        (lambda: board.advance(job_id, JobState.TUNING, tune_units=["t/k1", "t/k2"]), lambda s: s["state"] == "tuning"),
        (lambda: board.complete(job_id, "tune", "t/k1"), lambda s: s["tuning"]["done"] == 1),
        (lambda: board.complete(job_id, "tune", "t/k2"), lambda s: s["tuning"]["done"] == 2),
        (lambda: board.advance(job_id, JobState.PLANNING, tuned=True), lambda s: s["state"] == "planning"),
        (lambda: board.advance(job_id, JobState.COMPILING, total=4), lambda s: s["state"] == "compiling"),
        (lambda: board.complete(job_id, "compile", "a"), lambda s: s["done"] == 1),
        (lambda: [board.complete(job_id, "compile", name) for name in "bcd"], lambda s: s["done"] == 4),
        (lambda: board.advance(job_id, JobState.LINKING), lambda s: s["state"] == "linking"),
        (lambda: board.advance(job_id, JobState.DONE, artifact_key=artifact_key, finished=time.time()), lambda s: True),
    ]

    def build() -> None:
        for move, read in [(lambda: None, lambda s: s["state"] == "queued"), *moves]:
            move()
            deadline = time.monotonic() + 30
            while not (seen and read(seen[-1])) and time.monotonic() < deadline:
                time.sleep(0.01)

    stream = io.StringIO()
    threading.Thread(target=build, daemon=True).start()
    with PlainProgress(f"{job_id} on the farm", stream, quiet_start=0) as progress:
        status = client.wait(job_id, timeout=60, on_progress=lambda s: [seen.append(s), progress.status(s)])
    assert status["state"] == "done"
    lines = _plain_lines(stream.getvalue().encode(), f"{job_id} on the farm")
    assert _phases(lines) == ["queued", "planning", "tuning", "planning", "compiling", "linking"]
    assert _counts(lines, "tuning") == [(0, 2), (1, 2), (2, 2)]
    assert _counts(lines) == [(0, 4), (1, 4), (4, 4)]
    assert re.fullmatch(r"done, \d+\.\d s", lines[-1])
