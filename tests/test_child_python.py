"""Fresh Python processes that run one of farm's modules from this same farm package."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from farm.backends.opencl.child_python import module_command


def test_a_child_started_elsewhere_runs_this_farms_module(tmp_path: Path) -> None:
    (tmp_path / "farm").mkdir()  # a decoy package in the child's working directory must not win
    (tmp_path / "farm" / "__init__.py").write_text('raise ImportError("the decoy farm was imported")\n')
    done = subprocess.run(
        module_command("farm.backends.opencl.devices"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)
