"""Launching work: kernels compiled and loaded, lanes, staging plans, staged and streamed
dispatches."""
