"""Compiling kernels with NVRTC through ``cuda.core``, cached in memory and on disk.

The cache key is ``cuda.core``'s own (``make_program_cache_key``): source, options (the
device's architecture among them), target and the NVRTC version. Entries live in memory for the
process and on disk in ``cuda.core``'s ``FileStreamProgramCache`` (atomic writes, LRU eviction),
under ``$ASYNCGRAPH_CACHE_DIR`` or ``~/.cache/asyncgraph/kernels`` (``$XDG_CACHE_HOME`` is
honoured). The directory is created owner-only (0700).

``FileStreamProgramCache`` stores raw cubins; asyncgraph frames each entry with a magic and a
SHA-256 of the cubin, so a truncated or altered entry is detected, removed and recompiled —
never loaded.

Compilation takes tens of milliseconds: backends run it in a worker thread, never on the loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncgraph._runtime._exceptions import CompileError
from asyncgraph._runtime._telemetry import logger

if TYPE_CHECKING:
    from asyncgraph._args._kernel import Kernel

__all__ = ("KernelCompiler", "default_cache_dir")

_MAGIC = b"AGCUBIN1"
# cuda.core 1.2.0 raises from the finaliser of a Program whose compilation failed (fixed in
# 1.2.2); such Programs are kept here instead of being finalised. One per failing kernel.
_FAILED_PROGRAMS: list[Any] = []
_DIGEST = 32


def default_cache_dir() -> Path:
    """``$ASYNCGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/asyncgraph/kernels``, else
    ``~/.cache/asyncgraph/kernels``."""
    explicit = os.environ.get("ASYNCGRAPH_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "asyncgraph" / "kernels"


def _frame(payload: bytes) -> bytes:
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def _unframe(data: bytes) -> bytes | None:
    """The payload of a framed entry, or ``None`` when the entry is damaged."""
    head = len(_MAGIC) + _DIGEST
    if len(data) <= head or not data.startswith(_MAGIC):
        return None
    digest, payload = data[len(_MAGIC) : head], data[head:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    return payload


class KernelCompiler:
    """Compiles kernels to cubins for one architecture, with the memory and disk caches.

    Thread-safe: backends call :meth:`cubin` from worker threads.

    Args:
        cache_dir: the disk cache directory; ``None`` for the default; ``False`` for none.
    """

    def __init__(self, cache_dir: Path | bool | None = None) -> None:
        self._lock = threading.Lock()
        self._memory: dict[bytes, bytes] = {}
        self._disk: Any = None
        self.cache_dir: Path | None = None
        if cache_dir is not False:
            path = default_cache_dir() if cache_dir is None or cache_dir is True else cache_dir
            self.cache_dir = Path(path)
        self.hits = 0
        self.misses = 0
        self.corrupt = 0

    def _open_disk(self) -> Any:
        if self._disk is None and self.cache_dir is not None:
            from cuda.core.utils import FileStreamProgramCache

            self.cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.cache_dir, 0o700)
            self._disk = FileStreamProgramCache(self.cache_dir)
        return self._disk

    def key(self, kernel: Kernel, arch: str) -> tuple[bytes, Any]:
        """The cache key of *kernel* for *arch* (``"sm_90"``) and its ``ProgramOptions``."""
        from cuda.core import ProgramOptions
        from cuda.core.utils import make_program_cache_key

        try:
            options = ProgramOptions(arch=arch, **kernel.options)
        except TypeError as exc:
            raise CompileError(
                kernel.name, f"invalid NVRTC options {kernel.options!r}: {exc}"
            ) from None
        key = make_program_cache_key(
            code=kernel.source, code_type="c++", options=options, target_type="cubin"
        )
        return key, options

    def cubin(self, kernel: Kernel, arch: str) -> bytes:
        """The cubin of *kernel* for *arch*, from a cache or compiled now.

        Raises:
            CompileError: NVRTC failed; the error carries its log.
        """
        key, options = self.key(kernel, arch)
        with self._lock:
            cached = self._memory.get(key)
            if cached is not None:
                self.hits += 1
                return cached
        disk = self._open_disk()
        if disk is not None:
            data = disk.get(key)
            if data is not None:
                payload = _unframe(bytes(data))
                if payload is not None:
                    with self._lock:
                        self._memory[key] = payload
                        self.hits += 1
                    return payload
                self.corrupt += 1
                logger.warning(
                    "compile.cache_corrupt",
                    kernel=kernel.name,
                    path=str(self.cache_dir),
                    action="recompiling",
                )
                with contextlib.suppress(KeyError):
                    del disk[key]
        payload = self._compile(kernel, options)
        with self._lock:
            self._memory[key] = payload
            self.misses += 1
        if disk is not None:
            disk[key] = _frame(payload)
        return payload

    @staticmethod
    def _compile(kernel: Kernel, options: Any) -> bytes:
        from cuda.core import Program

        log = io.StringIO()
        program = None
        failed = True
        try:
            program = Program(kernel.source, code_type="c++", options=options)
            code = program.compile("cubin", logs=log)
            failed = False
        except Exception as exc:
            text = log.getvalue().replace("\x00", "").strip()
            if not text:
                message = str(exc)
                marker = "compilation log:"
                text = message.split(marker, 1)[1] if marker in message else message
                text = text.replace("\x00", "").strip()
            raise CompileError(kernel.name, text) from exc
        finally:
            if program is not None:
                if failed:
                    _FAILED_PROGRAMS.append(program)
                else:
                    with contextlib.suppress(Exception):
                        program.close()
        text = log.getvalue().replace("\x00", "").strip()
        if text:
            logger.info("compile.log", kernel=kernel.name, log=text)
        return bytes(code.code)


def load_kernel(kernel: Kernel, cubin: bytes) -> Any:
    """Load *cubin* and return ``cuda.core``'s Kernel for *kernel* (needs a current context).

    Raises:
        CompileError: the module has no kernel of that name (declare it ``extern "C"``).
    """
    from cuda.bindings import driver
    from cuda.core import ObjectCode

    module = ObjectCode.from_cubin(cubin, name=kernel.name)
    try:
        loaded = module.get_kernel(kernel.name)
    except Exception as exc:
        raise CompileError(
            kernel.name,
            f"the compiled module has no kernel named {kernel.name!r}; declare it "
            f'extern "C" so its name is not mangled ({exc})',
        ) from exc
    # Load the function into the current context now. With CUDA's lazy loading it would load at
    # its first launch, and loading waits for every kernel running on the device (measured on
    # an NVIDIA H100 80GB HBM3: a first launch waited 98 ms behind a kernel on another stream).
    driver.cuKernelGetFunction(driver.CUkernel(int(loaded.handle)))
    return loaded
