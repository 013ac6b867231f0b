"""From an ONNX file to an optimised, validated Graph: import and graph passes."""
