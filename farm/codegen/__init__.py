"""Code generation: ops are lowered once into the loop IR (loopir) and rendered per backend (llvm for CPUs)."""
