"""`farm run`'s arrays: model inputs read from .npy files (never pickles, never a header's claim past the file's
size) and outputs written as .npz or summarised; numpy is imported here, not by the command line's other
commands (a client that only submits and downloads doesn't need it)."""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from farm.errors import BadInputError


def parse_inputs(pairs: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each NAME=FILE.npy as an array by name."""
    feeds = {}
    for pair in pairs:
        name, sep, file = pair.partition("=")
        if not sep or not name or not file:
            raise BadInputError(f"--input {pair!r}: expected NAME=FILE.npy")
        if name in feeds:
            raise BadInputError(f"--input {name} is given twice; give each input once")
        try:
            _check_npy_size(file)
            feeds[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:
            raise BadInputError(f"--input {name}: can't read {file!r} as a .npy array: {error}") from None
    return feeds


_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _check_npy_size(file: str) -> None:
    """Refuse a .npy whose header claims more data than the file holds, before numpy allocates for the claim."""
    with open(file, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version not in _NPY_HEADER_READERS:
            raise ValueError(f".npy format version {version} is not supported")
        shape, _, dtype = _NPY_HEADER_READERS[version](f)
        available = os.fstat(f.fileno()).st_size - f.tell()
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > available:
        raise ValueError(f"its header claims shape {list(shape)} {dtype} ({claimed} bytes) but it holds {available}")


def save_outputs(path: str, outputs: dict[str, np.ndarray]) -> None:
    """Write an .npz as np.savez does, but for any output name (np.savez takes `file` and `allow_pickle` as its
    own arguments)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in outputs.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def summary(name: str, array: np.ndarray) -> str:
    flat = array.reshape(-1)
    head = ", ".join(f"{v:.6g}" for v in flat[:8])
    more = ", ..." if flat.size > 8 else ""
    return f"{name}: shape {list(array.shape)} {array.dtype} argmax {int(flat.argmax())} [{head}{more}]"
