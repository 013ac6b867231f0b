"""Graph passes that simplify an imported model before planning, one module each; `optimize` runs them in order.

Every pass rewrites the Graph in place and returns it. Passes never mutate a constant array: a weight may be
shared by several nodes, so a rewritten weight always gets a new name.
"""

from __future__ import annotations

from collections.abc import Callable

from farm.frontend.passes.activation_fusion import fuse_activations
from farm.frontend.passes.batchnorm import fold_batchnorm
from farm.frontend.passes.bias_fusion import fuse_matmul_biases
from farm.frontend.passes.channel_affine import fold_channel_affine
from farm.frontend.passes.constant_folding import fold_constants
from farm.frontend.passes.dead_nodes import remove_dead_nodes
from farm.frontend.passes.dequantize_fusion import fuse_dequantized_products
from farm.frontend.passes.gelu_fusion import fuse_gelus
from farm.frontend.passes.passthrough import drop_passthrough
from farm.frontend.passes.qdq_fusion import fuse_qdq
from farm.frontend.passes.quantized_add import fuse_quantized_adds
from farm.frontend.passes.quantized_maxpool import pool_quantized_maxpools
from farm.frontend.passes.residual_fusion import fuse_residual_adds
from farm.ir.graph import Graph

PIPELINE: tuple[Callable[[Graph], Graph], ...] = (
    drop_passthrough,
    fuse_qdq,
    fuse_dequantized_products,
    fuse_quantized_adds,
    pool_quantized_maxpools,
    fold_constants,
    fold_batchnorm,
    fold_channel_affine,
    fuse_residual_adds,
    fuse_matmul_biases,
    fuse_gelus,
    fuse_activations,
    remove_dead_nodes,
)


def optimize(graph: Graph) -> Graph:
    """Run PIPELINE in order on `graph` (rewritten in place) and return it."""
    for graph_pass in PIPELINE:
        graph = graph_pass(graph)
    return graph
