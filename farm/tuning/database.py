"""The tuning database, kept in the store: which variant won for a kernel on a CPU class.

The ref `tune:<cpu id>:<kernel key>` points at a JSON record of the timings (the result of
farm/tuning/harness.py `time_variants`, plus farm's version), where the cpu id is the CpuTarget id (triple, cpu
name and features: the CPU class) and the kernel key is the spec's key without target or variant. Every build
looks its tunable kernels up there; a kernel with no record uses the documented default, cpu.default_blocking.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from farm import __version__
from farm.backends.llvm.gemm import GemmBlocking
from farm.backends.llvm.target import CpuTarget
from farm.ir.specs import KernelSpec
from farm.store import CorruptEntryError, MissingEntryError, Store, refs


def tuning_key(spec: KernelSpec) -> str:
    """The kernel's key without target or variant: with the CPU class, what the database is keyed by."""
    return dataclasses.replace(spec, target_id="", variant_json="").key


def db_ref(spec: KernelSpec, target_id: str) -> str:
    """The store ref of a kernel's tuning record for one CPU class."""
    return refs.tuning_record(target_id, tuning_key(spec))


def record(store: Store, spec: KernelSpec, target: CpuTarget, result: dict[str, Any]) -> str:
    """Keep a `time_variants` result as the kernel's record for the target's CPU class; returns its store key."""
    entry = {**result, "farm_version": __version__, "kernel": tuning_key(spec), "op": spec.op,
             "target": target.to_json()}
    key = store.put(json.dumps(entry, sort_keys=True).encode())
    store.set_ref(db_ref(spec, target.id), key)
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
