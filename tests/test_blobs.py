"""pack_blob: weight bytes in, an object defining one hidden, 64-byte aligned, read-only symbol out."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from native_helpers import EM_AARCH64, aarch64, elf_header, elf_section, elf_section_bytes, elf_symbol, elf_type, host

from farm.backends.llvm.blobs import (
    BLOB_ALIGNMENT,
    BLOB_PACKERS,
    STALE_SCRATCH_SECONDS,
    blob_assembly,
    module_asm_ir,
    pack_blob,
    packer_for,
    sweep_stale_scratch,
)
from farm.backends.llvm.target import CpuTarget
from farm.errors import BuildError
from farm.ir.specs import BlobSpec

SHF_ALLOC, SHF_WRITE, SHT_PROGBITS = 0x2, 0x1, 1

TARGETS = [pytest.param(host(), "incbin", id="host-incbin"), pytest.param(aarch64(), "ir-constant", id="aarch64")]

PAYLOADS = {
    "one-byte": b"\x2a",
    "quote-backslash": b'"\\"\\\\x"\n\\22\\5C',
    "every-byte": bytes(range(256)) * 3,
    "floats": np.linspace(-1, 1, 1001, dtype=np.float32).tobytes(),
    "zeros": bytes(4096),
}


def spec_for(data: bytes, target: CpuTarget) -> BlobSpec:
    return BlobSpec(hashlib.sha256(data).hexdigest(), len(data), target.id)


def test_packer_choice():
    assert packer_for(host()) == "incbin"
    assert packer_for(aarch64()) == ("incbin" if host().arch == "aarch64" else "ir-constant")


@pytest.mark.parametrize("target, packer", TARGETS)
@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_blob_object_defines_the_bytes_as_a_hidden_aligned_symbol(target, packer, name):
    data = PAYLOADS[name]
    spec = spec_for(data, target)
    assert packer_for(target) == packer
    obj = pack_blob(spec, target, data)
    assert elf_type(obj) == 1
    if target.arch == "aarch64":
        assert elf_header(obj) == (2, 1, EM_AARCH64)
    symbol = elf_symbol(obj, spec.symbol)
    section_name = f".rodata.{spec.symbol}"
    assert (symbol.type, symbol.bind, symbol.visibility) == ("OBJECT", "GLOBAL", "HIDDEN")
    assert symbol.size == len(data) and symbol.value == 0 and symbol.section == section_name
    section = elf_section(obj, section_name)
    assert section.type == SHT_PROGBITS
    assert section.addralign == BLOB_ALIGNMENT == 64
    assert section.flags & SHF_ALLOC and not section.flags & SHF_WRITE  # read-only data
    assert elf_section_bytes(obj, section_name) == data


@pytest.mark.parametrize("target, packer", TARGETS)
def test_readelf_agrees_on_the_symbol(target, packer, tmp_path):
    data = PAYLOADS["floats"]
    spec = spec_for(data, target)
    path = tmp_path / "blob.o"
    path.write_bytes(pack_blob(spec, target, data))
    out = subprocess.run(["readelf", "-sW", str(path)], capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.split()[-1:] == [spec.symbol])
    fields = line.split()
    assert fields[2] == str(len(data)) and fields[3] == "OBJECT" and fields[4] == "GLOBAL" and fields[5] == "HIDDEN"
    sections = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True, check=True).stdout
    row = next(line for line in sections.splitlines() if f".rodata.{spec.symbol}" in line)
    assert row.split()[-1] == "64"  # Al column


def test_objcopy_extracts_the_same_bytes(tmp_path):
    target = host()
    data = PAYLOADS["every-byte"]
    spec = spec_for(data, target)
    path, out = tmp_path / "blob.o", tmp_path / "blob.bin"
    path.write_bytes(pack_blob(spec, target, data))
    subprocess.run(["objcopy", "-O", "binary", f"--only-section=.rodata.{spec.symbol}", str(path), str(out)],
                   check=True, capture_output=True)
    assert out.read_bytes() == data


@pytest.mark.parametrize("target, packer", TARGETS)
def test_packing_is_deterministic(target, packer):
    data = PAYLOADS["floats"]
    spec = spec_for(data, target)
    assert pack_blob(spec, target, data) == pack_blob(spec, target, data)


def test_both_packers_give_the_same_section_bytes_for_the_host():
    target = host()
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    spec = spec_for(data, target)
    for packer in BLOB_PACKERS.values():
        obj = packer(spec.symbol, target, data)
        assert elf_section_bytes(obj, f".rodata.{spec.symbol}") == data
        assert elf_symbol(obj, spec.symbol).visibility == "HIDDEN"


def test_mismatched_size_is_a_build_error():
    data = b"weights"
    spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data) + 1, host().id)
    with pytest.raises(BuildError, match=spec.symbol):
        pack_blob(spec, host(), data)


def test_blob_assembly_and_module_asm_escaping():
    text = blob_assembly("farm_w_abc", "/tmp/x/blob.bin", 12)
    assert '.section .rodata.farm_w_abc,"a",@progbits' in text
    assert ".p2align 6" in text and ".hidden farm_w_abc" in text and ".size farm_w_abc, 12" in text
    assert '.incbin "/tmp/x/blob.bin"' in text
    ir_text = module_asm_ir(host(), 'a "quoted" \\ line\nsecond')
    assert ir_text.splitlines() == [f'target triple = "{host().triple}"', 'module asm "a \\22quoted\\22 \\5C line"',
                                    'module asm "second"']


@pytest.mark.parametrize("target, packer", TARGETS)
def test_a_blob_with_panels_holds_the_tensor_pre_packed(target, packer):
    """BlobSpec.panels = (rows, m, k): the object holds the float32 tensor in the Gemm's panel layout, per m x k
    block, made from the source bytes inside the pure step."""
    from farm.backends.llvm.gemm import pack_panels

    weights = np.arange(2 * 5 * 3, dtype=np.float32).reshape(2, 5, 3)
    data = weights.tobytes()
    spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), target.id, panels=(2, 5, 3))
    obj = pack_blob(spec, target, data)
    assert elf_section_bytes(obj, f".rodata.{spec.symbol}") == pack_panels(weights, 2).tobytes()
    assert spec.symbol != spec_for(data, target).symbol  # the plain and the packed bytes never share a symbol


def test_panels_that_do_not_divide_the_blob_are_a_build_error():
    data = np.zeros(7, np.float32).tobytes()
    spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), host().id, panels=(2, 2, 2))
    with pytest.raises(BuildError, match="not float32 blocks of 2 x 2"):
        pack_blob(spec, host(), data)
    odd = np.zeros(9, np.float32).tobytes()
    for panels in ((0, 3, 3), (2, 3, 3, 2), (2, 3), (3, 3, 1, 0, 1), (-1, 3, 3)):  # as a message might carry them
        spec = BlobSpec(hashlib.sha256(odd).hexdigest(), len(odd), host().id, panels=panels)
        with pytest.raises(BuildError, match="neither"):
            pack_blob(spec, host(), odd)


def test_a_blob_with_column_panels_holds_b_pre_packed_and_transposed_when_stored_so():
    """BlobSpec.panels = (width, k, n, transposed): B in pack_columns' layout, turned first when stored n x k."""
    from farm.backends.llvm.gemm import pack_columns

    weights = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    data = weights.tobytes()
    for transposed in (0, 1):
        spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), host().id, panels=(2, 3, 5, transposed))
        obj = pack_blob(spec, host(), data)
        stored = weights.reshape(2, 5, 3) if transposed else weights
        assert elf_section_bytes(obj, f".rodata.{spec.symbol}") == pack_columns(stored, 2, bool(transposed)).tobytes()


# --- scratch that nothing can leak --------------------------------------------------------------------------------

LARGE_BLOB = 256 << 20

PACK_A_LARGE_BLOB = f"""
import hashlib, os, sys
from farm.backends.llvm.blobs import pack_blob
from farm.backends.llvm.target import host_target
from farm.ir.specs import BlobSpec
marker = bytes.fromhex(os.environ["BLOB_MARKER"])
target, data = host_target(), marker + bytes({LARGE_BLOB} - len(marker))
spec = BlobSpec(hashlib.sha256(data).hexdigest(), len(data), target.id)
print("packing", flush=True)
while True:
    pack_blob(spec, target, data)
"""


def blob_scratch(pid: int) -> list[str]:
    """The blob scratch process `pid` holds open or mapped: farm-blob memory files, or an older version's
    farm-blob-* files."""
    links = []
    for entry in Path(f"/proc/{pid}/fd").iterdir():
        try:
            links.append(os.readlink(entry))
        except OSError:  # closed meanwhile
            continue
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return [name for name in links + maps if "farm-blob" in name]


def files_starting_with(folder: Path, marker: bytes) -> list[Path]:
    """Files under `folder` (not following links) whose bytes begin with `marker`: what is left of one blob."""
    found = []
    for root, _, names in os.walk(folder, onerror=lambda error: None):
        for name in names:
            path = Path(root) / name
            try:
                with open(path, "rb") as file:
                    head = file.read(len(marker))
            except OSError:  # not ours to read, or gone meanwhile
                continue
            if head == marker:
                found.append(path)
    return found


def test_a_packing_process_killed_mid_pack_leaves_nothing_behind(tmp_path):
    """A real child process packs a large blob, is SIGKILLed while its scratch is open, and nothing remains in
    /dev/shm or its temp folder: the scratch was an anonymous memory file, freed with the process."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    marker = os.urandom(32)
    env = {**os.environ, "TMPDIR": str(scratch), "BLOB_MARKER": marker.hex()}
    child = subprocess.Popen([sys.executable, "-c", PACK_A_LARGE_BLOB], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "packing\n"
        deadline = time.monotonic() + 120
        while not blob_scratch(child.pid):
            assert child.poll() is None and time.monotonic() < deadline, "the child never held its blob scratch"
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert list(scratch.iterdir()) == []
    assert files_starting_with(Path("/dev/shm"), marker) == []


def old_scratch(folder: Path, name: str, age: float) -> Path:
    """What an older version's crash left: farm-blob-*/blob.bin, `age` seconds old."""
    path = folder / name
    path.mkdir()
    (path / "blob.bin").write_bytes(b"leaked weights")
    then = time.time() - age
    for item in (path / "blob.bin", path):
        os.utime(item, (then, then))
    return path


def test_stale_scratch_of_older_versions_is_swept(tmp_path):
    stale = old_scratch(tmp_path, "farm-blob-old", STALE_SCRATCH_SECONDS + 60)
    fresh = old_scratch(tmp_path, "farm-blob-busy", 1)  # an older process on this host may still be packing it
    other = old_scratch(tmp_path, "not-farm", STALE_SCRATCH_SECONDS + 60)
    assert sweep_stale_scratch([tmp_path]) == [stale]
    assert not stale.exists() and fresh.exists() and other.exists()


def test_the_sweep_never_follows_a_symlink(tmp_path):
    victim = old_scratch(tmp_path, "victim", STALE_SCRATCH_SECONDS + 60)
    scratch = tmp_path / "shm"
    scratch.mkdir()
    (scratch / "farm-blob-planted").symlink_to(victim)
    assert sweep_stale_scratch([scratch], now=time.time() + 10 * STALE_SCRATCH_SECONDS) == []
    assert (victim / "blob.bin").read_bytes() == b"leaked weights"


def test_a_missing_folder_is_nothing_to_sweep(tmp_path):
    assert sweep_stale_scratch([tmp_path / "absent"]) == []
