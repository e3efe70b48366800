"""The dense layer and the loads of ``bench_batch.py``: one request's row, two ways to serve it.

- :data:`DENSE_ROWS` is the example service's dense layer (``relu(x @ W + b)``), loaded from
  ``examples/server/app.py``, in the batch form ``ag.batcher`` calls (the stacked rows, the
  output, the weights, the bias, the number of features, the number of rows), with a numpy
  host function, so the script runs on the host backend too. It takes any number of
  features: the benchmark uses 1024 (4 KiB rows).
- :class:`Service` holds the weights (resident on the backend), a pool of input rows and
  their answers computed by numpy in float64, and the ways to serve a row: one dispatch per
  request (:meth:`Service.per_request`) and through a batcher of either launch policy
  (:meth:`Service.batched`, adaptive; :meth:`Service.fixed_delay`). On the stand-in driver,
  which runs no dense layer, the answers are not checked (``checked=False``).
- :class:`BatchFloor` is the floor of batching itself: futures resolved a batch at a time,
  with no work behind them; with a :class:`DispatchFloor`'s release, by one dispatch of a batch
  staged once (what a batcher whose per-item work cost nothing would serve).
  :class:`RowsFloor` adds the rows' own work to that: written into staging and handed out
  (what a batcher whose queue cost nothing would serve).
- :func:`client_load` runs clients that each await one way *rounds* times, optionally burning
  CPU before each request, and checks every answer against numpy after the timed part;
  :func:`in_turns` runs several ways in turns, so that the machine's drift weighs on all alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import asyncgraph as ag
from benchmarks import harness
from benchmarks.bench_load import burn
from benchmarks.example_service import load_module

Array = np.ndarray[Any, Any]
BLOCK = 256

# The example service's dense layer, in the batch form ag.batcher calls (it is the same kernel
# the service dispatches for one request's rows).
DENSE_ROWS: ag.Kernel = load_module("app").DENSE

# A way to serve one row: returns the awaitable of the output rows (None for the floor).
Way = Callable[[Array], Awaitable[tuple[Array, ...] | None]]


class BatchFloor:
    """The floor of any batcher's callers: each call awaits a future of its own, and the
    futures are released together once *size* calls are in: by default resolved on the next
    turn of the loop, with no row copied and nothing dispatched (the answer is ``None``, so
    nothing is checked); with *release*, ``release(futures)`` settles them
    (:meth:`DispatchFloor.release`).

    What 64 clients cost the loop when each request waits for a batch, whatever does the
    work: the per-caller future, its resolution and the client's wake-up.
    """

    def __init__(
        self, size: int, release: Callable[[list[asyncio.Future[None]]], object] | None = None
    ) -> None:
        self._size = size
        self._release = release
        self._futures: list[asyncio.Future[None]] = []

    def __call__(self, x: Array) -> Awaitable[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        futures = self._futures
        futures.append(future)
        if len(futures) >= self._size:
            self._futures = []
            if self._release is None:
                loop.call_soon(_settle, futures)
            else:
                self._release(futures)
        return future


def _settle(futures: list[asyncio.Future[None]], exc: BaseException | None = None) -> None:
    """Resolve each of *futures* still pending (with ``None``, or failed with *exc*)."""
    for future in futures:
        if not future.done():
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)


class DispatchFloor:
    """The floor of batching with the GPU behind it: ``BatchFloor(size, floor.release)``'s
    futures are settled by the completion of one dispatch of the dense layer over *size* rows
    staged once (the service's first rows, in ``pinned_empty`` memory); :meth:`check` compares
    the last result with numpy's.

    What a batcher whose per-item work cost nothing would serve: the callers' futures, one
    dispatch of the batch and the GPU's round trip, with no row written or handed out.
    """

    def __init__(self, service: Service, size: int) -> None:
        self._service = service
        self._size = size
        backend = service.backend
        f = service.features
        staged = backend.pinned_empty((size, f), np.float32)
        staged[...] = service.rows[:size]
        self._args = (
            staged, ag.Out((size, f), np.float32), service.weights, service.bias,
            np.int32(f), np.int32(size),
        )  # fmt: skip
        self._grid = (size * f + BLOCK - 1) // BLOCK
        self._last: Array | None = None

    def release(self, futures: list[asyncio.Future[None]]) -> None:
        """Dispatch the staged batch; its completion settles *futures*."""
        pending = self._service.backend.dispatch(
            DENSE_ROWS, *self._args, grid=self._grid, block=BLOCK
        )
        pending.add_done_callback(lambda done: self._done(done, futures))

    def _done(self, done: ag.PendingDispatch, futures: list[asyncio.Future[None]]) -> None:
        exc = done.exception()
        if exc is None:
            self._last = done.result()[0]
        _settle(futures, exc)

    def check(self) -> None:
        """The last batch's result against numpy's answers to its rows.

        Raises:
            WrongAnswer: it differs, or no batch completed.
        """
        if self._last is None:
            raise WrongAnswer("dispatch floor: no batch completed")
        picks = list(range(self._size))
        self._service.check(picks, list(self._last), "dispatch floor")


class RowsFloor:
    """The floor of a batcher that copies rows, with no queue of its own: each call awaits a
    future of its own; once *size* calls are in, their rows are written into pinned staging
    (one ``np.concatenate``, as ``ag.batcher`` writes them), one dispatch of the dense layer
    runs over them, and its completion hands each caller its row of the result (a view), as
    the batcher's answers are. No launch policy, statistics, checks of the rows or
    cancellation.

    What a batcher whose queue cost nothing would serve: :class:`DispatchFloor`'s work plus the
    rows copied in and handed out. Every answer is checked, as the ways' are.
    """

    def __init__(self, service: Service, size: int) -> None:
        backend, f = service.backend, service.features
        self._backend = backend
        self._size = size
        # One staging array: the next batch is written only once every caller of this one got
        # its answer, after its dispatch completed.
        self._staged = backend.pinned_empty((size, f), np.float32)
        self._tail = (
            ag.Out((size, f), np.float32), service.weights, service.bias, np.int32(f),
            np.int32(size),
        )  # fmt: skip
        self._grid = (size * f + BLOCK - 1) // BLOCK
        self._futures: list[asyncio.Future[tuple[Array, ...]]] = []
        self._rows: list[Array] = []

    def __call__(self, x: Array) -> Awaitable[tuple[Array, ...]]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[Array, ...]] = loop.create_future()
        futures = self._futures
        futures.append(future)
        self._rows.append(x)
        if len(futures) >= self._size:
            rows = self._rows
            self._futures, self._rows = [], []
            np.concatenate(rows, axis=None, out=self._staged.reshape(-1))
            pending = self._backend.dispatch(
                DENSE_ROWS, self._staged, *self._tail, grid=self._grid, block=BLOCK
            )
            pending.add_done_callback(lambda done: _hand_out(done, futures))
        return future


def _hand_out(done: ag.PendingDispatch, futures: list[asyncio.Future[tuple[Array, ...]]]) -> None:
    """Each caller's row of the result of *done* (each failed with its error, if it failed)."""
    exc = done.exception()
    if exc is not None:
        for future in futures:
            if not future.done():
                future.set_exception(exc)
        return
    for future, answer in zip(futures, zip(*done.result(), strict=False), strict=False):
        if not future.done():
            future.set_result(answer)


class WrongAnswer(AssertionError):
    """A request's answer differs from numpy's."""


class Service:
    """The dense layer's weights on a backend, the rows requests send, and their answers.

    Args:
        backend: the backend, open.
        weights: the weights, resident on *backend* (from ``backend.upload``).
        bias: the bias, resident on *backend*.
        w: the weights on the host, ``(features, features)`` float32.
        b: the bias on the host, ``(features,)`` float32.
        max_size: the batchers' ``max_size``.
        max_delay: the batchers' ``max_delay`` in seconds.
        pool: how many different rows the requests send.
        checked: whether answers are checked against numpy's (not on the stand-in driver,
            whose kernels compute nothing but a few of its own).
    """

    def __init__(
        self,
        backend: ag.Backend,
        weights: ag.ResidentBuffer,
        bias: ag.ResidentBuffer,
        w: Array,
        b: Array,
        *,
        max_size: int,
        max_delay: float,
        pool: int = 509,
        checked: bool = True,
    ) -> None:
        self.backend = backend
        self.checked = checked
        self.features = f = w.shape[0]
        self.weights, self.bias = weights, bias
        rng = np.random.default_rng(11)
        self.rows = rng.standard_normal((pool, f), dtype=np.float32)
        wide = self.rows.astype(np.float64) @ w.astype(np.float64) + b
        self.answers = np.maximum(wide, 0.0).astype(np.float32)
        self._out = ag.Out(f, np.float32)
        self._f, self._one = np.int32(f), np.int32(1)
        self._grid = (f + BLOCK - 1) // BLOCK
        # By way: the batcher of each launch policy.
        self.batchers = {
            way: ag.batcher(
                backend, DENSE_ROWS,
                inputs=[ag.Row((f,), np.float32)], outputs=[ag.Row((f,), np.float32)],
                shared=(weights, bias, self._f),
                launch=lambda n: ((n * f + BLOCK - 1) // BLOCK, BLOCK),
                max_size=max_size, max_delay=max_delay, policy=policy,
            )
            for way, policy in (("batched", "adaptive"), ("fixed delay", "fixed_delay"))
        }  # fmt: skip
        self.batcher = self.batchers["batched"]
        self._fixed = self.batchers["fixed delay"]

    @classmethod
    async def open(
        cls,
        backend: ag.Backend,
        features: int,
        *,
        max_size: int,
        max_delay: float,
        checked: bool = True,
    ) -> Service:
        """Upload weights of *features* x *features* (the example's scale) and compile."""
        rng = np.random.default_rng(7)
        w = (rng.standard_normal((features, features)) / np.sqrt(features)).astype(np.float32)
        b = (0.1 * rng.standard_normal(features)).astype(np.float32)
        weights, bias = await backend.upload(w), await backend.upload(b)
        await backend.compile(DENSE_ROWS)
        return cls(
            backend, weights, bias, w, b, max_size=max_size, max_delay=max_delay, checked=checked
        )

    def per_request(self, x: Array) -> Awaitable[tuple[Array, ...]]:
        """One dispatch of the dense layer for the row *x* alone."""
        return self.backend.dispatch(
            DENSE_ROWS, x, self._out, self.weights, self.bias, self._f, self._one,
            grid=self._grid, block=BLOCK,
        )  # fmt: skip

    def batched(self, x: Array) -> Awaitable[tuple[Array, ...]]:
        """The row *x* through the adaptive batcher, with the rows of whoever calls meanwhile."""
        return self.batcher(x)

    def fixed_delay(self, x: Array) -> Awaitable[tuple[Array, ...]]:
        """The row *x* through the batcher of the fixed-delay policy."""
        return self._fixed(x)

    def check(self, picks: list[int], outputs: list[Array], what: str) -> None:
        """Every output against numpy's answer to its row.

        Raises:
            WrongAnswer: an output differs by more than float32 rounding.
        """
        if not picks or not self.checked:
            return
        got, want = np.stack(outputs), self.answers[np.asarray(picks)]
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            bad = int(np.argmax(np.abs(got - want).max(axis=1)))
            raise WrongAnswer(
                f"{what}: the answer to row {picks[bad]} differs from numpy's by up to "
                f"{float(np.abs(got[bad] - want[bad]).max()):.3g}"
            )

    async def first_check(self) -> None:
        """Both ways against numpy once: a few rows one by one, then a full batch at once."""
        picks = list(range(3))
        outputs = [(await self.per_request(self.rows[i]))[0] for i in picks]
        self.check(picks, outputs, "one dispatch per request")
        picks = list(range(64))
        for way in (self.batched, self.fixed_delay):
            done = await asyncio.gather(*(way(self.rows[i]) for i in picks))
            self.check(picks, [y for (y,) in done], way.__name__)

    async def aclose(self) -> None:
        """Close the batchers and free the weights."""
        for batcher in self.batchers.values():
            await batcher.aclose()
        await self.weights.aclose()
        await self.bias.aclose()


@dataclass(frozen=True)
class Load:
    """What one load came to.

    Attributes:
        latencies: seconds of each request, from the call that makes its awaitable to its
            return (the CPU burnt before it is left out).
        requests_per_s: the requests of every client, per second of the whole load.
        requests: requests made.
        dispatches: dispatches the backend accepted meanwhile.
    """

    latencies: tuple[float, ...]
    requests_per_s: float
    requests: int
    dispatches: int


async def client_load(
    service: Service, way: Way, *, clients: int, rounds: int, burn_s: float, what: str
) -> Load:
    """*clients* tasks, each *rounds* times burning *burn_s* of CPU, then awaiting ``way(x)``
    for a row *x* of the service's pool; then every answer checked against numpy."""
    latencies: list[float] = []
    picks: list[int] = []
    outputs: list[Array] = []
    rows = service.rows
    pool = len(rows)

    async def client(k: int) -> None:
        for r in range(rounds):
            i = (k + r * clients) % pool
            if burn_s:
                burn(burn_s)
            t0 = time.perf_counter()
            answer = await way(rows[i])
            latencies.append(time.perf_counter() - t0)
            if answer is not None:
                picks.append(i)
                outputs.append(answer[0])

    before = service.backend.telemetry.snapshot().dispatches
    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.perf_counter() - t0
    dispatches = service.backend.telemetry.snapshot().dispatches - before
    service.check(picks, outputs, what)
    requests = clients * rounds
    return Load(tuple(latencies), requests / elapsed, requests, dispatches)


def summary(loads: list[Load]) -> dict[str, float]:
    """Percentiles of every request of *loads* pooled, their median requests/s, and the rows
    per dispatch (``nan`` where nothing was dispatched)."""
    latencies = [t for load in loads for t in load.latencies]
    dispatches = sum(load.dispatches for load in loads)
    requests = sum(load.requests for load in loads)
    return {
        "requests_per_s": harness.median(load.requests_per_s for load in loads),
        "p50_us": harness.percentile(latencies, 50) * 1e6,
        "p99_us": harness.percentile(latencies, 99) * 1e6,
        "max_us": max(latencies) * 1e6,
        "rows_per_dispatch": requests / dispatches if dispatches else float("nan"),
    }


async def in_turns(
    service: Service,
    ways: Mapping[str, Way],
    *,
    clients: int,
    rounds: int,
    burn_s: float,
    pairs: int,
) -> dict[str, Any]:
    """Each of *ways* under the same load, after a short warm-up of each, *pairs* times in
    turns (one load of each way, in order, then again).

    Returns:
        By way, :func:`summary` of its loads; under ``"pairs"``, by way, the requests/s of
        each of its loads in order, for ratios taken pair by pair.
    """
    for name, way in ways.items():
        warm = max(rounds // 10, 1)
        await client_load(
            service, way, clients=clients, rounds=warm, burn_s=burn_s, what=f"{name} warm-up"
        )
    runs: dict[str, list[Load]] = {name: [] for name in ways}
    for _ in range(pairs):
        for name, way in ways.items():
            runs[name].append(
                await client_load(
                    service, way, clients=clients, rounds=rounds, burn_s=burn_s, what=name
                )
            )
    rows: dict[str, Any] = {name: summary(loads) for name, loads in runs.items()}
    rows["pairs"] = {name: [load.requests_per_s for load in loads] for name, loads in runs.items()}
    return rows


def pair_ratios(pairs: Mapping[str, list[float]], top: str, bottom: str) -> dict[str, Any]:
    """The requests/s of *top* over *bottom*'s, pair by pair: median, lowest, highest, all."""
    ratios = [t / b for t, b in zip(pairs[top], pairs[bottom], strict=True)]
    return {
        "median": harness.median(ratios),
        "low": min(ratios),
        "high": max(ratios),
        "pairs": ratios,
    }
