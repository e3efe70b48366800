"""Launching work: kernels compiled and loaded, staged and streamed dispatches."""
