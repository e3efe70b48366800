"""A kernel that writes to an illegal address: the device fault of the tests and benchmarks.

Not part of the public API. It lives in the package, as ``_spin_kernel`` does, so that the tests,
the benchmarks and the standalone scripts they start (each in a process of its own, since the fault
fails every CUDA context of its process) share one source.
"""

from __future__ import annotations

from asyncgraph._args._kernel import Kernel

__all__ = ("POKE", "POKE_SOURCE")

# Writes one float at *offset* past *out*; an offset far past any buffer (1 << 40) faults.
POKE_SOURCE = r"""
extern "C" __global__ void poke(float* out, long long offset)
{
    out[offset] = 1.0f;  // offset far past the buffer: an illegal address
}
"""

POKE = Kernel(POKE_SOURCE, "poke")
