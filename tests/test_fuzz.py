"""Seeded fuzzing of the model front half (import, passes, validate, plan): a few hundred mutated example models,
each of which must plan or be refused with a one-line BadInputError, within time and memory limits (issue 13).

The loop runs in a child process under an address-space limit, so that a runaway allocation is a failed case
(MemoryError) instead of the test machine's OOM killer; the child prints its findings as JSON.
"""

from __future__ import annotations

import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import onnx
from onnx import helper

SEED = 13
CASES = 300
MEMORY_LIMIT_BYTES = 4 << 30
CASE_SECONDS = 10.0
CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _structure_bytes(model: onnx.ModelProto, data: bytes) -> list[int]:
    """Offsets of `data` outside the initializers' raw bytes, where a flip hits names, shapes, attributes and
    field tags (flips in weights only change numbers)."""
    weights = bytearray(len(data))
    for tensor in model.graph.initializer:
        start = data.find(tensor.raw_data) if tensor.raw_data else -1
        if start >= 0:
            weights[start:start + len(tensor.raw_data)] = b"\x01" * len(tensor.raw_data)
    return [offset for offset, in_weight in enumerate(weights) if not in_weight]


def _byte_flips(model: onnx.ModelProto, rng: random.Random) -> bytes:
    data = model.SerializeToString()
    offsets = _structure_bytes(model, data)
    mutated = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        mutated[rng.choice(offsets)] ^= 1 << rng.randrange(8)
    return bytes(mutated)


def _truncation(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


# Values an attribute is replaced with: wrong types, zero, negative and huge numbers.
_HOSTILE_ATTRIBUTES = [0, -1, 2**40, -(2**40), 1.5, "x", [0], [-1, -1], [2**31, 1], [1.0, 2.0], b"\xff"]


def _attribute_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    nodes = [node for node in model.graph.node if node.attribute]
    node = rng.choice(nodes)
    attribute = rng.choice(list(node.attribute))
    replacement = helper.make_attribute(attribute.name, rng.choice(_HOSTILE_ATTRIBUTES))
    attribute.CopyFrom(replacement)
    return model.SerializeToString()


_HOSTILE_DIMS = [0, -1, 1, 2, 7, 2**20, 2**31, 2**32, 2**40]


def _shape_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    infos = [vi for vi in (*model.graph.input, *model.graph.output) if vi.type.tensor_type.shape.dim]
    dims = rng.choice(infos).type.tensor_type.shape.dim
    dims[rng.randrange(len(dims))].dim_value = rng.choice(_HOSTILE_DIMS)
    return model.SerializeToString()


def _structure_mutation(model: onnx.ModelProto, rng: random.Random) -> bytes:
    """Rewire an input, drop a node, or rename an output to one nothing defines."""
    choice = rng.randrange(3)
    node = rng.choice(list(model.graph.node))
    if choice == 0 and node.input:
        names = [vi.name for vi in model.graph.input] + [out for n in model.graph.node for out in n.output] + [""]
        node.input[rng.randrange(len(node.input))] = rng.choice(names)
    elif choice == 1:
        model.graph.node.remove(node)
    else:
        model.graph.output[0].name = "undefined"
    return model.SerializeToString()


def _mutants(rng: random.Random, count: int):
    from farm.tools import examples

    bases = [examples.tiny_cnn(), examples.mlp(), examples.small_cnn(image=16)]
    for index in range(count):
        base = rng.choice(bases)
        kind = ("byte-flip", "truncation", "attribute", "shape", "structure")[index % 5]
        model = onnx.ModelProto()
        model.CopyFrom(base)
        if kind == "byte-flip":
            yield kind, _byte_flips(model, rng)
        elif kind == "truncation":
            yield kind, _truncation(model.SerializeToString(), rng)
        elif kind == "attribute":
            yield kind, _attribute_mutation(model, rng)
        elif kind == "shape":
            yield kind, _shape_mutation(model, rng)
        else:
            yield kind, _structure_mutation(model, rng)


def _run_case(path: str) -> str | None:
    """None when the model plans or is refused with a one-line BadInputError; else what went wrong."""
    from farm.build.assembly import plan_model
    from farm.errors import BadInputError

    try:
        plan_model(path)
    except BadInputError as error:
        return None if "\n" not in str(error) else f"multi-line refusal: {error!r}"
    except Exception as error:  # noqa: BLE001 - the point is to catch anything that isn't a clean refusal
        return f"{type(error).__name__}: {str(error)[:300]}"
    return None


def fuzz(seed: int = SEED, count: int = CASES) -> dict:
    """Run `count` mutants; the report lists failures and slow cases by kind and index."""
    rng = random.Random(seed)
    failures, slow, kinds = [], [], {}
    with tempfile.TemporaryDirectory() as folder:
        for index, (kind, data) in enumerate(_mutants(rng, count)):
            path = os.path.join(folder, f"case{index}.onnx")
            with open(path, "wb") as f:
                f.write(data)
            started = time.monotonic()
            problem = _run_case(path)
            elapsed = time.monotonic() - started
            kinds[kind] = kinds.get(kind, 0) + 1
            if problem:
                failures.append({"index": index, "kind": kind, "problem": problem})
            if elapsed > CASE_SECONDS:
                slow.append({"index": index, "kind": kind, "seconds": round(elapsed, 1)})
    return {"failures": failures, "slow": slow, "kinds": kinds}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def test_mutated_models_plan_or_are_refused_cleanly():
    code = "import json; from tests.test_fuzz import fuzz; print(json.dumps(fuzz()))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (CHECKOUT, os.environ.get("PYTHONPATH")) if p)}
    result = subprocess.run([sys.executable, "-c", code], cwd=CHECKOUT, env=env, capture_output=True, text=True,
                            timeout=300, preexec_fn=_limit_memory)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(report["kinds"].values()) == CASES
    assert report["failures"] == [] and report["slow"] == [], json.dumps(report, indent=1)
