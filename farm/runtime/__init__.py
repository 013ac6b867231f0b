"""farm's runtime: load an artifact, pick the target built for this host and run it.

Nothing is loaded before the manifest's signature has been checked (when the runtime is given trusted keys), the
manifest against its schema (farm.runtime.manifest) and every member's sha256 against the manifest (once per
artifact file: farm.runtime.cache). Each backend
brings its loader, in its folder (`loader_of`): the CPU library (farm.backends.llvm.loader; a cross-compiled one
under qemu: farm.runtime.emulation) or the OpenCL programs (farm.backends.opencl.loader), each imported only when
it loads, so that a CPU load never imports pyopencl.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from farm import defaults
from farm.artifact import check_signed, open_artifact, public_key_hex
from farm.backends.registry import BACKENDS, backend_named
from farm.errors import ArtifactError
from farm.runtime.model import Model, TensorSpec
from farm.runtime.sized import SizedModel

if TYPE_CHECKING:  # only here: it imports the LLVM backend's emulation driver, which a native load never needs
    from farm.runtime.emulation import EmulatedModel

__all__ = ["Loader", "Model", "SizedModel", "TensorSpec", "load", "loader_of"]


class Loader(Protocol):
    """Loads the artifact at `path` to run on this host's device of one kind (on the target `target` names, where
    the kind has several)."""

    def __call__(
        self, path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None, threads: int, target: str | None
    ) -> Any: ...


def loader_of(kind: str) -> Loader:
    """The loader of the backend of `kind`: `LOADER` in its folder's `loader` module (farm/backends/<kind>/loader.py),
    imported only when it loads, so that a CPU load never imports pyopencl."""
    return cast(Loader, BACKENDS[kind].module("loader").LOADER)


def load(
    path: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    device: str = "cpu",
    threads: int = 0,
    trust: Sequence[str] = (),
    target: str | None = None,
) -> Model | SizedModel | EmulatedModel:
    """Verify the artifact (once per artifact file), choose this host's target and load its library from the cache
    (<cache_dir>/runtime/, written on the first load).

    `target`: the CPU target to run instead, named as `farm submit --target` named it (`cpu:aarch64-linux-gnu`) or by
    its id (farm.runtime.selection); one of another architecture than this host's runs under qemu user-mode emulation,
    one process per run (an EmulatedModel: farm.runtime.emulation), and with one thread whatever `threads` says.

    `threads`: how many threads a CPU run may use; 0 (the default) means every CPU this process may run on, 1 runs
    the whole schedule in one native call (farm_run) on the calling thread.

    `device="opencl"` runs the artifact's OpenCL part on this host's OpenCL device instead (farm.backends.opencl.loader);
    that load reads every member it uses, each checked against its sha256 as it is read, so the artifact is
    opened without hashing it all twice.

    An artifact of several sizes (`farm submit --shape batch=1,8,32`) loads every size, as a SizedModel whose `run`
    runs the size that fits the feeds (farm.runtime.sized).

    `trust`: Ed25519 public keys (PEM file paths or 64 hex digits), with those of FARM_TRUSTED_KEYS; when there is
    any, an artifact not signed by one of them is refused before anything is loaded.
    """
    keys = {public_key_hex(_key_bytes(source)) for source in [*trust, *defaults.trusted_keys()]}
    if keys:
        check_signed(open_artifact(path), keys)
    return loader_of(backend_named(device, "device", ArtifactError).kind)(path, cache_dir, threads, target)


def _key_bytes(source: str) -> bytes:
    """A trusted key as given: 64 hex digits as they are, else the bytes of the file it names."""
    if len(source) == 64 and all(char in "0123456789abcdefABCDEF" for char in source):
        return source.encode()
    try:
        return Path(source).read_bytes()
    except OSError as error:
        raise ArtifactError(f"can't read trusted key {source!r}: {error.strerror or error}") from None
