"""The units of work a build is split into: one KernelSpec per distinct kernel and target, one BlobSpec per weight.

Both are frozen, JSON-serialisable and content-keyed (sha256 over everything that changes the compiled bytes), so
identical layers share one compiled kernel and a key can name a cache entry on any worker.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from farm import __version__
from farm.ir.graph import Activation, TensorInfo
from farm.ir.keys import CPU_TARGET_PREFIX, canonical_json

CODEGEN_VERSION = f"farm-{__version__}-codegen-122"


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: op, attributes (after defaults and constant inputs are folded in), data shapes, activation, and
    the code generator's variant.

    `variant_json` is a tuned GEMM blocking (farm/tuning/space.py) as canonical JSON; "" means the documented default
    (codegen.cpu.default_blocking). It enters the JSON form and the key only when set, so an untuned kernel keeps
    the key, symbol and cache entries it had before tuning existed.

    `part` (index, parts): one of the objects a CPU kernel's code is split into, so that its heaviest functions
    compile on several workers at once (farm.backends.llvm.kernel.kernel_parts); None: the whole kernel. It enters
    the JSON form and the key (each part is its own unit and cache entry), never the symbol: every part serves the
    same kernel.
    """

    op: str
    attrs_json: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    activation: Activation | None
    target_id: str
    variant_json: str = ""
    part: tuple[int, int] | None = None

    @property
    def attrs(self) -> dict[str, Any]:
        return json.loads(self.attrs_json)

    @property
    def variant(self) -> dict[str, Any] | None:
        """The variant as a dict, None for the default."""
        return json.loads(self.variant_json) if self.variant_json else None

    def to_json(self) -> dict[str, Any]:
        data = {
            "op": self.op,
            "attrs": self.attrs,
            "inputs": [[list(t.shape), t.dtype] for t in self.inputs],
            "outputs": [[list(t.shape), t.dtype] for t in self.outputs],
            "activation": [self.activation.kind, list(self.activation.params)] if self.activation else None,
            "target": self.target_id,
        }
        if self.variant_json:
            data["variant"] = self.variant
        return data if self.part is None else {**data, "part": list(self.part)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KernelSpec:
        act = data["activation"]
        return cls(
            op=data["op"],
            attrs_json=canonical_json(data["attrs"]),
            inputs=tuple(TensorInfo(tuple(s), d) for s, d in data["inputs"]),
            outputs=tuple(TensorInfo(tuple(s), d) for s, d in data["outputs"]),
            activation=Activation(act[0], tuple(act[1])) if act else None,
            target_id=data["target"],
            variant_json=canonical_json(data["variant"]) if data.get("variant") else "",
            part=_part(data.get("part")),
        )

    @functools.cached_property
    def key(self) -> str:
        """The sha256 of the spec's JSON, computed once per spec: a plan asks for it several times per step (a
        20,000-node chain asked 300,000 times, 4 s of its build)."""
        return hashlib.sha256(canonical_json([CODEGEN_VERSION, self.to_json()]).encode()).hexdigest()

    @property
    def symbol(self) -> str:
        """The kernel's function (the whole kernel's: a part's symbol is its kernel's)."""
        return f"farm_k_{(self if self.part is None else self.whole).key[:20]}"

    @property
    def whole(self) -> KernelSpec:
        """The kernel this spec is a part of (itself when it is whole)."""
        return dataclasses.replace(self, part=None)

    @property
    def unit_symbol(self) -> str:
        """What names the spec's unit: the symbol, with `.part<i>` for a part past the first (the first part's
        object holds the kernel's function, and takes the whole kernel's name in link orders and manifests)."""
        return self.symbol if not self.part or not self.part[0] else f"{self.symbol}.part{self.part[0]}"

    @property
    def for_cpu(self) -> bool:
        """Whether the spec is specialised for a CPU target: lowerings that only the LLVM renderer reads (an
        implicit GEMM, im2col in bands) apply then, never to an OpenCL spec or an unspecialised one."""
        return self.target_id.startswith(CPU_TARGET_PREFIX)


def _part(value: Any) -> tuple[int, int] | None:
    """A spec's part from its JSON form: [index, parts] with 0 <= index < parts, or absent; ValueError otherwise (a
    spec comes from a message or a link plan)."""
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int for v in value)
        or not 0 <= value[0] < value[1]
    ):
        raise ValueError(f"a kernel part is [index, parts] with 0 <= index < parts, got {value!r}")
    return value[0], value[1]


@dataclass(frozen=True)
class BlobSpec:
    """One constant tensor as a CPU target's kernels read it; keyed by the sha256 of its bytes and the target.

    `panels`, when set: the float32 tensor pre-packed for a Gemm that reads it so: (rows, m, k) for its A in panels
    of `rows` (farm.backends.llvm.packing.pack_panels, per m x k block), (width, k, n, transposed) for its B in column panels of
    `width` (packing.pack_columns, per k x n block, stored n x k when transposed). Packing is a pure step (a
    "blob" unit), so the source bytes (by data_sha256) travel and the packed ones are made where the unit runs.
    Without panels the weight is the model's bytes, used as they are.
    """

    data_sha256: str
    nbytes: int
    target_id: str
    panels: tuple[int, ...] | None = None

    @property
    def symbol(self) -> str:
        suffix = "" if self.panels is None else "_p" + hashlib.sha256(str(self.panels).encode()).hexdigest()[:8]
        return f"farm_w_{self.data_sha256[:20]}{suffix}"

    @property
    def key(self) -> str:
        packing = "" if self.panels is None else f"|panels{list(self.panels)}"
        return hashlib.sha256(
            f"{CODEGEN_VERSION}|blob|{self.data_sha256}|{self.target_id}{packing}".encode()
        ).hexdigest()

    def to_json(self) -> dict[str, Any]:
        data = {"sha256": self.data_sha256, "bytes": self.nbytes, "target": self.target_id}
        return data if self.panels is None else {**data, "panels": list(self.panels)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BlobSpec:
        panels = data.get("panels")
        return cls(
            data["sha256"],
            int(data["bytes"]),
            data["target"],
            None if panels is None else tuple(int(v) for v in panels),
        )
