"""Device memory of the CUDA engine: resident storage, spare storage, chunked and peer copies."""
