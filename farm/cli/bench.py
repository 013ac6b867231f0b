"""`farm bench ARTIFACT [--compare OTHER]`: where an artifact's time goes, kernel by kernel, and what changed.

Regressions hide in single kernels: a whole-model latency that moves 3% can hide one convolution that got 40%
slower. `bench_artifact` runs the artifact's CPU part on this host, times the whole model and then every
schedule step on its own (`farm_run_steps`, on the real activations), and sums the steps per kernel with its
GFLOP/s where the op's work is known. `bench_pair` times a baseline and a candidate in alternating rounds, so that
drift (a CPU warming up, another job starting) falls on both alike, and `compare` matches the two node by node (a
node keeps its name across builds of the same model, whatever farm version compiled it). A node is flagged only
when it is more than 5% slower and the slowdown is beyond its noise: a one-sided Mann-Whitney U test of its
repeats, with the Bonferroni correction over the nodes compared, must put the chance of so many slower repeats
below FAMILY_ALPHA. A CI runner's noise then can't flag a node, while a kernel made slower is flagged every time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from farm import runtime
from farm.errors import BadInputError
from farm.runtime.model import TensorSpec

SLOWER_BY = 0.05  # a node this much slower is flagged
NOISE_SECONDS = 2e-6  # ... unless it lost less time than this (timer and call overhead)
FAMILY_ALPHA = 1e-3  # ... or its repeats don't show the slowdown beyond this chance over all the nodes compared


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
    """One schedule step: its node, the kernel it calls (a label that names op and shapes), its best seconds, flops,
    and the seconds of every repeat."""

    node: str
    op: str
    kernel: str
    seconds: float
    flops: int | None
    samples: tuple[float, ...] = ()


@dataclass
class BenchReport:
    """An artifact's whole-model latency (median seconds, and every repeat's) and its steps' times."""

    artifact: str
    target: str
    latency: float
    steps: list[StepTime] = field(default_factory=list)
    latencies: tuple[float, ...] = ()

    def kernels(self) -> list[dict[str, Any]]:
        """Per kernel: calls, seconds per inference, share of the steps' time and GFLOP/s; slowest first."""
        rows: dict[str, dict[str, Any]] = {}
        for step in self.steps:
            row = rows.setdefault(
                step.kernel,
                {
                    "kernel": step.kernel,
                    "op": step.op,
                    "calls": 0,
                    "seconds": 0.0,
                    "flops": 0 if step.flops is not None else None,
                },
            )
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
        return {
            "artifact": self.artifact,
            "target": self.target,
            "latency": self.latency,
            "repeat": len(self.latencies),
            "latency_spread": spread(self.latencies),
            "steps": [asdict(step) for step in self.steps],
            "kernels": self.kernels(),
        }


def spread(samples: Sequence[float]) -> dict[str, float] | None:
    """Least, median and greatest of some repeats' seconds (None without repeats)."""
    return {"min": min(samples), "median": statistics.median(samples), "max": max(samples)} if samples else None


@dataclass(frozen=True)
class Change:
    """A node's best time in the baseline and in the candidate, and `p_value`: the chance, over all the nodes
    compared (Bonferroni), that its repeats rank as much slower by noise alone (None: no repeats to test).
    `flagged` when it got more than 5% slower, by more than the timer's noise, and p_value < FAMILY_ALPHA."""

    node: str
    kernel: str
    before: float | None
    after: float | None
    p_value: float | None = None

    @property
    def ratio(self) -> float | None:
        return self.after / self.before if self.before and self.after is not None else None

    @property
    def flagged(self) -> bool:
        return (
            self.before is not None
            and self.after is not None
            and self.after > self.before * (1 + SLOWER_BY)
            and self.after - self.before > NOISE_SECONDS
            and (self.p_value is None or self.p_value < FAMILY_ALPHA)
        )


def slower_p_value(before: Sequence[float], after: Sequence[float]) -> float:
    """One-sided Mann-Whitney U test: the chance that `after`'s repeats rank at least this far above `before`'s
    if both came from one distribution (normal approximation, corrected for ties and continuity). It asks only
    whether one sample tends to be slower than the other, so a few interrupted repeats on either side don't
    decide it."""
    values = sorted([(value, 0) for value in before] + [(value, 1) for value in after])
    ranks, ties, index = [0.0] * len(values), 0.0, 0
    while index < len(values):
        end = index
        while end + 1 < len(values) and values[end + 1][0] == values[index][0]:
            end += 1
        ranks[index : end + 1] = [(index + end) / 2 + 1] * (end - index + 1)
        ties += (end - index + 1) ** 3 - (end - index + 1)
        index = end + 1
    n1, n2 = len(before), len(after)
    total = n1 + n2
    u = sum(rank for rank, (_, side) in zip(ranks, values) if side) - n2 * (n2 + 1) / 2
    variance = n1 * n2 / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    return 0.5 * math.erfc((u - n1 * n2 / 2 - 0.5) / math.sqrt(variance) / math.sqrt(2))


def sample_feeds(inputs: Sequence[TensorSpec], seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal floats (bfloat16 included), and zeros for integer and bool inputs (always valid indices and
    masks)."""
    rng = np.random.default_rng(seed)
    return {
        spec.name: (
            rng.standard_normal(spec.shape).astype(spec.dtype)
            if _is_float(spec.dtype)
            else np.zeros(spec.shape, spec.dtype)
        )
        for spec in inputs
    }


def _is_float(dtype: str) -> bool:
    """numpy's floats, and bfloat16 (ml_dtypes' type, whose numpy kind is "V")."""
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


def kernel_label(spec: Mapping[str, Any]) -> str:
    """Op and shapes, e.g. "Conv 1x64x56x56,64x64x3x3 -> 1x64x56x56 +relu": the same in any build of the model."""
    shapes = lambda tensors: ",".join("x".join(str(d) for d in shape) or "scalar" for shape, _ in tensors)  # noqa: E731
    activation = f" +{spec['activation'][0]}" if spec.get("activation") else ""
    return f"{spec['op']} {shapes(spec['inputs'])} -> {shapes(spec['outputs'])}{activation}"


def bench_artifact(
    path: str, repeat: int = 20, warmup: int = 2, threads: int = 0, device: str = "cpu", target: str | None = None
) -> BenchReport:
    """Time the artifact on this host's `device` (its CPU part, or with "opencl" its OpenCL part): whole-model
    latency with `threads` (0: every CPU), then each step on its own (on the CPU on one thread: a step's own time,
    comparable across machines' core counts). `target` names the CPU target to time (farm.runtime.load)."""
    return bench_pair([path], repeat, warmup, threads, device, target)[0]


def bench_pair(
    paths: Sequence[str],
    repeat: int = 20,
    warmup: int = 2,
    threads: int = 0,
    device: str = "cpu",
    target: str | None = None,
) -> list[BenchReport]:
    """Time several artifacts (a baseline and a candidate) in alternating rounds, the order of each round
    reversed from the last: every drift of the machine meets each artifact alike. A CPU target that would run
    under emulation is refused before anything is loaded (refuse_emulated)."""
    if device == "cpu":
        for path in paths:
            refuse_emulated(path, target)
    models = [runtime.load(path, threads=threads, device=device, target=target) for path in paths]
    feeds = [sample_feeds(model.inputs) for model in models]
    for model, feed in zip(models, feeds):
        for _ in range(warmup):
            model.run(feed)
    latencies: list[list[float]] = [[] for _ in models]
    samples: list[list[list[float]]] = [[[] for _ in model.schedule] for model in models]
    for round_ in range(repeat):
        for index in _round_order(len(models), round_):
            started = time.perf_counter()
            models[index].run(feeds[index])
            latencies[index].append(time.perf_counter() - started)
    for round_ in range(repeat):
        for index in _round_order(len(models), round_):
            for step, seconds in zip(samples[index], models[index].sample_steps(feeds[index], 1)):
                step.extend(seconds)
    return [_report(path, model, lat, steps) for path, model, lat, steps in zip(paths, models, latencies, samples)]


def refuse_emulated(path: str, target: str | None) -> None:
    """BadInputError when the artifact's CPU target (the one `target` names, or this host's) is of another
    architecture than the host's: under emulation, its time says nothing of the target's."""
    from farm.runtime.host import this_host
    from farm.runtime.selection import run_target

    chosen, emulated = run_target(path, target)
    if emulated:
        raise BadInputError(
            f"{path}: target {chosen.id!r} ({chosen.triple}) runs only under emulation on "
            f"this {this_host().arch} host, and an emulated time says nothing of the target's: "
            "bench it on its own architecture"
        )


def _round_order(count: int, round_: int) -> list[int]:
    return list(range(count)) if round_ % 2 == 0 else list(reversed(range(count)))


def _report(path: str, model: Any, latencies: list[float], samples: list[list[float]]) -> BenchReport:
    specs = _kernel_specs(path)
    steps = []
    for step, seconds in zip(model.schedule, samples):
        spec = specs[step["kernel"]]
        flops = FLOPS[spec["op"]](spec) if spec["op"] in FLOPS else None
        steps.append(StepTime(step["node"], spec["op"], kernel_label(spec), min(seconds), flops, tuple(seconds)))
    return BenchReport(path, str(model.target.get("id")), statistics.median(latencies), steps, tuple(latencies))


def _kernel_specs(path: str) -> dict[str, dict[str, Any]]:
    """Each kernel symbol's spec, of the CPU part and the OpenCL part of every size."""
    from farm.artifact import read_manifest, size_manifests

    specs = {}
    for manifest in size_manifests(read_manifest(path)):
        specs.update({entry["kernel"]: entry["spec"] for entry in manifest.get("kernels", [])})
        specs.update({entry["symbol"]: entry["spec"] for entry in manifest.get("opencl", {}).get("kernels", [])})
    return specs


def compare(before: BenchReport, after: BenchReport) -> list[Change]:
    """Every node of either report, matched by name, in the candidate's schedule order then the baseline's rest;
    each node in both with its p-value over all of them (Bonferroni: multiplied by their count)."""
    old = {step.node: step for step in before.steps}
    new = {step.node: step for step in after.steps}
    tested = len(old.keys() & new.keys())
    changes = [
        Change(
            node,
            step.kernel,
            old[node].seconds if node in old else None,
            step.seconds,
            _p_value(old.get(node), step, tested),
        )
        for node, step in new.items()
    ]
    changes += [Change(node, step.kernel, step.seconds, None) for node, step in old.items() if node not in new]
    return changes


def repeats_needed(nodes: int) -> int:
    """The fewest repeats with which a node that is slower in every repeat is flagged among `nodes` nodes: with
    fewer, no slowdown can pass the test, and a comparison would pass whatever it compared."""
    repeat = 3
    while slower_p_value(range(repeat), range(repeat, 2 * repeat)) * max(nodes, 1) >= FAMILY_ALPHA:
        repeat += 1
    return repeat


def _p_value(before: StepTime | None, after: StepTime, tested: int) -> float | None:
    if before is None or not before.samples or not after.samples:
        return None
    return min(1.0, slower_p_value(before.samples, after.samples) * tested)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def format_report(report: BenchReport) -> str:
    lines = [
        f"{report.artifact} ({report.target}): latency {_ms(report.latency)} ms, "
        f"steps {_ms(sum(step.seconds for step in report.steps))} ms",
        "",
        f"{'ms':>9} {'share':>6} {'GFLOP/s':>8} {'calls':>5}  kernel",
    ]
    for row in report.kernels():
        gflops = "-" if row["gflops"] is None else f"{row['gflops']:.1f}"
        lines.append(f"{row['seconds'] * 1e3:9.3f} {row['share']:6.1%} {gflops:>8} {row['calls']:5d}  {row['kernel']}")
    return "\n".join(lines)


def format_comparison(before: BenchReport, after: BenchReport, changes: Sequence[Change]) -> str:
    flagged = [change for change in changes if change.flagged]
    lines = [
        f"latency {_ms(before.latency)} -> {_ms(after.latency)} ms ({after.latency / before.latency:.2f}x); "
        f"{len(flagged)} node(s) more than {SLOWER_BY:.0%} slower beyond their noise (one-sided Mann-Whitney U "
        f"over {len(after.latencies)} alternating repeats, p < {FAMILY_ALPHA:g} over all nodes)",
        "",
        f"{'before ms':>10} {'after ms':>9} {'ratio':>6}  node  kernel",
    ]
    for change in changes:
        ratio = "-" if change.ratio is None else f"{change.ratio:.2f}"
        mark = "  SLOWER" if change.flagged else ""
        lines.append(
            f"{_ms(change.before):>10} {_ms(change.after):>9} {ratio:>6}  {change.node}  {change.kernel}{mark}"
        )
    return "\n".join(lines)


def comparison_fields(before: BenchReport, after: BenchReport, changes: Sequence[Change]) -> dict[str, Any]:
    """`farm bench --compare --json`'s fields: the candidate's report, and under `comparison` the baseline's and
    each node's change."""
    return {
        **after.to_json(),
        "comparison": {
            "baseline": before.to_json(),
            "changes": [{**asdict(change), "ratio": change.ratio, "flagged": change.flagged} for change in changes],
        },
    }
