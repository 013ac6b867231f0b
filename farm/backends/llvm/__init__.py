"""The CPU backend: LLVM IR through llvmlite, object files, one shared library per target."""
