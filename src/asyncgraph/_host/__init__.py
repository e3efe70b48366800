"""The host backend: the same contract as CUDA, kernels' host functions in worker threads."""
