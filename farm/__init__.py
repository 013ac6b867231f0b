"""farm: a build farm that compiles ONNX models with llvmlite into one artifact file.

`farm submit model.onnx` builds an artifact; `farm run ARTIFACT --input NAME=FILE.npy -o OUT.npz` runs it.
"""

__version__ = "0.1.0"
