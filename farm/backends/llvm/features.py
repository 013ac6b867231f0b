"""Every CPU feature a target's code may use: what LLVM enables for the target's CPU name, with its explicit features.

A CPU target names a CPU (`cpu:x86_64-linux-gnu:graniterapids`) whose features (AVX-512, AMX, ...) its feature
string doesn't spell out. An artifact's manifest records them all (each CPU target's `requires`), so that a runtime
on another CPU refuses the target, naming what its host lacks, instead of dying of SIGILL at the first instruction
it lacks (farm.runtime.host). llvmlite has no query for a CPU's features; LLVM's inliner answers it, in a child
process (farm/backends/llvm/probe_features.py says how): LLVM prints its list of a triple's features only once per
process, and removing some features aborts the process, which must not be a build's or a worker's.

Each answer is kept per toolchain and target, in memory and as a small JSON file under <cache>/cpu-features/, so a
build pays the probe (0.3-1.2 s) once per target, not once per process; a local build starts it in the background
as it begins (probe_in_background), so that on a fresh cache it runs while the build plans.
"""

from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
import threading
from concurrent.futures import Future
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from farm import defaults
from farm.atomic import write_atomically
from farm.backends.llvm.target import NAME, CpuTarget
from farm.errors import BuildError

PROBE = Path(__file__).with_name("probe_features.py")
PROBE_VERSION = 1
"""Part of every cached answer's key: bump it when the probe's method changes what it reports."""

PROBE_TIMEOUT_SECONDS = 120

UNREMOVABLE = frozenset({"64bit"})
"""Features never probed: removing `64bit` from a 64-bit triple aborts LLVM ("64-bit code requested on a subtarget
that doesn't support it"), and a 64-bit triple has it by definition."""

NEVER_GENERATED = {
    "x86_64": frozenset(
        {
            "aes",
            "amx-avx512",
            "amx-bf16",
            "amx-complex",
            "amx-fp16",
            "amx-fp8",
            "amx-int8",
            "amx-movrs",
            "amx-tf32",
            "amx-tile",
            "amx-transpose",
            "clflushopt",
            "clwb",
            "clzero",
            "cldemote",
            "cmpccxadd",
            "enqcmd",
            "fsgsbase",
            "hreset",
            "invpcid",
            "kl",
            "lwp",
            "movdir64b",
            "movdiri",
            "movrs",
            "mwaitx",
            "pclmul",
            "pconfig",
            "pku",
            "prefetchi",
            "ptwrite",
            "raoint",
            "rdpid",
            "rdpru",
            "rdrnd",
            "rdseed",
            "rtm",
            "serialize",
            "sgx",
            "sha",
            "sha512",
            "shstk",
            "sm3",
            "sm4",
            "tsxldtrk",
            "uintr",
            "usermsr",
            "vaes",
            "vpclmulqdq",
            "waitpkg",
            "wbnoinvd",
            "widekl",
            "xsave",
            "xsavec",
            "xsaveopt",
            "xsaves",
        }
    ),
}
"""Per architecture, features whose instructions LLVM emits only for their intrinsics, which farm's code never
calls (system, cryptographic, transactional and tile instructions): a target's code can't use them, so they are not
required. Hypervisors hide several of them (pku, mwaitx, rdpru, wbnoinvd on a Zen 4 cloud VM), and a
`cpu:x86_64-linux-gnu:znver4` build must still run on such a VM."""


def required_features(target: CpuTarget) -> list[str]:
    """The sorted names (without '+') of every feature `target`'s code may use: what LLVM enables for its CPU and
    features, less NEVER_GENERATED. BuildError when LLVM can't answer. Where probe_in_background started the
    answer, it is waited for (and, should that probe have failed, asked again here, so the error is this call's)."""
    key = (target.triple, target.cpu, target.features)
    with _BACKGROUND_LOCK:
        started = _BACKGROUND.pop(key, None)
    if started is not None:
        try:
            return list(started.result())
        except (BuildError, OSError):
            pass
    return list(_required(*key))


_BACKGROUND: dict[tuple[str, str, str], Future[tuple[str, ...]]] = {}
_BACKGROUND_LOCK = threading.Lock()


def probe_in_background(target: CpuTarget) -> None:
    """Start finding `target`'s required features on a thread of its own, so that the probe's child process runs
    while the build plans on the other cores: a cold local build asks for them only as it links, and waited
    0.3 s for them there on a 2-core Xeon. required_features takes the answer (once started, a target is not
    started again until it has been taken)."""
    key = (target.triple, target.cpu, target.features)
    with _BACKGROUND_LOCK:
        if key in _BACKGROUND:
            return
        future: Future[tuple[str, ...]] = Future()
        _BACKGROUND[key] = future
    threading.Thread(target=_answer_into, args=(future, key), daemon=True, name="farm-cpu-features").start()


def _answer_into(future: Future[tuple[str, ...]], key: tuple[str, str, str]) -> None:
    try:
        future.set_result(_required(*key))
    except BaseException as error:  # whatever it is, the waiter gets it instead of waiting for ever
        future.set_exception(error)


@functools.cache
def _required(triple: str, cpu: str, features: str) -> tuple[str, ...]:
    identity = [PROBE_VERSION, llvmlite.__version__, list(llvm.llvm_version_info), triple, cpu, features]
    path = defaults.cache_dir() / "cpu-features" / f"{hashlib.sha256(json.dumps(identity).encode()).hexdigest()}.json"
    cached = _read_names(path)
    if cached is not None:
        return cached
    never = NEVER_GENERATED.get(triple.split("-", 1)[0], frozenset())
    names = tuple(sorted(name for name in _enabled_at_once(triple, cpu, features) if name not in never))
    write_atomically(path, json.dumps(names).encode())
    return names


def _read_names(path: Path) -> tuple[str, ...] | None:
    """A cached answer (the cache is this host's own), or None when there is none or it is not a list of names."""
    try:
        names = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(names, list) or not all(isinstance(name, str) and NAME.fullmatch(name) for name in names):
        return None
    return tuple(names)


def _enabled_at_once(triple: str, cpu: str, features: str) -> list[str]:
    """The features the target enables, names and answer from one probe process; should LLVM abort on the answer
    (removing some feature aborts it), from the names the process gave first, in halves (_enabled)."""
    lines = _probe_lines(["both", triple, cpu, features], sorted(UNREMOVABLE), f"list the features of {triple}")
    if len(lines) == 2:
        return lines[1]
    candidates = [name for name in lines[0] if name not in UNREMOVABLE]
    return _enabled(triple, cpu, features, candidates)


def _enabled(triple: str, cpu: str, features: str, candidates: list[str]) -> list[str]:
    """The candidates the target enables. Should removing some candidate abort LLVM, the candidates are split in
    halves until it is found alone, and counted as enabled: a feature the triple can't go without."""
    what = f"list the features of CPU target {triple}:{cpu}:{features}"
    try:
        return _probe(["enabled", triple, cpu, features], candidates, what)
    except BuildError:
        if len(candidates) <= 1:
            return candidates
    half = len(candidates) // 2
    return _enabled(triple, cpu, features, candidates[:half]) + _enabled(triple, cpu, features, candidates[half:])


def _probe(arguments: list[str], candidates: list[str] | None, what: str) -> list[str]:
    """Run the probe child (`python -I probe_features.py ...`) and return its JSON list; BuildError naming `what`
    and LLVM's last words when it fails."""
    result = _run_probe(arguments, candidates, what)
    if result.returncode != 0:
        raise BuildError(f"LLVM could not {what}: {_last_words(result)}")
    return _names_in(result.stdout, what)


def _probe_lines(arguments: list[str], given: list[str], what: str) -> list[list[str]]:
    """Run a `both` probe: its two lists, or only the first (the names) when LLVM aborted on the second;
    BuildError when it gave not even the first."""
    result = _run_probe(arguments, given, what)
    lines = result.stdout.splitlines()
    if result.returncode == 0 and len(lines) == 2:
        return [_names_in(line, what) for line in lines]
    if lines:
        return [_names_in(lines[0], what)]
    raise BuildError(f"LLVM could not {what}: {_last_words(result)}")


def _run_probe(arguments: list[str], given: list[str] | None, what: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-I", str(PROBE), *arguments],
            capture_output=True,
            text=True,
            input=json.dumps(given) if given is not None else "",
            timeout=PROBE_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise BuildError(f"LLVM could not {what}: {error}") from None


def _last_words(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]


def _names_in(text: str, what: str) -> list[str]:
    """The JSON list of feature names the probe printed, or BuildError."""
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) and NAME.fullmatch(name) for name in names):
        raise BuildError(f"LLVM could not {what}: the probe printed {text[:200]!r}")
    return names
