"""The backend registry: every backend farm can build for, found by the kind a target names (`cpu:...`,
`opencl:...`), and the targets `--target` and JSON name.

Each backend is one folder, farm/backends/<kind>/, whose `backend.py` implements farm.backends.base.Backend; this
module lists them. A third backend is its folder, one entry in BACKENDS and its target type in `Target`, and a
name for each kind of compile unit it builds in farm.ir.unit_kinds.UnitKind (the closed set a task message may
carry) and in the farm's task names (farm.distributed.task_messages.COMPILE_TASKS).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Union

from farm.backends.base import Backend, Devices
from farm.backends.llvm.backend import CpuBackend
from farm.backends.llvm.target import CpuTarget
from farm.backends.opencl.backend import OpenClBackend
from farm.backends.opencl.target import OpenClTarget
from farm.defaults import MAX_TARGETS
from farm.errors import BadInputError

__all__ = ["BACKENDS", "Backend", "Devices", "Target", "backend_named", "backend_of", "parse_targets"]

Target = Union[CpuTarget, OpenClTarget]

BACKENDS: dict[str, Backend] = {backend.kind: backend for backend in (CpuBackend(), OpenClBackend())}
"""Every backend, by kind, in the order a build assembles their parts."""


def backend_of(target: Target) -> Backend:
    return BACKENDS[target.kind]


def backend_named(kind: str, what: str = "backend", error: type[BadInputError] = BadInputError) -> Backend:
    """The backend of `kind`, or `error` naming the kinds there are."""
    if kind not in BACKENDS:
        raise error(f"unknown {what} {kind!r}: expected {' or '.join(repr(k) for k in BACKENDS)}")
    return BACKENDS[kind]


def check_target_count(targets: Sequence[Target]) -> list[Target]:
    """`targets`, or BadInputError when they are more than MAX_TARGETS (the artifact would be refused)."""
    if len(targets) > MAX_TARGETS:
        raise BadInputError(f"more than {MAX_TARGETS} targets named: an artifact holds at most {MAX_TARGETS}")
    return list(targets)


def parse_targets(texts: Sequence[str], devices: Devices) -> list[Target]:
    """The targets `--target` options name, each once, in order; none means this host's CPU."""
    from farm.backends.llvm.target import host_target

    targets: list[Target] = []
    for text in texts:
        kind, _, rest = text.partition(":")
        if kind not in BACKENDS:
            usages = "; ".join(backend.usage for backend in BACKENDS.values())
            raise BadInputError(f"unknown target {text!r}: expected {usages}")
        targets += [t for t in BACKENDS[kind].resolve(rest, devices) if t not in targets]
    return check_target_count(targets) or [host_target()]


def target_from_json(data: Any) -> Target:
    """A target from its JSON form, or BadInputError: job records and messages carry them across the farm."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        raise BadInputError(f"not a target: {data!r}")
    try:
        target = backend_named(data["kind"], "target kind").target_from_json(data)
    except (KeyError, TypeError) as error:
        raise BadInputError(f"{data['kind']} target lacks {error}: {str(data)[:200]}") from None
    if data.get("id", target.id) != target.id:
        raise BadInputError(f"target {data.get('id')!r} does not match its fields (id {target.id!r})")
    return target
