#!/usr/bin/env python3
"""One inference engine in a process of its own, timed on command, so that benchmarks never time two engines in
one process.

Timed in one process, onnxruntime's pool threads spin on after its runs and take a core from the engine timed
next (on a 2-core Zen 3 that doubled farm's two-thread figures), and both engines' allocators and caches share
one heap. A benchmark starts one `EngineProcess` per engine and setting (farm and onnxruntime, each at its
default threads and on one thread), and has them take turns (`alternating_latency`): only the engine whose turn it
is runs; the others wait on a pipe, their threads asleep.

The child (`python3 engine_process.py ENGINE MODEL FEEDS THREADS CACHE`) loads the model (ENGINE `farm`: an
artifact, through farm's runtime; `ort`: an .onnx file, through onnxruntime's CPU provider, with THREADS 1 pinning
both its intra- and inter-op pools to one thread; THREADS 0: each engine's default), runs it twice, says `ready`
with what it loaded, and then answers one line per command on stdin:

- `time N`: N runs back to back; replies the mean seconds of one run;
- `outputs PATH`: one run; writes its outputs to PATH (.npz, by output name); replies `saved`;
- end of input: exits.

It imports only its own engine: the farm child never loads onnxruntime, and the onnxruntime child never loads farm.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

SETTLE_SECONDS = 0.1
"""The pause before each turn: onnxruntime's pool threads spin for a while after a run before they sleep."""


def _farm_runner(model: str, threads: int, cache: str) -> tuple[Callable[[dict], dict], dict[str, Any]]:
    from farm import runtime

    loaded = runtime.load(model, cache_dir=cache, threads=threads)
    return loaded.run, {"threads": loaded.threads}


def _ort_runner(model: str, threads: int, cache: str) -> tuple[Callable[[dict], dict], dict[str, Any]]:
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # the light models carry unused initializers ort warns about
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]

    def run(feeds: dict) -> dict:
        return dict(zip(names, session.run(names, feeds), strict=True))

    return run, {"threads": threads or None}


ENGINES: dict[str, Callable[[str, int, str], tuple[Callable[[dict], dict], dict[str, Any]]]] = {
    "farm": _farm_runner,
    "ort": _ort_runner,
}


def serve(engine: str, model: str, feeds_path: str, threads: int, cache: str) -> None:
    """The child: load, warm up, say ready, then answer commands until stdin closes."""
    with np.load(feeds_path) as stored:
        feeds = {name: stored[name] for name in stored.files}
    run, loaded = ENGINES[engine](model, threads, cache)
    run(feeds), run(feeds)
    print(json.dumps({"ready": True, **loaded}), flush=True)
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "time":
            count = int(argument)
            started = time.perf_counter()
            for _ in range(count):
                run(feeds)
            print(json.dumps((time.perf_counter() - started) / count), flush=True)
        elif command == "outputs":
            np.savez(argument, **run(feeds))
            print(json.dumps("saved"), flush=True)
        else:
            raise SystemExit(f"engine_process: unknown command {line.strip()!r}")


class EngineProcess:
    """The parent's handle on one child: start it (`with`), then `seconds(runs)` and `outputs()`."""

    def __init__(self, engine: str, model: Path | str, feeds: Path, threads: int, cache: Path) -> None:
        self.name = f"the {engine} engine process for {model}"
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), engine, str(model), str(feeds), str(threads), str(cache)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.loaded: dict[str, Any] = self._reply()

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reply(self) -> Any:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} died (exit status {self.process.wait()})")
        return json.loads(line)

    def _ask(self, command: str) -> Any:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._reply()

    def seconds(self, runs: int) -> float:
        """The mean seconds of one run over `runs` back to back."""
        return float(self._ask(f"time {runs}"))

    def outputs(self, path: Path) -> dict[str, np.ndarray]:
        """One run's outputs, by name."""
        self._ask(f"outputs {path}")
        with np.load(path) as stored:
            return {name: stored[name] for name in stored.files}

    def close(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        self.process.wait()


def alternating_latency(engines: Mapping[str, EngineProcess], rounds: int, runs: int) -> dict[str, float]:
    """Median over `rounds` of each engine's mean seconds over `runs` runs; the engines take turns every round, each
    after a pause of SETTLE_SECONDS, so a busy moment of the host hits every engine alike."""
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            time.sleep(SETTLE_SECONDS)
            samples[name].append(engine.seconds(runs))
    return {name: statistics.median(values) for name, values in samples.items()}


def save_feeds(feeds: Mapping[str, np.ndarray], path: Path) -> Path:
    """The feeds as the children read them."""
    np.savez(path, **feeds)
    return path


if __name__ == "__main__":
    engine_name, model_path, feeds_file, thread_count, cache_dir = sys.argv[1:]
    serve(engine_name, model_path, feeds_file, int(thread_count), cache_dir)
