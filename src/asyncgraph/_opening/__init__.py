"""Opening a backend: the device parsed, CUDA probed, the implementation chosen; the one
folder that knows the implementations."""
