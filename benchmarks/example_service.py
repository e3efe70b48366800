"""The example service (examples/server) under uvicorn, loaded by its ``load.py``: the service
rows of ``bench_load.py``.

:func:`serve` starts it on a free port of 127.0.0.1 under the loop asked for and stops it with
SIGINT (so its lifespan closes the backend); :func:`server_rows` runs ``load.py`` against it and
returns its report.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

import httpx

from benchmarks import harness

SERVER = Path(__file__).resolve().parents[1] / "examples" / "server"


def load_module(name: str = "load") -> ModuleType:
    """examples/server/<name>.py, imported from its file (it is no package)."""
    path = SERVER / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"asyncgraph_example_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def serve(
    loop: str,
    device: str,
    start_timeout: float = 120.0,
    settings: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """The example service under uvicorn (on *loop*) on a free port of 127.0.0.1; yields its URL.

    *settings* are more environment variables for it (``EXAMPLE_BATCH``...). Stopped with
    SIGINT, so the lifespan closes the backend; an unclean stop raises.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(SERVER)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--loop", loop]
    command += ["--timeout-keep-alive", "60", "--log-level", "warning", "--no-access-log"]
    command += ["app:app"]
    env = {**os.environ, **(settings or {}), "ASYNCGRAPH_DEVICE": device}
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    # Read the service's output as it comes: a pipe nobody reads fills up (64 KiB), and then
    # the service's loop blocks in write() and every request waits behind it.
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(child.stdout, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + start_timeout  # the first start compiles the kernels
        while True:
            if child.poll() is not None:
                reader.join(10)
                output = "".join(lines)
                raise SystemExit(f"the example service exited with {child.returncode}:\n{output}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the example service did not answer /health in {start_timeout} s")
            time.sleep(0.1)
        yield url
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            reader.join(10)
            output = "".join(lines)
            raise SystemExit(f"the example service did not stop within 60 s:\n{output}") from None
        reader.join(10)
    output = "".join(lines)
    if child.returncode != 0 or "Traceback" in output:
        raise SystemExit(f"the example service stopped with {child.returncode}:\n{output}")


def _collect(stream: IO[str] | None, lines: list[str]) -> None:
    if stream is not None:
        with stream:
            lines.extend(stream)


def server_rows(
    loops: Sequence[str],
    device: str,
    requests: int,
    clients: int,
    settings: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """``load.py``'s report of the example service under each loop in *loops* (started with
    the environment variables *settings*)."""
    load = load_module()
    reports: dict[str, dict[str, Any]] = {}
    for loop in loops:
        with serve(loop, device, settings=settings) as url:
            report: dict[str, Any] = harness.run(
                load.run_load(url, requests=requests, clients=clients)
            )
        reports[loop] = report
    return reports
