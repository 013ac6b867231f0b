"""The kinds of compile unit, named once: a build's units (farm.build.units), the farm's compile tasks
(farm.distributed.task_messages) and its bookkeeping all read a unit's kind, and clients import the task messages,
so the names live here, beside nothing heavy."""

from __future__ import annotations

from enum import Enum


class UnitKind(str, Enum):
    """A compile unit's kind; its value is how JSON (units in messages and link plans) and cache refs spell it."""

    KERNEL = "kernel"
    """A kernel's object for one CPU target."""
    BLOB = "blob"
    """A weight packed in panels for one CPU target's kernels."""
    CL_KERNEL = "clkernel"
    """A kernel's program binary for one OpenCL device class."""
