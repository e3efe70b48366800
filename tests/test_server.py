"""The example service (examples/server) end to end: uvicorn on 127.0.0.1, real HTTP requests.

The server runs in a child process on whichever backend ``auto`` picks (CUDA on a GPU machine,
the host backend in CI), under both of uvicorn's asyncio loops. Set ``ASYNCGRAPH_SERVER_REPORT``
to a directory to keep each load report as JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

import httpx
import pytest

SERVER = Path(__file__).resolve().parent.parent / "examples" / "server"


def _load_module(name: str = "load") -> Any:
    spec = importlib.util.spec_from_file_location(
        f"asyncgraph_example_{name}", SERVER / f"{name}.py"
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {SERVER / f'{name}.py'}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


load = _load_module()


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The example service under uvicorn on a free port of 127.0.0.1; yields its URL."""
    loop: str = request.param
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    # A free port of 127.0.0.1. (Not "--fd" with a socket bound here: uvicorn takes such a
    # socket for a Unix one, so asyncio leaves Nagle's algorithm on and answers wait 40 ms.)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    # "uvicorn app:app --app-dir examples/server"
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(SERVER)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    # --timeout-keep-alive 60: with uvicorn's 5 s, a connection the busy client is slow to reuse
    # can be closed under it.
    command += ["--loop", loop, "--timeout-keep-alive", "60", "--log-level", "warning"]
    command += ["--no-access-log", "app:app"]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # Read the server's output as it comes: a pipe nobody reads fills up (64 KiB), and then the
    # server's loop blocks in write() and every request waits.
    lines: list[str] = []
    reader = threading.Thread(target=_collect, args=(child.stdout, lines), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120  # the first start compiles the kernels
        while True:
            if child.poll() is not None:
                reader.join(10)
                pytest.fail(f"the server exited with {child.returncode}:\n{''.join(lines)}")
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the server did not answer /health within 120 s")
            time.sleep(0.1)
        yield url
    finally:
        # A graceful stop: uvicorn runs the lifespan's exit, which closes the backend.
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            reader.join(10)
            pytest.fail(f"the server did not stop within 60 s:\n{''.join(lines)}")
        reader.join(10)
    output = "".join(lines)
    assert child.returncode == 0, output
    assert "Traceback" not in output, output
    # Nothing per request or per batch: its start and its close, a few lines, are all it says.
    assert len(lines) < 20, output


def _collect(stream: IO[str], lines: list[str]) -> None:
    with stream:
        lines.extend(stream)


def _keep(report: dict[str, Any], loop: str) -> None:
    if directory := os.environ.get("ASYNCGRAPH_SERVER_REPORT"):
        name = f"server-{report['backend'].replace(':', '')}-{loop}.json"
        Path(directory, name).write_text(json.dumps(report, indent=2))


async def test_500_concurrent_requests(server: str, request: pytest.FixtureRequest) -> None:
    report = await load.run_load(server, requests=500)
    print(json.dumps(report, indent=2))
    _keep(report, request.node.callspec.id)
    assert report["errors"] == []
    assert report["ok"] == 500
    assert report["transport_errors"] == 0
    # The backend's own latency, in the unit its key names (as /health names it).
    assert set(report["dispatch_latency_ms"]) == {"p50", "p99"}
    # The loop's turn while the requests were in flight, sampled every 2 ms: some samples,
    # each a wait of zero or more.
    turns = report["loop_turn_ms"]
    assert turns["count"] >= 1, turns
    assert 0.0 <= turns["p50"] <= turns["p99"], turns
    assert report["health_failures"] == []
    # The health endpoint kept answering while the 500 requests were in flight: a loop blocked
    # behind GPU or host work would answer only once they were done. (Counted, not timed; the
    # latencies are in the report.)
    assert report["health_during_load"] >= 2, report["health"]
    # The dense endpoint batches (EXAMPLE_BATCH defaults to on): a request's rows (1 to 4) go
    # to the batcher in one turn of the server's loop, so into one batch, with those of the
    # requests waiting beside it, if any. Most requests have several rows, so a batch has more
    # than one on average however the requests arrive in time.
    assert report["dense_rows_per_batch"] is not None
    assert report["dense_rows_per_batch"] > 1.0


async def test_bad_requests_get_a_clear_answer_and_the_service_goes_on(server: str) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        bad = await client.post("/v1/dense", content=b"{not json")
        assert (bad.status_code, bad.json()) == (400, {"error": "the body must be JSON"})
        bad = await client.post("/v1/dense", json={"x": [[1.0, 2.0]]})
        assert bad.status_code == 400
        assert bad.json() == {"error": "x must be 1 to 64 rows of 256 numbers"}
        bad = await client.post("/v1/saxpy", json={"a": 1.0, "x": [1.0], "y": [1.0, 2.0]})
        assert bad.json() == {"error": "x and y must have the same length, got 1 and 2"}
        good = await client.post("/v1/saxpy", json={"a": 2.0, "x": [1.0, 2.0], "y": [0.5, 0.5]})
        assert good.json() == {"z": [2.5, 4.5]}


def _exchange(url: str, head: str, parts: Iterable[bytes]) -> tuple[int, dict[str, str], Any]:
    """Send a request's *head* and then *parts* of its body on a socket of its own, without
    finishing the body, and read the answer until the server closes the connection: its
    status, headers and JSON body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        for part in parts:
            sock.sendall(part)
        answer = b""
        while chunk := sock.recv(65536):  # a timeout here: the server kept the connection open
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    lines = header_block.decode().splitlines()
    headers = {
        name.strip().lower(): value.strip()
        for name, _, value in (line.partition(":") for line in lines)
    }
    return int(status_line.split()[1]), headers, json.loads(body)


def _post_head(path: str, framing: str) -> str:
    return f"POST {path} HTTP/1.1\nHost: service\nContent-Type: application/json\n{framing}\n"


def test_a_body_larger_than_the_endpoint_takes_gets_413_before_it_is_read(server: str) -> None:
    app = _load_module("app")
    # A Content-Length past the bound: the answer comes though only 8 of its bytes were sent.
    declared = 25_600_000
    status, headers, body = _exchange(
        server, _post_head("/v1/dense", f"Content-Length: {declared}"), [b'{"x": [[']
    )
    assert (status, headers["connection"]) == (413, "close")
    assert body == {
        "error": f"the body must be at most {app.MAX_DENSE_BODY} bytes; this one has {declared}"
    }
    # A chunked body of no declared length: refused once it passes the bound, though it never
    # ended (no last chunk was sent). Its last byte is the one past the bound: uvicorn closes
    # the connection at once, and a connection closed with bytes unread is reset by the
    # system, which can lose the answer on its way.
    payload = b"[" * app.MAX_DENSE_BODY
    pieces = [payload[at : at + 65536] for at in range(0, len(payload), 65536)] + [b"]"]
    chunks = [b"%x\r\n%b\r\n" % (len(piece), piece) for piece in pieces]
    status, headers, body = _exchange(
        server, _post_head("/v1/dense", "Transfer-Encoding: chunked"), chunks
    )
    assert (status, headers["connection"]) == (413, "close")
    assert body == {"error": f"the body must be at most {app.MAX_DENSE_BODY} bytes"}
    # The largest valid request stays well within the bound (every number in full, indented).
    largest = {"x": [[-1.1754943508222875e-38] * app.FEATURES] * app.MAX_ROWS}
    assert len(json.dumps(largest, indent=2)) < app.MAX_DENSE_BODY
    with httpx.Client(base_url=server) as client:
        good = client.post("/v1/dense", content=json.dumps(largest, indent=2).encode())
    assert good.status_code == 200, good.text


async def test_a_body_nested_too_deep_to_parse_gets_400(server: str) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    async with httpx.AsyncClient(base_url=server) as client:
        for path, body in (("/v1/dense", deep), ("/v1/saxpy", b'{"a": 2.0, "x": ' + deep + b"}")):
            bad = await client.post(path, content=body)
            assert (bad.status_code, bad.json()) == (400, {"error": "the body must be JSON"})
        good = await client.post("/v1/saxpy", json={"a": 2.0, "x": [1.0], "y": [0.5]})
        assert good.json() == {"z": [2.5]}


async def test_health_keeps_the_loop_turns_of_a_window_and_refuses_a_bad_one(server: str) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        everything = (await client.get("/health")).json()["loop_turn_ms"]
        ahead = {"since": time.time() + 3600}
        future = (await client.get("/health", params=ahead)).json()["loop_turn_ms"]
        bad = await client.get("/health", params={"since": "yesterday"})
    assert everything["count"] >= 1  # sampled every 2 ms since the service started
    assert future["count"] == 0
    assert bad.status_code == 400
    assert bad.json() == {"error": "since and until are times in seconds, as time.time() gives"}


async def test_metrics_endpoint(server: str) -> None:
    pytest.importorskip("prometheus_client")
    async with httpx.AsyncClient(base_url=server) as client:
        await client.post("/v1/saxpy", json={"a": 1.0, "x": [1.0], "y": [1.0]})
        health = (await client.get("/health")).json()
        text = (await client.get("/metrics")).text
    backend = health["backend"]
    assert f'asyncgraph_dispatches_total{{backend="{backend}"}}' in text
    assert "asyncgraph_completion_latency_seconds_bucket" in text


async def test_numbers_beyond_float32_get_400_and_overflowing_results_422(server: str) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        # Each of these became inf in float32, which the JSON encoder refused: a 500.
        for body in (
            {"a": 1e300, "x": [1.0], "y": [1.0]},
            {"a": 10**400, "x": [1.0], "y": [1.0]},
            {"a": 2.0, "x": [1e39], "y": [1.0]},
            {"a": 2.0, "x": [1.0], "y": [float("-inf")]},
            {"a": float("nan"), "x": [1.0], "y": [1.0]},
        ):
            bad = await client.post(
                "/v1/saxpy", content=json.dumps(body).encode(), headers={"content-type": "json"}
            )
            assert bad.status_code == 400, (body, bad.text)
            assert "finite number" in bad.json()["error"]
        bad = await client.post("/v1/dense", json={"x": [[1e39] * 256]})
        assert bad.status_code == 400
        assert bad.json()["error"].startswith("x must hold finite numbers within float32's range")
        # Finite inputs whose result overflows float32.
        over = await client.post("/v1/saxpy", json={"a": 3e38, "x": [10.0], "y": [0.0]})
        assert (over.status_code, over.json()) == (
            422,
            {"error": "the result overflows float32; scale the inputs down"},
        )
        good = await client.post("/v1/saxpy", json={"a": 2.0, "x": [1.0], "y": [0.5]})
        assert good.json() == {"z": [2.5]}


async def test_load_counts_requests_that_get_no_answer() -> None:
    answered = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal answered
        if request.url.path == "/v1/saxpy" and answered:
            raise httpx.ConnectError("connection refused", request=request)
        answered += 1
        return httpx.Response(200, json={"z": [2.5]})

    tally = load.Tally()
    async with httpx.AsyncClient(
        base_url="http://service", transport=httpx.MockTransport(handler)
    ) as client:
        want = load.np.asarray([2.5])
        body = {"a": 2.0, "x": [1.0], "y": [0.5]}
        await load.request_and_check(client, tally, "/v1/saxpy", body, want)
        await load.request_and_check(client, tally, "/v1/saxpy", body, want)
    assert (tally.ok, tally.transport_errors, len(tally.latencies)) == (1, 1, 1)
    assert tally.errors == ["/v1/saxpy: no answer: ConnectError('connection refused')"]


async def test_at_most_max_active_requests_read_their_bodies_while_any_number_wait_for_the_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import anyio

    app = _load_module("app")
    monkeypatch.setenv("EXAMPLE_MAX_ACTIVE", "3")
    reading: list[int] = []
    most = 0

    async def stream() -> AsyncIterator[bytes]:
        nonlocal most
        reading.append(1)
        most = max(most, len(reading))
        await anyio.sleep(0.01)
        reading.pop()
        yield b'{"a": 2.0, "x": [1.0, 2.0], "y": [0.5, 0.5]}'

    class Backend:
        """Holds every dispatch until released; *all_held* once ten are held."""

        def __init__(self) -> None:
            self.held = 0
            self.all_held = anyio.Event()
            self.release = anyio.Event()

        def dispatch(self, kernel: Any, *args: Any, **launch: Any) -> Any:
            x, y, _, a = args[:4]

            async def run() -> tuple[Any]:
                self.held += 1
                if self.held == 10:
                    self.all_held.set()
                await self.release.wait()
                return (a * x + y,)

            return run()

    backend = Backend()
    state = SimpleNamespace(active=anyio.Semaphore(app.max_active()), backend=backend)
    request = SimpleNamespace(state=state, headers={}, stream=stream)
    answers: list[Any] = []

    async def one() -> None:
        answers.append(await app.saxpy(request))

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(one)
        with anyio.fail_after(10):
            await backend.all_held.wait()  # all ten wait for the GPU at once ...
        assert most == 3  # ... though at most three read their bodies at once
        backend.release.set()
    assert [json.loads(a.body) for a in answers] == [{"z": [2.5, 4.5]}] * 10
    for bad in ("0", "-2", "four"):
        monkeypatch.setenv("EXAMPLE_MAX_ACTIVE", bad)
        with pytest.raises(SystemExit, match="EXAMPLE_MAX_ACTIVE"):
            app.max_active()


def test_the_batch_delay_is_read_in_microseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    app = _load_module("app")
    monkeypatch.delenv("EXAMPLE_BATCH_DELAY_US", raising=False)
    assert app.batch_delay() == 0.0005
    monkeypatch.setenv("EXAMPLE_BATCH_DELAY_US", "0")
    assert app.batch_delay() == 0.0
    for bad in ("-1", "soon", "2e6"):
        monkeypatch.setenv("EXAMPLE_BATCH_DELAY_US", bad)
        with pytest.raises(SystemExit, match="EXAMPLE_BATCH_DELAY_US"):
            app.batch_delay()


async def test_a_request_names_its_class_and_queue_deadline_in_headers(server: str) -> None:
    body = {"a": 2.0, "x": [1.0, 2.0], "y": [0.5, 0.5]}
    async with httpx.AsyncClient(base_url=server) as client:
        steered = {"x-priority": "high", "x-queue-timeout": "5"}
        good = await client.post("/v1/saxpy", json=body, headers=steered)
        assert good.json() == {"z": [2.5, 4.5]}
        bad = await client.post("/v1/saxpy", json=body, headers={"x-priority": "urgent"})
        assert (bad.status_code, bad.json()) == (
            422,
            {"error": "dispatch(): priority='urgent'; pass 'high', 'normal' or 'low'"},
        )
        bad = await client.post("/v1/saxpy", json=body, headers={"x-queue-timeout": "soon"})
        assert (bad.status_code, bad.json()) == (
            400,
            {"error": "x-queue-timeout must be a number of seconds"},
        )
