"""OpenCL targets: one device class, named by its fingerprint (platform, device, driver, OpenCL C version, build
options; farm.backends.opencl.devices). A program binary is valid only for that exact fingerprint."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from farm.errors import BadInputError

FINGERPRINT = re.compile(r"[0-9a-f]{16}")
SPEC_TARGET_ID = "opencl"
"""The target id OpenCL kernel specs carry: one source (and one symbol) serves every device."""


def check_fingerprint(fingerprint: object) -> str:
    """`fingerprint` itself, or BadInputError: it becomes a queue name and an artifact member path."""
    if not isinstance(fingerprint, str) or not FINGERPRINT.fullmatch(fingerprint):
        raise BadInputError(f"not an OpenCL device fingerprint (16 lowercase hex digits): {fingerprint!r}")
    return fingerprint


@dataclass(frozen=True)
class OpenClTarget:
    """Where OpenCL code runs: every device with this fingerprint."""

    fingerprint: str
    kind: ClassVar[Literal["opencl"]] = "opencl"

    def __post_init__(self) -> None:
        check_fingerprint(self.fingerprint)

    @property
    def id(self) -> str:
        return f"opencl:{self.fingerprint}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OpenClTarget:
        return cls(data["fingerprint"])
