"""Resident buffers: device memory kept between dispatches, its store and its DLPack capsules."""
