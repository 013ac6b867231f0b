"""OpenCL devices and their fingerprints (farm/backends/opencl/devices.py), on the real PoCL platform installed here.

A host (or CI runner) without an OpenCL platform fails these tests, it doesn't skip them: install pocl-opencl-icd.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyopencl as cl
import pytest

from farm.backends.opencl.devices import BUILD_OPTIONS, fingerprint, opencl_devices

REPO = Path(__file__).resolve().parent.parent
INFO = {
    "platform": "Portable Computing Language",
    "platform_version": "OpenCL 3.0 PoCL 3.1",
    "device": "cpu",
    "vendor": "AuthenticAMD",
    "driver_version": "3.1",
    "opencl_c_version": "OpenCL C 1.2 PoCL",
    "build_options": BUILD_OPTIONS,
}


def test_a_fingerprint_is_16_hex_digits_and_stable() -> None:
    first = fingerprint(INFO)
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    assert fingerprint(dict(INFO)) == first
    assert fingerprint(dict(reversed(list(INFO.items())))) == first  # the order of fields doesn't matter
    code = "import json, sys; from farm.backends.opencl.devices import fingerprint; print(fingerprint(json.loads(sys.argv[1])))"
    other_process = subprocess.run(
        [sys.executable, "-c", code, json.dumps(INFO)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert other_process.stdout.strip() == first, other_process.stderr  # nothing per process goes into it


@pytest.mark.parametrize("field", sorted(INFO))
def test_a_fingerprint_changes_with_any_field(field: str) -> None:
    changed = {**INFO, field: INFO[field] + " "}
    assert fingerprint(changed) != fingerprint(INFO)
    assert fingerprint({name: value for name, value in INFO.items() if name != field}) != fingerprint(INFO)


def test_opencl_devices_finds_pocl_here() -> None:
    devices = opencl_devices()
    if not any(device["platform"] == "Portable Computing Language" for device in devices):
        pytest.fail(f"no PoCL device found (got {devices}); install pocl-opencl-icd: the farm's OpenCL tests need it")
    expected = [(platform.name, device.name) for platform in cl.get_platforms() for device in platform.get_devices()]
    assert [(device["platform"], device["device"]) for device in devices] == expected
    for device in devices:
        assert set(device) == {*INFO, "fingerprint"}
        assert device["build_options"] == BUILD_OPTIONS
        assert device["fingerprint"] == fingerprint({name: device[name] for name in INFO})
    assert opencl_devices() == devices  # the same host gives the same fingerprints


def _devices_in_a_fresh_process(env: dict[str, str], prelude: str = "") -> list:
    code = f"{prelude}import json; from farm.backends.opencl.devices import opencl_devices; print(json.dumps(opencl_devices()))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_no_platform_means_no_devices(tmp_path: Path) -> None:
    empty = tmp_path / "vendors"
    empty.mkdir()
    env = {"OCL_ICD_VENDORS": str(empty), "OPENCL_VENDOR_PATH": str(empty)}
    probe = subprocess.run(
        [sys.executable, "-c", "import pyopencl as cl; print(len(cl.get_platforms()))"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert probe.returncode != 0 or probe.stdout.strip() == "0", "the empty vendor folder still found a platform"
    assert _devices_in_a_fresh_process(env) == []
    assert _devices_in_a_fresh_process({}) != []  # the same code finds PoCL with the normal vendor folder


def test_no_pyopencl_means_no_devices() -> None:
    assert _devices_in_a_fresh_process({}, "import sys; sys.modules['pyopencl'] = None\n") == []


def test_a_fresh_process_lists_the_same_devices_without_starting_a_driver_here() -> None:
    code = (
        "import json, sys; from farm.backends.opencl.devices import opencl_devices_of_a_fresh_process as listed; "
        "devices = listed(); print(json.dumps([devices, 'pyopencl' in sys.modules]))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    devices, imported_pyopencl = json.loads(done.stdout)
    assert devices == opencl_devices() and not imported_pyopencl
