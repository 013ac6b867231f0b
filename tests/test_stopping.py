"""farm.cli.stopping: a stop while a block runs says how and exits 130 or 143, after what the block was writing is
removed (the commands' stops on a real farm are in tests/test_cli.py)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from farm.atomic import stream_atomically
from farm.cli.stopping import stops_saying


def test_a_sigterm_during_a_download_removes_the_half_written_artifact_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = signal.getsignal(signal.SIGTERM)

    def write(file) -> None:
        file.write(b"half an artifact")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises first

    with pytest.raises(SystemExit) as stopped, stops_saying("while downloading; nothing was written"):
        stream_atomically(tmp_path / "m.farm", write)
    assert stopped.value.code == 143 and list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err == "farm: terminated (SIGTERM) while downloading; nothing was written\n"
    assert signal.getsignal(signal.SIGTERM) is previous
