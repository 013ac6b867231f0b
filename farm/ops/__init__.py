"""The op set: a registry from ONNX op type to its lowering into the loop IR.

Each entry says which node inputs are data buffers (kernel arguments), which constant inputs fold into attributes,
how to normalise attributes (defaults filled, so equal layers get equal keys) and how to build the loop kernel.
Importing the op modules fills the registry.
"""

from __future__ import annotations

from farm.ops import (  # noqa: F401,E402  (they register themselves)
    attention,
    conv,
    conv_transpose,
    dequantized_matmul,
    elementwise,
    indexing,
    linalg,
    losses,
    matmul,
    normalization,
    pool,
    quantize,
    quantized_add,
    reduce,
    sampling,
    scatter,
    softmax,
    spectral,
    tensor,
)
from farm.ops.registry import LOWERINGS, SUPPORTED_OPS, OpLowering, argument_bytes, lower_kernel, register  # noqa: F401

__all__ = ["LOWERINGS", "OpLowering", "SUPPORTED_OPS", "argument_bytes", "lower_kernel", "register"]
