"""The CUDA driver as the engine meets it: errors, the backend's context, recycled events, stream
priorities, and reset_device()."""
