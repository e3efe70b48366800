"""A small GPU service: asyncgraph behind Starlette, served by uvicorn.

    uvicorn --app-dir examples/server app:app

The backend opens in the application's lifespan (CUDA where a GPU is present, else the host
backend; ``ASYNCGRAPH_DEVICE`` forces one), kernels are declared at module level, and the model's
weights are uploaded once and stay resident for every request. The event loop keeps serving
while the GPU computes, so ``/health`` answers promptly under load.

The dense endpoint batches: the rows of concurrent requests go to the GPU in one dispatch of
up to 64 rows (``ag.batcher``, its default adaptive policy: a batch launches as soon as none is
in flight, so a lone request waits for nothing; else when the one in flight completes, when it
is full, or ``EXAMPLE_BATCH_DELAY_US`` microseconds, 500 by default, after its first row).
``EXAMPLE_BATCH=0`` dispatches each request on its own instead, to compare; ``/health`` reports
the batches, their rows and why they launched (``docs/batching.md``).

At most ``EXAMPLE_MAX_ACTIVE`` requests (default 4) read and check their bodies at once (JSON
and numpy, on the event loop); the others wait their turn before any of their work starts.
asyncio's loop accepts every waiting connection in one callback: without a bound, hundreds of
handlers share each loop iteration and every completed dispatch waits behind all of them
(``docs/serving.md``). Waiting for the GPU holds no turn: it costs the loop nothing, and the
batcher needs the rows of many requests waiting together to fill its batches. A request
writes its answer as soon as its result arrives; the results a loop iteration hands over are
bounded already (a batch's rows, the completions of one drain).

A body is read only up to the largest the endpoint takes (its most numbers, each written in up
to ``NUMBER_BYTES`` bytes): a larger one gets 413 before it is read whole, at once when its
``Content-Length`` says so, else as soon as the bytes read pass the bound (a chunked body). A
body that does not parse as JSON gets 400, one nested too deep for the parser included.

Endpoints:
    POST /v1/dense   ``{"x": [[256 floats], ...]}`` (1 to 64 rows) -> ``{"y": relu(x @ W + b)}``
    POST /v1/saxpy   ``{"a": 2.0, "x": [...], "y": [...]}`` -> ``{"z": a * x + y}``
    GET  /v1/model   the weights ``W`` and ``b``, for clients that check answers
    GET  /health     ``{"status": "ok", ...}`` with the backend's in-flight count, and the
                     loop's turn (``loop_turn_ms``: how long a callback another thread
                     schedules every 2 ms waits to run; ``?since=&until=`` in ``time.time()``
                     seconds keeps the samples of that window): the floor under any
                     completion's delivery
    GET  /metrics    Prometheus metrics of the backend (needs ``asyncgraph[prometheus]``)
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import attrs
import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import asyncgraph as ag

Array = np.ndarray[Any, Any]

FEATURES = 256
MAX_ROWS = 64
MAX_SAXPY = 1 << 20
BLOCK = 256
FLOAT32_MAX = float(np.finfo(np.float32).max)
# The most bytes a number of a valid request takes in its body, with its separator and
# indentation: a float32 in full is at most 23 characters ("-1.1754943508222875e-38"), an
# integer within float32's range 39 digits; json.dumps(indent=2) adds up to 8.
NUMBER_BYTES = 48
# The largest body each endpoint takes: its most numbers, and room for the keys and brackets.
MAX_DENSE_BODY = 4096 + MAX_ROWS * FEATURES * NUMBER_BYTES
MAX_SAXPY_BODY = 4096 + (2 * MAX_SAXPY + 1) * NUMBER_BYTES

# The dense layer for a batch of rows, in the argument order ag.batcher calls it: the stacked
# rows, the output, the shared arguments (weights, bias, features), then the number of rows.
# A request dispatched on its own (EXAMPLE_BATCH=0) calls it the same way with its own rows.
DENSE_SRC = r"""
extern "C" __global__ void dense_relu(const float* x, float* y, const float* w,
                                      const float* b, int features, int rows)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * features) return;
    int row = i / features, col = i % features;
    float acc = b[col];
    for (int k = 0; k < features; ++k) acc += x[row * features + k] * w[k * features + col];
    y[i] = acc > 0.0f ? acc : 0.0f;
}
"""


def _dense_relu(x: Array, y: Array, w: Array, b: Array, f: np.int32, rows: np.int32) -> None:
    n, m = int(rows), int(f)
    np.maximum(x.reshape(-1, m)[:n] @ w.reshape(m, m) + b, 0.0, out=y.reshape(-1, m)[:n])


DENSE = ag.Kernel(DENSE_SRC, "dense_relu", host=_dense_relu)

SAXPY_SRC = r"""
extern "C" __global__ void saxpy(const float* x, const float* y, float* z, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = a * x[i] + y[i];
}
"""


def _saxpy(x: Array, y: Array, z: Array, a: np.float32, n: np.int32) -> None:
    np.add(a * x[: int(n)], y[: int(n)], out=z[: int(n)])


SAXPY = ag.Kernel(SAXPY_SRC, "saxpy", host=_saxpy)


class LoopTurns:
    """How long something from outside the loop waits for it: every *every* seconds a thread
    schedules a callback with ``call_soon_threadsafe`` and keeps, with the wall-clock time, how
    long it waited to run; the latest *keep* samples. A completed dispatch is news from outside
    too (the GPU), so this is the floor under its delivery: the loop's own turn, whatever the
    backend does. (A callback scheduled from the loop itself, after a timer, would sample only
    the moments the loop is free enough to run its timers on time.)"""

    def __init__(self, every: float = 0.002, keep: int = 50_000) -> None:
        self.every = every
        self.samples: deque[tuple[float, float]] = deque(maxlen=keep)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._run, args=(loop,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self._stop.wait(self.every):
            try:
                loop.call_soon_threadsafe(self._ran, time.perf_counter())
            except RuntimeError:  # the loop closed
                return

    def _ran(self, asked: float) -> None:
        self.samples.append((time.time(), time.perf_counter() - asked))

    def percentiles(self, since: float = 0.0, until: float = math.inf) -> dict[str, float | None]:
        """p50 and p99 (ms; ``None`` without samples) and the count of the samples taken
        between *since* and *until*."""
        waits = [wait for at, wait in self.samples if since <= at <= until]
        if not waits:
            return {"count": 0, "p50": None, "p99": None}
        p50, p99 = np.percentile(np.array(waits) * 1e3, [50, 99])
        return {"count": len(waits), "p50": float(p50), "p99": float(p99)}


def make_weights(seed: int = 7) -> tuple[Array, Array]:
    """The model: a FEATURES x FEATURES weight matrix and a bias, float32."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((FEATURES, FEATURES)) / np.sqrt(FEATURES)).astype(np.float32)
    b = (0.1 * rng.standard_normal(FEATURES)).astype(np.float32)
    return w, b


class BadRequest(Exception):
    """The request's body is not what the endpoint takes; the message says what is."""


class TooLarge(Exception):
    """The request's body is larger than the largest the endpoint takes; it was not read whole."""


class Unprocessable(Exception):
    """The request was valid but its answer is not (a result that overflows float32)."""


def _float32s(value: object, what: str, shape: str) -> Array:
    """*value* as a float32 array of finite numbers, else :class:`BadRequest`."""
    try:
        # A number beyond float32's range becomes inf here; the check below refuses it.
        with np.errstate(over="ignore"):
            array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError, OverflowError):
        raise BadRequest(f"{what} must be {shape}") from None
    if not np.isfinite(array).all():
        raise BadRequest(
            f"{what} must hold finite numbers within float32's range (|v| <= {FLOAT32_MAX:.4g})"
        )
    return array


def _vector(value: object, what: str, limit: int) -> Array:
    array = _float32s(value, what, "a list of numbers")
    if array.ndim != 1 or not 1 <= array.size <= limit:
        raise BadRequest(f"{what} must be a flat list of 1 to {limit} numbers")
    return array


def _finite(result: Array) -> Array:
    """*result*, if every value is finite; JSON has no inf or NaN to answer with."""
    if not np.isfinite(result).all():
        raise Unprocessable("the result overflows float32; scale the inputs down")
    return result


async def _body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object, its body read up to *limit* bytes.

    A body larger than *limit* raises :class:`TooLarge` before it is read whole: at once when
    its ``Content-Length`` says so, else (a chunked body) as soon as the bytes read pass it.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body must be at most {limit} bytes; this one has {declared}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body must be at most {limit} bytes")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, RecursionError):  # RecursionError: arrays or objects nested too deep
        raise BadRequest("the body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def max_active() -> int:
    """``EXAMPLE_MAX_ACTIVE``: how many requests read their bodies at once (default 4)."""
    value = os.environ.get("EXAMPLE_MAX_ACTIVE", "4")
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise SystemExit(f"EXAMPLE_MAX_ACTIVE={value!r}; set it to a positive whole number")
    return limit


def batch_delay() -> float:
    """``EXAMPLE_BATCH_DELAY_US`` (default 500) in seconds: how long a batch may wait behind
    one in flight."""
    value = os.environ.get("EXAMPLE_BATCH_DELAY_US", "500")
    try:
        delay = float(value)
    except ValueError:
        delay = -1.0
    if not 0 <= delay <= 1e6:
        raise SystemExit(f"EXAMPLE_BATCH_DELAY_US={value!r}; set it to 0 to 1000000 microseconds")
    return delay / 1e6


async def dense(request: Request) -> Response:
    """relu(x @ W + b) for each row of x, with W and b resident on the backend."""
    state = request.state
    async with state.active:  # the request's own work: reading and checking the body
        x = _dense_input(await _body(request, MAX_DENSE_BODY))
    batcher: ag.Batcher | None = state.dense_rows
    if batcher is not None:
        y = await _batched(batcher, x)
    else:
        rows = x.shape[0]
        (y,) = await state.backend.dispatch(
            DENSE,
            x,
            ag.Out(x.shape, np.float32),
            state.weights,
            state.bias,
            np.int32(FEATURES),
            np.int32(rows),
            grid=(rows * FEATURES + BLOCK - 1) // BLOCK,
            block=BLOCK,
        )
    return JSONResponse({"y": _finite(y).tolist()})


def _dense_input(body: dict[str, Any]) -> Array:
    x = _float32s(body.get("x"), "x", "a list of rows of numbers")
    if x.ndim != 2 or x.shape[1] != FEATURES or not 1 <= x.shape[0] <= MAX_ROWS:
        raise BadRequest(f"x must be 1 to {MAX_ROWS} rows of {FEATURES} numbers")
    return x


async def _batched(batcher: ag.Batcher, x: Array) -> Array:
    """The rows of *x* through the batcher: one row in one call (dispatched at once when the
    batcher is idle), several in one ``many()`` call, which puts them in one batch."""
    if len(x) == 1:
        (y,) = await batcher(x[0])
        return y[None]
    (ys,) = await batcher.many(x)
    return ys


async def saxpy(request: Request) -> Response:
    """a * x + y, elementwise."""
    state = request.state
    async with state.active:  # the request's own work: reading and checking the body
        x, y, a = _saxpy_input(await _body(request, MAX_SAXPY_BODY))
    n = x.size
    (z,) = await state.backend.dispatch(
        SAXPY,
        x,
        y,
        ag.Out(n, np.float32),
        np.float32(a),
        np.int32(n),
        grid=(n + BLOCK - 1) // BLOCK,
        block=BLOCK,
        **_steering(request),
    )
    return JSONResponse({"z": _finite(z).tolist()})


def _steering(request: Request) -> dict[str, Any]:
    """The request's class and queue deadline (docs/jobs.md): headers ``x-priority`` (high,
    normal or low; asyncgraph refuses others with a 422) and ``x-queue-timeout`` (seconds a
    dispatch may wait for a slot; past it the answer is a 503). A disconnect that cancels the
    handler withdraws its dispatch if it is still queued."""
    steer: dict[str, Any] = {"priority": request.headers.get("x-priority")}
    timeout = request.headers.get("x-queue-timeout")
    if timeout is not None:
        try:
            steer["queue_timeout"] = float(timeout)
        except ValueError:
            raise BadRequest("x-queue-timeout must be a number of seconds") from None
    return steer


def _saxpy_input(body: dict[str, Any]) -> tuple[Array, Array, float]:
    a = body.get("a")
    if not isinstance(a, int | float) or isinstance(a, bool):
        raise BadRequest("a must be a number")
    # (abs() first: an int too large for a float would make isfinite() raise.)
    if abs(a) > FLOAT32_MAX or not math.isfinite(a):
        raise BadRequest(
            f"a must be a finite number within float32's range (|a| <= {FLOAT32_MAX:.4g})"
        )
    x = _vector(body.get("x"), "x", MAX_SAXPY)
    y = _vector(body.get("y"), "y", MAX_SAXPY)
    if x.size != y.size:
        raise BadRequest(f"x and y must have the same length, got {x.size} and {y.size}")
    return x, y, float(a)


async def model(request: Request) -> Response:
    """The weights, so clients can check answers."""
    w, b = request.state.host_weights
    return JSONResponse({"w": w.tolist(), "b": b.tolist()})


async def health(request: Request) -> Response:
    """Answers at once, whatever the GPU is doing."""
    backend: ag.Backend = request.state.backend
    turns: LoopTurns = request.state.loop_turns
    try:
        window = {k: float(v) for k, v in request.query_params.items() if k in ("since", "until")}
    except ValueError:
        raise BadRequest("since and until are times in seconds, as time.time() gives") from None
    snapshot = backend.telemetry.snapshot()
    latency = snapshot.completion_latency
    dense_rows: ag.Batcher | None = request.state.dense_rows
    batched = dense_rows.statistics() if dense_rows is not None else None
    return JSONResponse(
        {
            "status": "ok",
            "backend": backend.name,
            "in_flight": snapshot.in_flight,
            "queued": snapshot.queued,
            "dispatches": snapshot.dispatches,
            "dense_batches": batched.batches if batched is not None else None,
            "dense_batched_rows": batched.items if batched is not None else None,
            "dense_pending": batched.pending if batched is not None else None,
            "dense_in_flight": batched.in_flight if batched is not None else None,
            "dense_launched": attrs.asdict(batched.launched) if batched is not None else None,
            "dispatch_latency_ms": {
                "p50": 1e3 * latency.quantile(0.5),
                "p99": 1e3 * latency.quantile(0.99),
            },
            "loop_turn_ms": turns.percentiles(**window),
        }
    )


async def metrics(request: Request) -> Response:
    """The backend's telemetry in Prometheus' text format."""
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        from asyncgraph.prometheus import BackendCollector
    except ImportError:
        return JSONResponse(
            {"error": "metrics need prometheus-client: pip install 'asyncgraph[prometheus]'"},
            status_code=501,
        )
    registry = CollectorRegistry()
    registry.register(BackendCollector(request.state.backend))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def bad_request(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=400)


async def too_large(request: Request, exc: Exception) -> Response:
    # The rest of the body was never read: close the connection rather than read it to reuse it.
    return JSONResponse({"error": str(exc)}, status_code=413, headers={"connection": "close"})


async def unprocessable(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=422)


async def busy(request: Request, exc: Exception) -> Response:
    # The dispatch waited its queue deadline for a slot and was withdrawn: nothing ran.
    return JSONResponse({"error": str(exc)}, status_code=503, headers={"retry-after": "1"})


async def refused(request: Request, exc: Exception) -> Response:
    # asyncgraph validated the dispatch and started nothing; the message says what was wrong.
    return JSONResponse({"error": str(exc)}, status_code=422)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
    """Open the backend, upload the weights, compile the kernels; close it all at shutdown."""
    active = anyio.Semaphore(max_active())
    async with ag.open_backend(os.environ.get("ASYNCGRAPH_DEVICE", "auto")) as backend:
        w, b = make_weights()
        weights = await backend.upload(w)
        bias = await backend.upload(b)
        # Compile both kernels before the first request arrives.
        one = np.zeros((1, FEATURES), np.float32)
        await backend.dispatch(
            DENSE, one, ag.Out(one.shape, np.float32), weights, bias, np.int32(FEATURES),
            np.int32(1), grid=1, block=BLOCK,
        )  # fmt: skip
        await backend.dispatch(
            SAXPY, one[0], one[0], ag.Out(FEATURES, np.float32), np.float32(1),
            np.int32(FEATURES), grid=1, block=BLOCK,
        )  # fmt: skip
        dense_rows = None
        if os.environ.get("EXAMPLE_BATCH", "1") != "0":
            dense_rows = ag.batcher(
                backend, DENSE,
                inputs=[ag.Row((FEATURES,), np.float32)],
                outputs=[ag.Row((FEATURES,), np.float32)],
                shared=(weights, bias, np.int32(FEATURES)),
                launch=lambda n: ((n * FEATURES + BLOCK - 1) // BLOCK, BLOCK),
                max_size=MAX_ROWS, max_delay=batch_delay(),
            )  # fmt: skip
        turns = LoopTurns()
        turns.start(asyncio.get_running_loop())
        try:
            yield {
                "dense_rows": dense_rows,
                "backend": backend,
                "weights": weights,
                "bias": bias,
                "host_weights": (w, b),
                "active": active,
                "loop_turns": turns,
            }
        finally:
            turns.stop()


app = Starlette(
    routes=[
        Route("/v1/dense", dense, methods=["POST"]),
        Route("/v1/saxpy", saxpy, methods=["POST"]),
        Route("/v1/model", model),
        Route("/health", health),
        Route("/metrics", metrics),
    ],
    exception_handlers={
        BadRequest: bad_request,
        TooLarge: too_large,
        Unprocessable: unprocessable,
        ag.DispatchError: refused,
        ag.QueueTimeoutError: busy,
    },
    lifespan=lifespan,
)
