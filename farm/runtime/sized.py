"""A model built for several sizes (`farm submit --shape batch=1,8,32`): one loaded model per size, each run given
to the size whose inputs have the feeds' shapes.

Each size is a whole plan (schedule, memory plan, library per CPU target) over the same weight members, so a size
that fits runs exactly as an artifact of that size alone would. Nothing is padded or cut: a feed that fits no size
is refused with one line naming the sizes the artifact has. The first size stands for the model where one must be
chosen without feeds (`inputs`, `outputs`, `schedule`: what `farm bench` times).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from farm.errors import RunInputError
from farm.ir.shapes import PinnedShapes, describe_size


class SizedModel:
    """Loaded sizes, each (its pins, a model with the runtime Model's interface), in the artifact's order."""

    def __init__(self, path: str, sizes: Sequence[tuple[PinnedShapes, Any]]) -> None:
        self.path = path
        self.sizes = list(sizes)
        first = self.sizes[0][1]
        self.inputs, self.outputs, self.schedule, self.target = (
            first.inputs,
            first.outputs,
            first.schedule,
            first.target,
        )

    def size_for(self, feeds: Mapping[str, np.ndarray]) -> Any:
        """The loaded size whose inputs have the shapes of `feeds`; RunInputError naming every size when none has
        (feeds that are not arrays of the model's inputs are left to that size's own checks, which name them)."""
        if not isinstance(feeds, Mapping):
            return self.sizes[0][1]
        shapes = {name: np.shape(array) for name, array in feeds.items() if isinstance(array, np.ndarray)}
        for _, model in self.sizes:
            if all(shapes.get(spec.name, spec.shape) == spec.shape for spec in model.inputs):
                return model
        given = ", ".join(f"{name} {'x'.join(map(str, shape)) or 'scalar'}" for name, shape in shapes.items())
        raise RunInputError(f"inputs {given or '(none)'} fit none of the artifact's sizes: {_listed(self.sizes)}")

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the size that fits `feeds` once (Model.run)."""
        return self.size_for(feeds).run(feeds)

    def sample_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[list[float]]:
        """Seconds of each step of the size that fits `feeds` (Model.sample_steps)."""
        return self.size_for(feeds).sample_steps(feeds, repeat)

    def time_steps(self, feeds: Mapping[str, np.ndarray], repeat: int = 10) -> list[float]:
        """Best seconds of each step of the size that fits `feeds` (Model.time_steps)."""
        return self.size_for(feeds).time_steps(feeds, repeat)


def _listed(sizes: Sequence[tuple[PinnedShapes, Any]]) -> str:
    return "; ".join(f"{describe_size(pins)} ({_input_shapes(model)})" for pins, model in sizes)


def _input_shapes(model: Any) -> str:
    return ", ".join(f"{spec.name} {'x'.join(map(str, spec.shape)) or 'scalar'}" for spec in model.inputs)
