"""The CUDA engine behind ``open_backend("cuda")``: private modules, composed, no public names.

- ``_device``: the device's context, streams (as lanes), memory, pinned pool, events, reactor.
- ``_lanes``: a lane owns a stream, its handle, its scratch buffer; records and watches events.
- ``_kernels``: compiling and loading kernels; ``_launch``: packing and ``cuLaunchKernel``.
- ``_plan``: a dispatch's staging layout; ``_small``: dispatches staged in one pinned block;
  ``_streamed``: dispatches whose arrays stream in chunks; ``_storage``: resident storage.
- ``_graphs``: the capture package's host (recording, capturing, replaying).
- ``_engine``: the engine the front composes; ``_backend``: :class:`CudaBackend`, the front
  with the CUDA engine and its public extras.
- ``_reactor``, ``_events``, ``_driver``, ``_compile``, ``_transfer``: completion polling,
  event pools, the driver boundary, NVRTC, chunked transfers.
"""

__all__ = ()
