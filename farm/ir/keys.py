"""What content keys and target ids are written with: canonical JSON and the forms of target ids.

They sit apart from the specs (farm.ir.specs), whose tensors bring numpy, because the targets need them too, and a
submitting client (pip install farm, without numpy or llvmlite) names targets and fingerprints devices.
"""

from __future__ import annotations

import json
from typing import Any

CPU_TARGET_PREFIX = "cpu-"
"""How every CPU target's id starts (backends.llvm.target.CpuTarget.id)."""


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form every content key is hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
