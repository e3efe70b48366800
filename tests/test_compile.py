"""The NVRTC compile cache, without a GPU (NVRTC compiles for an architecture, not a device)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import structlog

import asyncgraph as ag
from asyncgraph._cuda.launch._nvrtc import KernelCompiler, default_cache_dir
from asyncgraph._demo._demo import BLOCK_SUM, SAXPY

pytestmark = pytest.mark.nvrtc  # skipped, saying what to install, where NVRTC is missing


def _entries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and "entries" in p.parts]


def test_compiles_and_caches_in_memory_and_on_disk(tmp_path: Path) -> None:
    root = tmp_path / "kernels"
    compiler = KernelCompiler(root)
    cubin = compiler.cubin(SAXPY, "sm_90")
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image
    assert (compiler.hits, compiler.misses) == (0, 1)
    assert compiler.cubin(SAXPY, "sm_90") == cubin
    assert (compiler.hits, compiler.misses) == (1, 1)
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    fresh = KernelCompiler(root)  # another process, same directory
    assert fresh.cubin(SAXPY, "sm_90") == cubin
    assert (fresh.hits, fresh.misses) == (1, 0)
    # Architecture and source are part of the key.
    assert fresh.cubin(SAXPY, "sm_80") != cubin
    assert fresh.cubin(BLOCK_SUM, "sm_90") != cubin
    assert fresh.misses == 2


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_entry_is_detected_and_recompiled(tmp_path: Path, damage: str) -> None:
    root = tmp_path / "kernels"
    good = KernelCompiler(root).cubin(SAXPY, "sm_90")
    (entry,) = _entries(root)
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-100] ^= 0xFF
    entry.write_bytes(bytes(data))
    compiler = KernelCompiler(root)
    with structlog.testing.capture_logs() as logs:
        assert compiler.cubin(SAXPY, "sm_90") == good
    assert (compiler.corrupt, compiler.misses, compiler.hits) == (1, 1, 0)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["compile.cache_corrupt"]
    # The rewritten entry is good again.
    again = KernelCompiler(root)
    assert again.cubin(SAXPY, "sm_90") == good
    assert (again.hits, again.corrupt) == (1, 0)


def test_compile_errors_carry_the_nvrtc_log(tmp_path: Path) -> None:
    bad = ag.Kernel('extern "C" __global__ void bad(float* x) { x[0] = undefined_name; }', "bad")
    compiler = KernelCompiler(tmp_path / "k")
    with pytest.raises(ag.CompileError, match=r"^kernel 'bad' failed to compile:\n") as info:
        compiler.cubin(bad, "sm_90")
    assert 'identifier "undefined_name" is undefined' in info.value.log
    assert "\x00" not in info.value.log
    assert info.value.kernel == "bad"
    opts = ag.Kernel(SAXPY.source, "saxpy", options={"fast_math_please": True})
    with pytest.raises(ag.CompileError, match=r"invalid NVRTC options"):
        compiler.cubin(opts, "sm_90")


SINE = ag.Kernel(
    r"""
extern "C" __global__ void sine(const float* x, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = sinf(x[i]);
}
""",
    "sine",
)


def test_options_change_the_cubin(tmp_path: Path) -> None:
    compiler = KernelCompiler(tmp_path / "k")
    plain = compiler.cubin(SINE, "sm_90")
    entries = len(_entries(tmp_path / "k"))
    fast = ag.Kernel(SINE.source, "sine", options={"use_fast_math": True})
    # Fast math compiles sinf to the hardware's approximation: other code, so another cubin,
    # compiled anew (the options are part of the cache key) and stored beside the first.
    assert compiler.cubin(fast, "sm_90") != plain
    assert (compiler.hits, compiler.misses) == (0, 2)
    assert len(_entries(tmp_path / "k")) == 2 * entries


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASYNCGRAPH_CACHE_DIR", str(tmp_path / "explicit"))
    assert default_cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("ASYNCGRAPH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "asyncgraph" / "kernels"
    assert KernelCompiler(False).cache_dir is None
