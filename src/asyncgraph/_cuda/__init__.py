"""The CUDA engine behind ``open_backend("cuda")``: private modules, composed, no public names.

- ``_cuda_backend``: :class:`CudaBackend`, the front with the CUDA engine and its public extras;
  ``_cuda_engine``: the engine the front composes; ``_cuda_graphs``: the capture package's host.

Its folders are layers, each importing only the ones listed after it:

- ``launch/``: compiling and loading kernels, staged and streamed dispatches.
- ``memory/``: resident storage, chunked and peer copies.
- ``device/``: one device's context, lanes, memory, pinned pool, events and reactor; spare storage.
- ``completion/``: the reactor, expected ends, poll budgets, other libraries' work.
- ``lanes/``: lanes, the order between their streams, staging plans.
- ``core/``: the dispatch core, compiled (``_core_compiled.pyx`` and its ``.pxi`` files) and in
  Python (``_core_python`` and the modules of the same names as those files).
- ``driver/``: the driver boundary, the backend's own context, recycled events, priorities.
"""

__all__ = ()
