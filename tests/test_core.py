"""The dispatch core: the compiled extension and its Python twin pack the same bytes, the
choice between them, and the native waiter's plumbing (no GPU needed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from cuda.bindings import driver as drv

from asyncgraph._args._bound_args import Arg, InArg, OutArg, ScalarArg
from asyncgraph._args._kernel import Param
from asyncgraph._cuda.core import _choose as _cores
from asyncgraph._cuda.core import _core_python as _core_py

try:
    from asyncgraph._cuda.core import _core_compiled as compiled  # type: ignore[attr-defined]  # built in place
except ImportError:
    compiled = None

needs_compiled = pytest.mark.compiled  # skipped where it is not built (tests/needs.py)

# Every value type the compiled launcher packs.
DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8"]


def _param(name: str, dtype: str | None) -> Param:
    if dtype is None:
        return Param(name, "float*", pointer=True, const=False, dtype=np.dtype(np.float32))
    return Param(name, "t", pointer=False, const=False, dtype=np.dtype(dtype))


def _random_scalar(rng: np.random.Generator, dtype: np.dtype[Any]) -> Any:
    if dtype.kind == "b":
        return np.bool_(rng.integers(0, 2))
    if dtype.kind == "f":
        return dtype.type(rng.standard_normal() * 1e3)
    info = np.iinfo(dtype)
    return dtype.type(rng.integers(info.min, info.max, endpoint=True, dtype=dtype))


def _call(rng: np.random.Generator) -> tuple[tuple[Param, ...], list[Arg], int, bytes]:
    """Parameters, bound arguments, a base address, and the bytes the block must hold."""
    params: list[Param] = []
    args: list[Arg] = []
    expected = b""
    base = int(rng.integers(1 << 32, 1 << 48))
    for i, dtype in enumerate([*DTYPES, None, None, *DTYPES[::-1]]):
        params.append(_param(f"p{i}", dtype))
        if dtype is None:
            staged = (InArg if i % 2 else OutArg)(i, np.zeros(4, np.float32), params[-1])
            staged.offset = int(rng.integers(0, 1 << 20)) * 256
            raw = np.uint64(base + staged.offset).tobytes()
            arg: Arg = staged
        else:
            value = _random_scalar(rng, np.dtype(dtype))
            arg = ScalarArg(i, value, params[-1])
            raw = np.array(value, dtype).tobytes()
        args.append(arg)
        expected += raw + bytes(16 - len(raw))
    return tuple(params), args, base, expected


def _launchers(params: tuple[Param, ...]) -> list[Any]:
    makers: list[Any] = [_core_py.Launcher] + ([compiled.Launcher] if compiled else [])
    return [maker(drv.CUfunction(), params) for maker in makers]


def test_each_core_packs_what_numpy_would_write(rng: np.random.Generator) -> None:
    for _ in range(50):
        params, args, base, expected = _call(rng)
        for launcher in _launchers(params):
            launcher.pack(args, base)
            assert launcher.packed() == expected, type(launcher)


def test_launch_values_pack_the_same_as_arguments(rng: np.random.Generator) -> None:
    params, args, base, expected = _call(rng)
    values = [arg.value if arg.by_value else base + arg.offset for arg in args]
    for launcher in _launchers(params):
        launcher.pack_values(values)
        assert launcher.packed() == expected


def test_a_wrong_number_of_arguments_is_refused_by_both(rng: np.random.Generator) -> None:
    params, args, base, _ = _call(rng)
    for launcher in _launchers(params):
        with pytest.raises(ValueError, match="argument"):
            launcher.pack(args[:-1], base)
        with pytest.raises(ValueError, match="argument"):
            launcher.pack_values([0] * (len(args) + 1))


@needs_compiled
def test_the_compiled_launcher_leaves_other_types_to_the_python_one() -> None:
    half = (_param("h", "f2"),)
    assert not compiled.Launcher.supports(half)
    assert _core_py.Launcher.supports(half)
    with pytest.raises(TypeError, match="cannot pack"):
        compiled.Launcher(drv.CUfunction(), half)
    assert compiled.Launcher.supports(tuple(_param("x", d) for d in [*DTYPES, None]))


def _describe(env: dict[str, str]) -> str:
    code = "from asyncgraph._cuda.core import _choose; print(_choose.describe())"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip()


def test_the_environment_variable_forces_the_python_core() -> None:
    described = _describe({_cores.PURE_ENV: "1"})
    assert described == f"Python ({_cores.PURE_ENV} is set)"


@needs_compiled
def test_the_compiled_core_is_chosen_when_asked_for_and_built() -> None:
    assert _describe({_cores.CORE_ENV: "compiled", _cores.PURE_ENV: "0"}).startswith("compiled")


def test_the_python_core_is_chosen_when_asked_for() -> None:
    assert _describe({_cores.CORE_ENV: "python"}) == f"Python ({_cores.CORE_ENV}=python)"


def test_the_environment_variable_of_the_issue_wins() -> None:
    described = _describe({_cores.CORE_ENV: "compiled", _cores.PURE_ENV: "1"})
    assert described == f"Python ({_cores.PURE_ENV} is set)"


def test_an_unknown_core_name_falls_back_and_says_why() -> None:
    described = _describe({_cores.CORE_ENV: "fast"})
    assert described == f"Python ({_cores.CORE_ENV}='fast' is neither 'compiled' nor 'python')"


def test_without_a_choice_the_default_core_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k not in (_cores.CORE_ENV, _cores.PURE_ENV)}
    code = "from asyncgraph._cuda.core import _choose; print(_choose.describe())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    described = result.stdout.strip()
    # The compiled core wherever it built; else the Python one, saying why.
    if importlib.util.find_spec("asyncgraph._cuda.core._core_compiled") is not None:
        assert described.startswith("compiled (asyncgraph._cuda.core._core_compiled")
    else:
        assert described.startswith("Python (the compiled core is not available: ")


def test_info_says_which_core_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "asyncgraph", "info"],
        env={**os.environ, _cores.PURE_ENV: "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"dispatch core  Python ({_cores.PURE_ENV} is set)" in result.stdout


@needs_compiled
def test_a_native_waiter_starts_no_thread_until_handed_an_event() -> None:
    waiter = compiled.NativeWaiter(drv.CUcontext(), 3)
    assert waiter.fd >= 0
    assert waiter.take() == []
    assert waiter.stop() == 0  # no thread ran
    assert waiter.join(timeout=0.1) is True
    assert waiter.join() is True
    assert not waiter.is_alive()
    assert waiter.waiting() == 0
    with pytest.raises(IndexError, match="lane 3 of 3"):
        waiter.hand(3, drv.CUevent())
    with pytest.raises(ValueError, match="at least one lane"):
        compiled.NativeWaiter(drv.CUcontext(), 0)
