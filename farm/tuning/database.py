"""The tuning database, kept in the store: which variant won for a kernel on a CPU class.

The ref `tune:<cpu id>:<kernel key>` points at a JSON record of the timings (the result of
farm/tuning/harness.py `time_variants`, plus farm's version), where the cpu id is the CpuTarget id (triple, cpu
name and features: the CPU class) and the kernel key is the spec's key without target or variant. Every build
looks its tunable kernels up there; a kernel with no record uses the documented default, kernel.untuned_blocking.
Records are pinned (PIN_OWNER), so the store's eviction never takes one; a record replaced by a retune is
unpinned and ages out like any cache entry.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from farm import __version__
from farm.backends.llvm.gemm_blocking import GemmBlocking
from farm.backends.llvm.target import CpuTarget
from farm.ir.specs import KernelSpec
from farm.store import CorruptEntryError, MissingEntryError, Store, content_key, refs

PIN_OWNER = "tuning-database"
"""The store pins every current record under this owner, without expiry: a record is data, not cache (timing it
again takes minutes, and without it a build silently falls back to the default variant), and records are small."""


def tuning_key(spec: KernelSpec) -> str:
    """The kernel's key without target or variant: with the CPU class, what the database is keyed by."""
    return dataclasses.replace(spec, target_id="", variant_json="").key


def db_ref(spec: KernelSpec, target_id: str) -> str:
    """The store ref of a kernel's tuning record for one CPU class."""
    return refs.tuning_record(target_id, tuning_key(spec))


def record(store: Store, spec: KernelSpec, target: CpuTarget, result: dict[str, Any], replace: bool = True) -> str:
    """Keep a `time_variants` result as the kernel's record for the target's CPU class; returns the store key of
    the record the kernel has now. Without `replace` a record already there stays: on a shared farm, records are
    every job's, and only a retune the operator granted may change one (a submitter's --tune only adds)."""
    entry = {
        **result,
        "farm_version": __version__,
        "kernel": tuning_key(spec),
        "op": spec.op,
        "target": target.to_json(),
    }
    data = json.dumps(entry, sort_keys=True).encode()
    ref, key = db_ref(spec, target.id), content_key(data)
    before = store.get_ref(ref)
    if before is not None and not replace:
        return before
    store.pin(PIN_OWNER, [key], ttl=None)
    store.put(data)
    store.set_ref(ref, key)
    if before not in (None, key):
        store.unpin(PIN_OWNER, [before])
    return key


def lookup(store: Store, spec: KernelSpec, target_id: str) -> GemmBlocking | None:
    """The variant recorded for the kernel on this CPU class; None when there is no usable record (none, gone,
    corrupt or unreadable: the build then uses the default, and tuning again rewrites it)."""
    key = store.get_ref(db_ref(spec, target_id))
    if key is None:
        return None
    try:
        return GemmBlocking.from_json(json.loads(store.get(key))["variant"])
    except (CorruptEntryError, MissingEntryError, ValueError, KeyError, TypeError):
        return None
