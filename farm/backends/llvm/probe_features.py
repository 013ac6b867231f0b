"""The child process of farm.backends.llvm.features: asks LLVM which features a CPU target enables.

Run as `python -I probe_features.py both TRIPLE CPU FEATURES` with a JSON list of features never to try removing
on stdin: it prints the JSON list of every feature LLVM knows for the triple on one line, flushed, then those of
the others that the target enables on a second (one process for a target's first build; should LLVM abort on the
second, the parent has the first); or as `python -I probe_features.py enabled TRIPLE CPU FEATURES` with a JSON list
of candidate features on stdin (prints those the target enables: the parent's halving after an abort). It imports nothing but the standard library and llvmlite, so it runs by path in
isolated mode (-I), whatever farm's tree the parent imported; a crash here (LLVM aborts on some feature strings)
ends this process only.

How a feature is found enabled: LLVM's inliner inlines a callee into a caller only when the callee's features are a
subset of the caller's (TargetTransformInfo::areInlineCompatible; on x86 tuning features are ignored there). So
feature F is enabled for (cpu, features) exactly when a function compiled for the target is not inlined into a
caller compiled for the target with "-F" appended. One module holds a caller per candidate, and one O2 pipeline
decides them all.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

import llvmlite.binding as llvm

NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""The form of a triple, CPU or feature name: nothing else is written into the probe's IR."""

FEATURE_LINE = re.compile(r"^  (\S+)\s+- ", re.MULTILINE)


def feature_names(triple: str) -> list[str]:
    """Every feature LLVM knows for `triple`, from the list it prints for the feature string "+help" (once per
    process, hence this child)."""
    llvm.initialize_all_targets()
    target = llvm.Target.from_triple(triple)
    with tempfile.TemporaryFile() as capture:
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            str(target.create_target_machine(features="+help").target_data)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    listing = text.partition("Available features for this target:")[2].partition("Use +feature")[0]
    return [name for name in FEATURE_LINE.findall(listing) if NAME.fullmatch(name)]


def enabled_features(triple: str, cpu: str, features: str, candidates: list[str]) -> list[str]:
    """The candidates that (cpu, features) enables, by the inliner (see the module's docstring)."""
    llvm.initialize_all_targets()
    separator = "," if features else ""
    lines = [
        f'target triple = "{triple}"',
        "define internal void @target(ptr %p) #0 {\n  store volatile i32 1, ptr %p\n  ret void\n}",
        f'attributes #0 = {{ "target-cpu"="{cpu}" "target-features"="{features}" }}',
    ]
    for index, name in enumerate(candidates, start=1):
        lines.append(f"define void @without{index}(ptr %p) #{index} {{\n  call void @target(ptr %p)\n  ret void\n}}")
        lines.append(
            f'attributes #{index} = {{ "target-cpu"="{cpu}" "target-features"="{features}{separator}-{name}" }}'
        )
    module = llvm.parse_assembly("\n".join(lines))
    machine = llvm.Target.from_triple(triple).create_target_machine(opt=2)
    builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(speed_level=2))
    builder.getModulePassManager().run(module, builder)
    return [
        name
        for index, name in enumerate(candidates, start=1)
        if "@target(" in str(module.get_function(f"without{index}"))
    ]


def main(argv: list[str]) -> int:
    """both TRIPLE CPU FEATURES (features never to remove on stdin) | enabled TRIPLE CPU FEATURES (candidates on
    stdin); JSON on stdout; 2 on a malformed call."""
    plain = len(argv) == 4 and argv[0] in ("enabled", "both") and all(NAME.fullmatch(value) for value in argv[1:3])
    if not plain or not re.fullmatch(r"([+-][A-Za-z0-9_.-]+(,[+-][A-Za-z0-9_.-]+)*)?", argv[3]):
        print("usage: probe_features.py both|enabled TRIPLE CPU FEATURES", file=sys.stderr)
        return 2
    given = [name for name in json.load(sys.stdin) if isinstance(name, str) and NAME.fullmatch(name)]
    if argv[0] == "both":
        names = feature_names(argv[1])
        print(json.dumps(names), flush=True)
        given = [name for name in names if name not in given]
    print(json.dumps(enabled_features(argv[1], argv[2], argv[3], given)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
