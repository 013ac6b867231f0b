"""`farm bench ARTIFACT [--compare OTHER]`: where an artifact's time goes, kernel by kernel, and what changed.

Regressions hide in single kernels: a whole-model latency that moves 3% can hide one convolution that got 40%
slower. `bench_artifact` runs the artifact's CPU part on this host, times the whole model and then every
schedule step on its own (`farm_run_steps`, on the real activations), and sums the steps per kernel with its
GFLOP/s where the op's work is known. `compare` matches two reports node by node (a node keeps its name across
builds of the same model, whatever farm version compiled it) and flags every node more than 5% slower.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from farm import runtime
from farm.runtime.model import TensorSpec

SLOWER_BY = 0.05  # a node this much slower is flagged
NOISE_SECONDS = 2e-6  # ... unless it lost less time than this (timer and call overhead)


def _prod(values: Sequence[int]) -> int:
    return int(np.prod(values, dtype=np.int64)) if len(values) else 1


def _conv_flops(spec: Mapping[str, Any]) -> int:
    """2 x every output element x the weights that feed it (Cin/group x kernel)."""
    (out_shape, _), (weight_shape, _) = spec["outputs"][0], spec["inputs"][1]
    return 2 * _prod(out_shape) * _prod(weight_shape[1:])


def _conv_transpose_flops(spec: Mapping[str, Any]) -> int:
    """2 x every input element x the outputs it feeds (Cout/group x kernel)."""
    (in_shape, _), (weight_shape, _) = spec["inputs"][0], spec["inputs"][1]
    return 2 * _prod(in_shape) * _prod(weight_shape[1:])


def _matmul_flops(spec: Mapping[str, Any]) -> int:
    """2 x every output element x the shared dimension (A's last; its first when Gemm transposes A)."""
    (out_shape, _), (a_shape, _) = spec["outputs"][0], spec["inputs"][0]
    depth = a_shape[0] if spec["attrs"].get("transA") else a_shape[-1]
    return 2 * _prod(out_shape) * int(depth)


# Floating-point operations per call, for the ops whose work is multiply-adds; others show no GFLOP/s.
FLOPS: dict[str, Callable[[Mapping[str, Any]], int]] = {
    "Conv": _conv_flops,
    "ConvTranspose": _conv_transpose_flops,
    "Gemm": _matmul_flops,
    "MatMul": _matmul_flops,
}


@dataclass(frozen=True)
class StepTime:
    """One schedule step: its node, the kernel it calls (a label that names op and shapes), seconds and flops."""

    node: str
    op: str
    kernel: str
    seconds: float
    flops: int | None


@dataclass
class BenchReport:
    """An artifact's whole-model latency (median seconds) and its steps' times."""

    artifact: str
    target: str
    latency: float
    steps: list[StepTime] = field(default_factory=list)

    def kernels(self) -> list[dict[str, Any]]:
        """Per kernel: calls, seconds per inference, share of the steps' time and GFLOP/s; slowest first."""
        rows: dict[str, dict[str, Any]] = {}
        for step in self.steps:
            row = rows.setdefault(step.kernel, {"kernel": step.kernel, "op": step.op, "calls": 0, "seconds": 0.0,
                                                "flops": 0 if step.flops is not None else None})
            row["calls"] += 1
            row["seconds"] += step.seconds
            if row["flops"] is not None:
                row["flops"] += step.flops
        total = sum(step.seconds for step in self.steps) or 1.0
        for row in rows.values():
            row["share"] = row["seconds"] / total
            row["gflops"] = row["flops"] / row["seconds"] / 1e9 if row["flops"] and row["seconds"] > 0 else None
        return sorted(rows.values(), key=lambda row: -row["seconds"])

    def to_json(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "target": self.target, "latency": self.latency,
                "steps": [asdict(step) for step in self.steps], "kernels": self.kernels()}


@dataclass(frozen=True)
class Change:
    """A node's time in the baseline and in the candidate; `flagged` when it got more than 5% slower."""

    node: str
    kernel: str
    before: float | None
    after: float | None

    @property
    def ratio(self) -> float | None:
        return self.after / self.before if self.before and self.after is not None else None

    @property
    def flagged(self) -> bool:
        return (self.before is not None and self.after is not None and self.after > self.before * (1 + SLOWER_BY)
                and self.after - self.before > NOISE_SECONDS)


def sample_feeds(inputs: Sequence[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal floats, and zeros for integer and bool inputs (always valid indices and masks)."""
    rng = np.random.default_rng(seed)
    return {spec.name: (rng.standard_normal(spec.shape).astype(spec.dtype) if np.dtype(spec.dtype).kind == "f"
                        else np.zeros(spec.shape, spec.dtype)) for spec in inputs}


def kernel_label(spec: Mapping[str, Any]) -> str:
    """Op and shapes, e.g. "Conv 1x64x56x56,64x64x3x3 -> 1x64x56x56 +relu": the same in any build of the model."""
    shapes = lambda tensors: ",".join("x".join(str(d) for d in shape) or "scalar" for shape, _ in tensors)  # noqa: E731
    activation = f" +{spec['activation'][0]}" if spec.get("activation") else ""
    return f"{spec['op']} {shapes(spec['inputs'])} -> {shapes(spec['outputs'])}{activation}"


def bench_artifact(path: str, repeat: int = 20, warmup: int = 2, threads: int = 0) -> BenchReport:
    """Time the artifact's CPU part on this host: whole-model latency with `threads` (0: every CPU), then each
    step on its own on one thread (a step's own time, comparable across machines' core counts)."""
    model = runtime.load(path, threads=threads)
    feeds = sample_feeds(model.inputs)
    for _ in range(warmup):
        model.run(feeds)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        model.run(feeds)
        samples.append(time.perf_counter() - started)
    specs = {entry["kernel"]: entry["spec"] for entry in _manifest_kernels(path)}
    steps = []
    for step, seconds in zip(model.schedule, model.time_steps(feeds, repeat)):
        spec = specs[step["kernel"]]
        flops = FLOPS[spec["op"]](spec) if spec["op"] in FLOPS else None
        steps.append(StepTime(step["node"], spec["op"], kernel_label(spec), seconds, flops))
    return BenchReport(path, str(model.target.get("id")), statistics.median(samples), steps)


def _manifest_kernels(path: str) -> list[dict[str, Any]]:
    from farm.artifact import read_manifest

    return read_manifest(path)["kernels"]


def compare(before: BenchReport, after: BenchReport) -> list[Change]:
    """Every node of either report, matched by name, in the candidate's schedule order then the baseline's rest."""
    old = {step.node: step for step in before.steps}
    new = {step.node: step for step in after.steps}
    changes = [Change(node, step.kernel, old[node].seconds if node in old else None, step.seconds)
               for node, step in new.items()]
    changes += [Change(node, step.kernel, step.seconds, None) for node, step in old.items() if node not in new]
    return changes


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def format_report(report: BenchReport) -> str:
    lines = [f"{report.artifact} ({report.target}): latency {_ms(report.latency)} ms, "
             f"steps {_ms(sum(step.seconds for step in report.steps))} ms", "",
             f"{'ms':>9} {'share':>6} {'GFLOP/s':>8} {'calls':>5}  kernel"]
    for row in report.kernels():
        gflops = "-" if row["gflops"] is None else f"{row['gflops']:.1f}"
        lines.append(f"{row['seconds'] * 1e3:9.3f} {row['share']:6.1%} {gflops:>8} {row['calls']:5d}  {row['kernel']}")
    return "\n".join(lines)


def format_comparison(before: BenchReport, after: BenchReport, changes: Sequence[Change]) -> str:
    flagged = [change for change in changes if change.flagged]
    lines = [f"latency {_ms(before.latency)} -> {_ms(after.latency)} ms ({after.latency / before.latency:.2f}x); "
             f"{len(flagged)} node(s) more than {SLOWER_BY:.0%} slower", "",
             f"{'before ms':>10} {'after ms':>9} {'ratio':>6}  node  kernel"]
    for change in changes:
        ratio = "-" if change.ratio is None else f"{change.ratio:.2f}"
        mark = "  SLOWER" if change.flagged else ""
        lines.append(f"{_ms(change.before):>10} {_ms(change.after):>9} {ratio:>6}  {change.node}  {change.kernel}{mark}")
    return "\n".join(lines)


def comparison_json(before: BenchReport, after: BenchReport, changes: Sequence[Change]) -> str:
    return json.dumps({"before": before.to_json(), "after": after.to_json(),
                       "changes": [{**asdict(change), "ratio": change.ratio, "flagged": change.flagged}
                                   for change in changes]})
