"""A kernel that busy-waits on the GPU's clock: the long kernel of the tests and benchmarks.

Not part of the public API. It lives in the package so that the tests, the benchmarks and the
standalone scripts they start can share one source without importing each other.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from asyncgraph._args._kernel import Kernel

__all__ = ("HOST_CLOCK_HZ", "SPIN", "SPIN_SOURCE")

# About an H100's clock: the host version of SPIN sleeps as long as the GPU spins.
HOST_CLOCK_HZ = 2e9

# Busy-waits for a number of clock cycles, then sets done[0] (a long kernel). A device's
# clock_rate property is in kHz, so cycles = clock_rate * milliseconds.
SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles, int* done)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    done[0] = 1;
}
"""


def _spin(cycles: np.int64, done: np.ndarray[Any, Any]) -> None:
    time.sleep(int(cycles) / HOST_CLOCK_HZ)
    done[0] = 1


SPIN = Kernel(SPIN_SOURCE, "spin", host=_spin)
