"""Tools around the compiler: example models, ONNX's Backend interface, the conformance report."""
