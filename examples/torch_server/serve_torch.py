"""A PyTorch model behind Starlette, awaited with asyncgraph: the recipe of docs/serving-pytorch.md.

    uvicorn --app-dir examples/torch_server serve_torch:app

The model (4 x ``Linear(1024, 1024)`` + ReLU, fp32) runs on PyTorch's current stream. A
request copies its rows into pinned memory, enqueues the model and a non-blocking copy of the
result into pinned memory, then ``await backend.wait(stream)`` on that stream (looked up once at
start-up): the event loop serves other requests while the GPU computes, and no thread is
involved. ``/v1/mlp/thread``
serves the same model the usual way, ``.cpu()`` in ``asyncio.to_thread``, for comparison.

Endpoints:
    POST /v1/mlp          ``{"x": [[1024 floats], ...]}`` (1 to 4 rows) -> ``{"y": model(x)}``
    POST /v1/mlp/thread   the same, through ``asyncio.to_thread``
    GET  /health          ``{"status": "ok", "in_flight": ...}``
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import asyncgraph as ag

WIDTH, LAYERS, MAX_ROWS = 1024, 4, 4


def make_model(seed: int = 0) -> torch.nn.Module:
    """The served model, on the GPU, in inference mode."""
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda().eval()


class PinnedBuffers:
    """Pinned (page-locked) host tensors for inputs and results, reused across requests:
    allocating pinned memory per request would cost more than the model. Each pair holds
    *rows* rows (a request's most, or a batch's)."""

    def __init__(self, rows: int = MAX_ROWS) -> None:
        self._rows = rows
        self._free: list[tuple[torch.Tensor, torch.Tensor]] = []

    def take(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._free:
            return self._free.pop()
        shape = (self._rows, WIDTH)
        return torch.empty(shape, pin_memory=True), torch.empty(shape, pin_memory=True)

    def give(self, pair: tuple[torch.Tensor, torch.Tensor]) -> None:
        self._free.append(pair)


@asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    async with ag.open_backend("cuda") as backend:
        app.state.backend = backend
        app.state.model = make_model()
        app.state.buffers = PinnedBuffers()
        # The stream the model runs on, looked up once: this service never changes PyTorch's
        # current stream, and the lookup costs about 10 µs a request.
        app.state.stream = torch.cuda.current_stream()
        yield


async def _rows(request: Request) -> np.ndarray[Any, Any]:
    try:
        x = np.asarray(json.loads(await request.body())["x"], dtype=np.float32)
    except (ValueError, KeyError, TypeError):
        raise ValueError('the body must be {"x": [[1024 numbers], ...]}') from None
    if x.ndim != 2 or x.shape[1] != WIDTH or not 1 <= x.shape[0] <= MAX_ROWS:
        raise ValueError(f"x must hold 1 to {MAX_ROWS} rows of {WIDTH} numbers")
    return x


def _bad(error: ValueError) -> JSONResponse:
    return JSONResponse({"error": str(error)}, status_code=400)


async def mlp(request: Request) -> JSONResponse:
    """The model, awaited on PyTorch's stream without blocking the loop or using a thread."""
    try:
        x = await _rows(request)
    except ValueError as error:
        return _bad(error)
    state = request.app.state
    pinned_in, pinned_out = pair = state.buffers.take()
    rows = x.shape[0]
    pinned_in.numpy()[:rows] = x
    with torch.no_grad():
        y = state.model(pinned_in[:rows].cuda(non_blocking=True))
        pinned_out[:rows].copy_(y, non_blocking=True)
    # The loop serves other requests until the GPU finished the model and the copy.
    done = state.backend.wait(state.stream)
    try:
        await asyncio.shield(done)
    except asyncio.CancelledError:
        # The client went away: the copies still run, so the buffers go back once they ran.
        done.add_done_callback(lambda _: state.buffers.give(pair))
        raise
    answer = pinned_out[:rows].numpy().tolist()
    state.buffers.give(pair)
    return JSONResponse({"y": answer})


async def mlp_thread(request: Request) -> JSONResponse:
    """The same model the usual way: ``.cpu()`` blocks, so it runs in a worker thread."""
    try:
        x = await _rows(request)
    except ValueError as error:
        return _bad(error)
    model = request.app.state.model

    def run() -> list[list[float]]:
        with torch.no_grad():
            return model(torch.from_numpy(x).cuda()).cpu().numpy().tolist()  # type: ignore[no-any-return]

    return JSONResponse({"y": await asyncio.to_thread(run)})


async def health(request: Request) -> JSONResponse:
    backend = request.app.state.backend
    return JSONResponse({"status": "ok", "in_flight": backend.outstanding})


app = Starlette(
    routes=[
        Route("/v1/mlp", mlp, methods=["POST"]),
        Route("/v1/mlp/thread", mlp_thread, methods=["POST"]),
        Route("/health", health),
    ],
    lifespan=lifespan,
)
