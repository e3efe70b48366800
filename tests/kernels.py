"""Small kernels the tests share (CUDA source plus a host implementation)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

import asyncgraph as ag

# The scale kernel (out = a * x) and its host function, the one the bench command measures.
from asyncgraph._bench._bench_run import SCALE as SCALE

# The long kernel (a clock64() busy-wait) and its host clock, shared with the benchmarks.
from asyncgraph._demo._spin_kernel import HOST_CLOCK_HZ as HOST_CLOCK_HZ
from asyncgraph._demo._spin_kernel import SPIN as SPIN

Array = np.ndarray[Any, Any]


INC_SRC = r"""
extern "C" __global__ void inc(float* buf, float step, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] += step;
}
"""


def _inc(buf: Array, step: np.float32, n: np.int32) -> None:
    buf[: int(n)] += step


INC = ag.Kernel(INC_SRC, "inc", host=_inc)

# A kernel whose host function records the threads it ran on and how many ran at once.
PROBE_SRC = r"""
extern "C" __global__ void probe(const float* x, float* out, int n) { }
"""


class Recorder:
    """Thread-safe record of where and how concurrently a host function ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: set[int] = set()
        self.running = 0
        self.peak = 0
        self.release = threading.Event()
        self.release.set()

    def __call__(self, x: Array, out: Array, n: np.int32) -> None:
        with self.lock:
            self.threads.add(threading.get_ident())
            self.running += 1
            self.peak = max(self.peak, self.running)
        self.release.wait(10)
        out[:] = x * 2
        with self.lock:
            self.running -= 1


def probe_kernel(recorder: Recorder) -> ag.Kernel:
    return ag.Kernel(PROBE_SRC, "probe", host=recorder)


FILL_SRC = r"""
extern "C" __global__ void fill(float* out, float value, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
"""


def _fill(out: Array, value: np.float32, n: np.int64) -> None:
    out[: int(n)] = value


FILL = ag.Kernel(FILL_SRC, "fill", host=_fill)
