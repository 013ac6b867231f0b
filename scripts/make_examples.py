"""Regenerate the bundled example files in examples/ from farm.tools.examples (deterministic: same bytes every run).

Usage: `python scripts/make_examples.py` writes examples/tiny_cnn.onnx and examples/tiny_cnn_input.npy;
`python scripts/make_examples.py --check` exits 1 if the committed files differ from what it would write.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from farm.tools.examples import random_input, tiny_cnn  # noqa: E402

EXAMPLES_DIR = REPO_ROOT / "examples"


def example_files() -> dict[str, bytes]:
    """File name in examples/ -> the bytes it should hold."""
    model = tiny_cnn()
    buffer = io.BytesIO()
    np.save(buffer, random_input(model, seed=0)["input"], allow_pickle=False)
    return {"tiny_cnn.onnx": model.SerializeToString(), "tiny_cnn_input.npy": buffer.getvalue()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, data in example_files().items():
        path = EXAMPLES_DIR / name
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            print(f"wrote {path.relative_to(REPO_ROOT)} ({len(data)} bytes)")
    if stale:
        print(f"out of date: {', '.join(stale)}; run: python scripts/make_examples.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
