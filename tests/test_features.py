"""farm.backends.llvm.features: every feature a CPU target's code may use, as LLVM defines its CPU, asked of LLVM in a
child process (farm/backends/llvm/probe_features.py) and cached per toolchain and target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farm.backends.llvm import features
from farm.backends.llvm.features import NEVER_GENERATED, PROBE, required_features
from farm.backends.llvm.target import CpuTarget, host_target
from farm.errors import BuildError
from farm.runtime.host import missing_features, this_host

X86 = "x86_64-unknown-linux-gnu"


def test_a_cpu_name_implies_its_features() -> None:
    granite = required_features(CpuTarget(X86, "graniterapids"))
    assert {"avx512f", "avx512fp16", "avx512vnni", "avx2", "fma", "sse4.2"} <= set(granite)
    zen3 = required_features(CpuTarget(X86, "znver3"))
    assert {"avx2", "fma", "bmi2"} <= set(zen3)
    assert not {name for name in zen3 if name.startswith("avx512")}
    assert granite == sorted(granite)


def test_explicit_features_count_with_what_they_imply_and_what_they_remove() -> None:
    assert {"avx2", "avx", "sse4.2"} <= set(required_features(CpuTarget(X86, "generic", "+avx2")))
    without = set(required_features(CpuTarget(X86, "znver3", "-avx2")))
    assert "avx2" not in without and "avx" in without


def test_features_only_intrinsics_reach_are_not_required() -> None:
    """LLVM enables pku and mwaitx for znver4, which cloud VMs hide; farm's code never uses them."""
    zen4 = set(required_features(CpuTarget(X86, "znver4")))
    assert "avx512f" in zen4
    assert not zen4 & NEVER_GENERATED["x86_64"]


def test_this_hosts_own_target_runs_here() -> None:
    required = required_features(host_target())
    assert required
    assert missing_features(required, this_host()) == []


def test_other_architectures_are_probed_too() -> None:
    assert {"neon", "fp-armv8"} <= set(required_features(CpuTarget("aarch64-unknown-linux-gnu")))
    riscv = required_features(CpuTarget("riscv64-unknown-linux-gnu", "generic-rv64", "+m,+a,+f,+d,+c"))
    assert {"m", "a", "f", "d", "c"} <= set(riscv)


def test_answers_are_cached_on_disk_and_a_damaged_answer_is_asked_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path))
    features._required.cache_clear()
    target = CpuTarget(X86, "x86-64-v3")
    first = required_features(target)
    [answer] = (tmp_path / "cpu-features").iterdir()
    assert json.loads(answer.read_text()) == first
    answer.write_text(json.dumps(["avx2"]))
    features._required.cache_clear()
    assert required_features(target) == ["avx2"]  # the host's own cache is read, not asked again
    answer.write_text('["avx2", "not a name"]')
    features._required.cache_clear()
    assert required_features(target) == first
    features._required.cache_clear()


def test_a_feature_whose_removal_aborts_llvm_is_found_by_halving() -> None:
    """Removing 64bit from a 64-bit triple aborts LLVM: the probe child dies, the candidates are halved, and the
    one LLVM can't go without counts as enabled."""
    assert features._enabled(X86, "x86-64-v3", "", ["64bit", "avx2", "avx512f"]) == ["64bit", "avx2"]


def test_one_probe_process_lists_the_names_and_answers_as_the_halving_does() -> None:
    names, enabled = features._probe_lines(["both", X86, "x86-64-v3", ""], ["64bit"], "probe")
    assert "avx2" in enabled and "avx512f" not in enabled and set(enabled) <= set(names)
    assert features._enabled(X86, "x86-64-v3", "", [name for name in names if name != "64bit"]) == enabled


def test_an_abort_after_the_names_leaves_the_names_for_the_halving() -> None:
    """Removing 64bit aborts LLVM after the names line: the parent still has it and halves (_enabled_at_once)."""
    [names] = features._probe_lines(["both", X86, "x86-64-v3", ""], [], "probe")
    assert "64bit" in names and "avx2" in names


def test_a_triple_llvm_does_not_know_is_a_build_error_naming_it() -> None:
    with pytest.raises(BuildError, match="LLVM could not list the features of nonsense-triple-x"):
        features._enabled_at_once("nonsense-triple-x", "generic", "")


@pytest.mark.parametrize(
    "arguments",
    [["enabled", X86, 'x86-64"', ""], ["names", X86], ["both", X86], ["enabled", X86, "generic", "avx"], ["list", X86]],
)
def test_the_probe_refuses_a_malformed_call(arguments: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-I", str(PROBE), *arguments], input="[]", capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and result.stdout == ""
    assert "usage: probe_features.py" in result.stderr


def test_an_answer_probed_in_the_background_is_the_one_required_features_gives(tmp_path: Path, monkeypatch) -> None:
    """A build starts each CPU target's probe as it begins (CpuPart.start) and takes the answer as it links: one
    probe child for both, the same answer as asking directly."""
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path))
    features._required.cache_clear()
    runs = []
    real = features._run_probe
    monkeypatch.setattr(features, "_run_probe", lambda *args: runs.append(args) or real(*args))
    target = CpuTarget(X86, "x86-64-v2")
    features.probe_in_background(target)
    features.probe_in_background(target)  # started once
    answer = required_features(target)
    assert len(runs) == 1 and "sse4.2" in answer and "avx2" not in answer
    features._required.cache_clear()
    assert required_features(target) == answer  # from the cache file the background probe wrote
    features._required.cache_clear()


def test_a_background_probe_that_fails_is_asked_again_by_whoever_wants_the_answer() -> None:
    target = CpuTarget("nonsense-triple-y", "generic")
    features.probe_in_background(target)
    with pytest.raises(BuildError, match="LLVM could not list the features of nonsense-triple-y"):
        required_features(target)
    assert (target.triple, target.cpu, target.features) not in features._BACKGROUND
