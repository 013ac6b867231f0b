"""The sha256 of every test model's artifact, built for fixed CPU targets: a refactoring that must not change what
farm emits (issue 31: "the artifacts are byte-identical before and after") is checked by running this before and
after and comparing the two outputs.

    python scripts/artifact_digests.py > before.txt          # on the commit the work starts from
    python scripts/artifact_digests.py > after.txt
    diff before.txt after.txt                                 # no output: byte-identical

The targets name their CPUs (an AVX-512 x86-64, an AVX2-only one and an aarch64), so the artifacts don't depend
on the host that builds them; every unit is compiled (`--no-cache`), since a cached kernel would hide a change.
OpenCL program binaries are left out: they are the driver's output, not farm's.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("cpu:x86_64-linux-gnu:skylake-avx512", "cpu:x86_64-linux-gnu:znver3", "cpu:aarch64-linux-gnu:neoverse-n1")
MODELS = {
    "tiny_cnn": (ROOT / "examples" / "tiny_cnn.onnx", ()),
    **{
        f"{name}_static": (ROOT / "tests" / "exports" / f"{name}_static.onnx", ())
        for name in ("mobilenet_v2", "mobilenet_v3", "bert", "gpt2", "vit")
    },
    "bert_dynamic": (ROOT / "tests" / "exports" / "bert_dynamic.onnx", ("batch=1,3", "seq=12")),
}
"""Name -> (model, --shape pins): the example, the committed exports, and one artifact of several sizes."""


def artifact_digest(model: Path, pins: tuple[str, ...], folder: Path) -> str:
    """The sha256 of `model`'s artifact for TARGETS, built by `farm submit` in a process of its own."""
    output = folder / f"{model.stem}.farm"
    command = [
        sys.executable,
        "-m",
        "farm",
        "submit",
        str(model),
        "-o",
        str(output),
        "--no-cache",
        *(f"--target={target}" for target in TARGETS),
        *(f"--shape={pin}" for pin in pins),
    ]
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return hashlib.sha256(output.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help=f"comma-separated names (default: all of {', '.join(MODELS)})")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: expected some of {', '.join(MODELS)}")
    with tempfile.TemporaryDirectory(prefix="farm-digests-") as folder:
        for name in names:
            model, pins = MODELS[name]
            print(f"{name} {artifact_digest(model, pins, Path(folder))}", flush=True)


if __name__ == "__main__":
    main()
