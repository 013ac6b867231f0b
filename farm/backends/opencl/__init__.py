"""The OpenCL backend: OpenCL C, program binaries per device fingerprint."""
