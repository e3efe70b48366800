"""The CUDA engine behind ``open_backend("cuda")``: private modules, composed, no public names.

- ``_cuda_backend``: :class:`CudaBackend`, the front with the CUDA engine and its public extras;
  ``_cuda_engine``: the engine the front composes; ``_cuda_device``: one device's context,
  lanes, memory, pinned pool, events and reactor; ``_cuda_graphs``: the capture package's host.
- ``driver/``: the driver boundary, the backend's own context, recycled events.
- ``launch/``: compiling and loading kernels, lanes, staging plans, staged and streamed
  dispatches.
- ``memory/``: resident storage, spare storage, chunked and peer copies.
- ``completion/``: the reactor, expected ends, poll budgets, other libraries' work.
- ``core/``: the dispatch core, compiled (``_core_compiled.pyx`` and its ``.pxi`` files) and in
  Python (``_core_python`` and the modules of the same names as those files).
"""

__all__ = ()
