"""A build's compile units: one object per distinct kernel per CPU target, one packed weight per weight that a CPU
target's kernels read pre-packed in panels, one program binary per kernel per OpenCL device. Each backend's part
(farm/backends/<kind>/part.py) declares the kinds of unit it builds and what each is (`UnitKindTraits`).

Each unit kind names its pure step, (spec, target, input bytes) -> bytes, and its cache ref: the local executor
and the farm's workers call the same step on the same unit, so both build the same bytes, and both keep them in
their store's compile cache the same way (`cache_unit`, `cached_unit`). A CPU unit's ref holds
the compiler key of the process that asks (farm.backends.llvm.toolchain), an OpenCL unit's the device fingerprint
(which holds the driver's version), so no process reads bytes that another toolchain built.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from farm.backends.registry import BACKENDS, Target, backend_of, target_from_json
from farm.errors import BadInputError, BuildError
from farm.ir.specs import BlobSpec, KernelSpec
from farm.ir.unit_kinds import UnitKind
from farm.store import CorruptEntryError, MissingEntryError, Store

Spec = Union[KernelSpec, BlobSpec]
Data = Union[bytes, memoryview, None]


def compile_kernel(spec: KernelSpec, target: Target, data: Data) -> bytes:
    """A kernel unit's step: its backend's compile step (farm.backends.base.Backend.compile_kernel)."""
    return backend_of(target).compile_kernel(spec, target)


@dataclass(frozen=True)
class UnitKindTraits:
    """What a kind of unit is: its spec type, its step, its cache ref, how errors name it.

    `big_bytes`: its input is a weight blob, so the local executor runs it in the building process (LLVM releases
    the GIL) instead of sending the bytes through a pipe. `verify(bytes, what)`: raises BuildError when bytes read
    back from the cache can't be what the step makes (an object with load-time code), so they are rebuilt.
    `build` and `ref` take the kind's own spec type and kind of target (a packed weight a CpuTarget, an OpenCL
    kernel an OpenClTarget), which one table of every kind can only write as Any."""

    label: str
    spec_type: type[KernelSpec] | type[BlobSpec]
    build: Callable[[Any, Any, Data], bytes]
    ref: Callable[[Any, Any], str]
    big_bytes: bool = False
    verify: Callable[[bytes, str], None] = lambda data, what: None


def traits_of(kind: UnitKind) -> UnitKindTraits:
    """What a kind of unit is: the part that builds it says (its backend's `part` module, `unit_kinds`)."""
    return unit_kinds()[kind]


@functools.cache
def unit_kinds() -> dict[UnitKind, UnitKindTraits]:
    """Every kind of unit any backend builds, with its traits."""
    modules = [backend.module("part") for backend in BACKENDS.values()]
    return {kind: traits for module in modules for kind, traits in module.PART.unit_kinds.items()}


@dataclass(frozen=True)
class CompileUnit:
    """One thing to build: a kernel object, a packed weight or a program binary, for one target. `name` (target id /
    symbol) names it in progress, errors, the link order and Flower."""

    kind: UnitKind
    spec: Spec
    target: Target

    @property
    def name(self) -> str:
        return f"{self.target.id}/{self.spec.unit_symbol if isinstance(self.spec, KernelSpec) else self.spec.symbol}"

    @property
    def cache_ref(self) -> str:
        """The store ref under which the built bytes are cached, for this process's toolchain."""
        return traits_of(self.kind).ref(self.spec, self.target)

    @property
    def data_key(self) -> str | None:
        """The store key of the unit's input bytes (a blob's weights, by their sha256), None without input."""
        return self.spec.data_sha256 if isinstance(self.spec, BlobSpec) else None

    @property
    def label(self) -> str:
        return traits_of(self.kind).label

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "spec": self.spec.to_json(), "target": self.target.to_json()}

    @classmethod
    def from_json(cls, data: Any) -> CompileUnit:
        """A unit from its JSON form, or BadInputError: units cross the farm in messages and link plans."""
        if not isinstance(data, dict) or data.get("kind") not in unit_kinds():
            raise BadInputError(f"not a compile unit: {str(data)[:200]!r}")
        kind = UnitKind(data["kind"])
        try:
            spec = traits_of(kind).spec_type.from_json(data["spec"])
        except (KeyError, TypeError, ValueError) as error:
            raise BadInputError(f"compile unit with a malformed spec: {error!r}") from None
        return cls(kind, spec, target_from_json(data.get("target")))


def compile_unit(unit: CompileUnit, data: Data = None) -> bytes:
    """The bytes of one unit: the pure step both the local executor and the farm's workers call."""
    return traits_of(unit.kind).build(unit.spec, unit.target, data)


def verify_cached(unit: CompileUnit, data: bytes) -> bytes:
    """`data` if it can be what the unit's step makes, else BuildError (see UnitKindTraits.verify)."""
    traits_of(unit.kind).verify(data, f"cached {unit.label} {unit.name}")
    return data


def cached_unit(store: Store, unit: CompileUnit) -> bytes | None:
    """The unit's bytes from the compile cache, or None on a miss: no ref, its entry gone (evicted) or corrupt (the
    store's get deleted it), or bytes its step can't make (verify_cached). Refs are pointers, so the bytes are
    checked, and the caller rebuilds a miss and caches it over the bad entry (`cache_unit`)."""
    return cached_at(store, store.get_ref(unit.cache_ref), lambda data: verify_cached(unit, data))


def cached_at(store: Store, key: str | None, verify: Callable[[bytes], object]) -> bytes | None:
    """The compile cache's bytes under `key` (what a ref pointed at), or None: no key, the entry gone or corrupt,
    or bytes that `verify` refuses (BuildError)."""
    if key is None:
        return None
    try:
        data = store.get(key)
        verify(data)
        return data
    except (CorruptEntryError, MissingEntryError, BuildError):
        return None


def cache_unit(store: Store, unit: CompileUnit, data: bytes, key: str | None = None) -> str:
    """Keep a unit's built bytes in the compile cache under its ref (cache_at) and return their key. Concurrent
    writers of one unit write the same bytes (its step is pure), and each write is atomic, so either copy serves."""
    return cache_at(store, unit.cache_ref, data, key)


def cache_at(store: Store, ref: str, data: bytes, key: str | None = None) -> str:
    """Put `data` into the compile cache under `ref` and return its key: the entry first, then the ref, so no
    reader follows the ref to bytes not yet there. `key`: their sha256, when the caller computed it (Store.put)."""
    key = store.put(data, key)
    store.set_ref(ref, key)
    return key
