#!/usr/bin/env bash
# Set up the checkout, build the bundled example model and run it once, printing its outputs.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

echo "[demo] + .venv/bin/farm submit examples/tiny_cnn.onnx -o artifacts"
.venv/bin/farm submit examples/tiny_cnn.onnx -o artifacts

echo "[demo] + .venv/bin/farm run artifacts/tiny_cnn.farm --input input=examples/tiny_cnn_input.npy" \
    "-o artifacts/tiny_cnn_out.npz --print"
.venv/bin/farm run artifacts/tiny_cnn.farm --input input=examples/tiny_cnn_input.npy \
    -o artifacts/tiny_cnn_out.npz --print
