"""The stand-in CUDA driver (``fake_cuda.c``): building it, and the environment that loads it.

A process whose ``LD_LIBRARY_PATH`` starts with :func:`build`'s directory loads the stand-in as
``libcuda.so.1``, so asyncgraph's CUDA backend runs on the CPU (see ``fake_cuda.c`` for what it
does and does not do). The tests and ``benchmarks/bench_core.py`` and ``bench_host_path.py``
start such processes with :func:`environment`; :func:`run_scenario` runs one of the
scenario modules here in such a process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = ("HERE", "build", "environment", "reset", "run_scenario")

HERE = Path(__file__).resolve().parent
_SOURCES = (
    "fake_cuda.c",
    "fake_device.c",
    "fake_memory.c",
    "fake_modules.c",
    "fake_graphs.c",
    "fake_streams.c",
    "fake_names.h",
)


def build(directory: Path | None = None) -> Path:
    """Compile the stand-in into *directory* (by default a temporary one, kept for the sources'
    digest, so it is built once) and return the directory holding ``libcuda.so.1``.

    Raises:
        RuntimeError: not on Linux, or no C compiler (``cc`` or ``gcc``) is found.
    """
    if not sys.platform.startswith("linux"):
        raise RuntimeError("the stand-in driver is built for Linux")
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the stand-in driver with")
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((HERE / name).read_bytes())
    if directory is None:
        directory = Path(tempfile.gettempdir()) / f"asyncgraph-stand-in-{digest.hexdigest()[:16]}"
    library = directory / "libcuda.so.1"
    if library.is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / f"libcuda.so.1.{os.getpid()}"
    command = [compiler, "-shared", "-fPIC", "-pthread", "-O2", "-o", str(partial)]
    subprocess.run([*command, str(HERE / "fake_cuda.c")], check=True)
    partial.replace(library)  # atomic: a concurrent build never loads half a library
    return directory


def environment(
    directory: Path, core: str, complete: str = "instant", streams: str = "immediate"
) -> dict[str, str]:
    """This process's environment, made to load the stand-in in *directory*, with the dispatch
    *core* (``"python"`` or ``"compiled"``), events completing as *complete* says
    (``"instant"``, ``"queries:N"`` or ``"manual"``) and the streams running their work as
    *streams* says (``"immediate"``: when it is enqueued; ``"deferred"``: in order, when the
    stream gets to it, ``fake_streams.c``)."""
    paths = [str(directory), os.environ.get("LD_LIBRARY_PATH", "")]
    return {
        **os.environ,
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in paths if p),
        "ASYNCGRAPH_CORE": core,
        "FAKE_CUDA_COMPLETE": complete,
        "FAKE_CUDA_STREAMS": streams,
    }


def reset(lib: Any) -> None:
    """Start a scenario afresh in a process that loaded the stand-in (*lib*): forget injected
    failures and the fault (``fake_reset``), and the process's poison with it (a real driver
    keeps a process poisoned; the stand-in lets one process run several scenarios)."""
    from asyncgraph._runtime import _poison

    lib.fake_reset()
    _poison.clear()


def run_scenario(
    module: str, core: str, *args: str, streams: str = "immediate", timeout: float = 300
) -> dict[str, Any]:
    """Run ``python -m <module> [args]`` against the stand-in with *core* and its *streams*
    mode; the JSON object its last line of output holds. Skips the test where the stand-in
    cannot be built."""
    import pytest  # only the tests run scenarios

    try:
        directory = build()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=HERE.parent.parent,
        env=environment(directory, core, streams=streams),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    seen["stderr"] = done.stderr
    return seen
