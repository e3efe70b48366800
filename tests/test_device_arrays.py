"""Reading foreign device arrays (``__cuda_array_interface__``), without a GPU."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import asyncgraph as ag
from asyncgraph._args._bound_args import foreign_array
from asyncgraph._args._kernel import parse_signature

PARAMS = parse_signature('extern "C" __global__ void k(const float* x, int n) {}', "k")
assert PARAMS is not None
PTR, VALUE = PARAMS


class Device:
    """A stand-in for a CuPy array or a PyTorch CUDA tensor."""

    def __init__(self, **cai: Any) -> None:
        self.__cuda_array_interface__ = cai


GOOD: dict[str, Any] = {"shape": (4, 3), "typestr": "<f4", "data": (0x7000, False), "version": 3}


def test_a_contiguous_array_gives_its_pointer_and_stream() -> None:
    assert foreign_array(Device(**GOOD), "x", PTR) == (0x7000, None)
    assert foreign_array(Device(**GOOD, stream=5), "x", PTR) == (0x7000, 5)
    strided = Device(**GOOD, strides=(12, 4))  # explicit C-contiguous strides
    assert foreign_array(strided, "x", None) == (0x7000, None)


@pytest.mark.parametrize(
    ("cai", "error", "message"),
    [
        (
            {"typestr": "<f4", "data": (1, False)},
            ag.ArgumentTypeError,
            r"^x has a malformed __cuda_array_interface__ \(KeyError: 'shape'\); it needs 'shape', "
            r"'typestr' and 'data' \(version 3\)$",
        ),
        (
            {"shape": (4,), "typestr": "nonsense", "data": (1, False)},
            ag.ArgumentTypeError,
            r"^x has a malformed __cuda_array_interface__ \(TypeError: .*$",
        ),
        (
            {"shape": (4,), "typestr": "<f4", "data": None},
            ag.ArgumentTypeError,
            r"^x has a malformed __cuda_array_interface__ \(TypeError: .*$",
        ),
        (
            {**GOOD, "strides": (4, 16)},
            ag.DispatchError,
            r"^x is a device array that is not C-contiguous; make it contiguous first "
            r"\(cupy.ascontiguousarray\(x\) or x.contiguous\(\)\)$",
        ),
        (
            {**GOOD, "shape": (0, 3)},
            ag.DispatchError,
            r"^x is an empty device array; skip the dispatch$",
        ),
        (
            {**GOOD, "typestr": "<f8"},
            ag.ArgumentTypeError,
            r"^x is a float64 array; the kernel takes float32 — pass x.astype\(np.float32\)$",
        ),
    ],
    ids=["no shape", "bad typestr", "no data", "not contiguous", "empty", "wrong dtype"],
)
def test_bad_device_arrays_are_refused(
    cai: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        foreign_array(Device(**cai), "x", PTR)


def test_a_device_array_for_a_value_parameter_is_refused() -> None:
    with pytest.raises(ag.ArgumentTypeError, match=r"^n is an array; that parameter is a value"):
        foreign_array(Device(**GOOD), "n", VALUE)


def test_an_object_without_the_interface_is_refused() -> None:
    with pytest.raises(ag.ArgumentTypeError, match=r"without __cuda_array_interface__"):
        foreign_array(np.ones(3), "x", PTR)
