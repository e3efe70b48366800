"""Device memory of the CUDA engine: resident storage, chunked and peer copies."""
