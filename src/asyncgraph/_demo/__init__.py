"""The demo, and the kernels the tests and benchmarks share (a long one and a faulting one)."""
