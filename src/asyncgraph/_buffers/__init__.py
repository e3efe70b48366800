"""Resident buffers: device memory kept between dispatches, its transfers and its exports."""
