"""farm as an ONNX backend (onnx.backend.base.Backend), so ONNX's own test runner and conformance cases drive it.

`prepare` builds the model the way `farm submit` does without a broker (the local build, in this process) and
loads the artifact with farm's runtime; `FarmRep.run` runs it. Devices: each backend's kind in capitals, "CPU"
(this host's CPU) and "OPENCL" (this host's first OpenCL device, from the binaries built for it). A model farm can't build raises the spine's
UnsupportedError (node, op, opset and what is missing), never a wrong answer.

    from farm.tools.onnx_backend import FarmBackend
    outputs = FarmBackend.run_model(model, [x])          # or FarmBackend.prepare(model).run({"x": x})
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from farm import runtime
from farm.backends.registry import BACKENDS, Devices, Target
from farm.build.executor import LocalExecutor
from farm.build.local import build_model
from farm.errors import RunInputError

if TYPE_CHECKING:
    from farm.runtime.emulation import EmulatedModel

DEVICES = tuple(kind.upper() for kind in BACKENDS)


class FarmRep(BackendRep):
    """A prepared model: run(inputs) with inputs in graph-input order (a sequence) or by name (a mapping)."""

    def __init__(self, model: runtime.Model | runtime.SizedModel | EmulatedModel) -> None:
        self.model = model
        self.input_names = [spec.name for spec in model.inputs]
        self.output_names = [spec.name for spec in model.outputs]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        outputs = self.model.run(self._feeds(inputs))
        return tuple(outputs[name] for name in self.output_names)

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            return {name: np.asarray(value) for name, value in inputs.items()}
        values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        if len(values) != len(self.input_names):
            raise RunInputError(
                f"the model takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), got {len(values)}"
            )
        return {name: np.asarray(value) for name, value in zip(self.input_names, values)}


class FarmBackend(Backend):
    """Builds with farm's local build and runs with farm's runtime."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> FarmRep:
        kind = _device_kind(device)
        with tempfile.TemporaryDirectory(prefix="farm-onnx-backend-") as folder:
            path = Path(folder) / "model.onnx"
            onnx.save(model, path)
            targets = _first_device(kind)
            result = build_model(path, folder, targets, executor=LocalExecutor(1))
            return FarmRep(runtime.load(result.artifact, device=kind.lower()))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """A backend's kind when this host has a device of it (CPU always; OPENCL when there is an OpenCL device)."""
        kind = device.split(":")[0].upper()
        return kind in DEVICES and bool(BACKENDS[kind.lower()].host_devices())


def _device_kind(device: str) -> str:
    kind = device.split(":")[0].upper()
    if kind not in DEVICES:
        raise ValueError(f"farm's ONNX backend runs on {' or '.join(DEVICES)}, not {device!r}")
    return kind


def _first_device(kind: str) -> list[Target]:
    """The target of the device the runtime will use: this host's first device of the kind."""
    first = BACKENDS[kind.lower()].host_devices()[:1]
    return BACKENDS[kind.lower()].resolve("", Devices("on this host", lambda _: first))


prepare = FarmBackend.prepare
run_model = FarmBackend.run_model
supports_device = FarmBackend.supports_device
