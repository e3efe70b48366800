"""OpenTelemetry spans of dispatches (``docs/jobs.md``), read with the SDK's in-memory exporter."""

from __future__ import annotations

import numpy as np
import pytest

import asyncgraph as ag
from tests.batching import Affine, F, make
from tests.jobs_scenarios import N, _inc

trace = pytest.importorskip("opentelemetry.trace")
sdk = pytest.importorskip("opentelemetry.sdk.trace")
export = pytest.importorskip("opentelemetry.sdk.trace.export")
memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")


@pytest.fixture
def spans() -> tuple[object, object]:
    exporter = memory.InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(export.SimpleSpanProcessor(exporter))
    return provider, exporter


async def test_a_dispatch_is_a_span_under_the_callers_span(spans: tuple[object, object]) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")  # type: ignore[attr-defined]
    async with ag.open_backend("host", tracer_provider=provider) as backend:
        with tracer.start_as_current_span("request") as request:
            await _inc(backend, ag.InOut(np.zeros(N, np.float32)), priority="high")
        assert backend.telemetry.snapshot().fast_path_dispatches == 0
    (dispatch,) = [s for s in exporter.get_finished_spans() if s.name == "asyncgraph.dispatch"]  # type: ignore[attr-defined]
    assert dispatch.parent.span_id == request.get_span_context().span_id
    assert dict(dispatch.attributes) == {
        "asyncgraph.kernel": "inc",
        "asyncgraph.device": "host",
        "asyncgraph.priority": "high",
        "asyncgraph.bytes_in": 4 * N,
        "asyncgraph.bytes_out": 4 * N,
    }
    assert [event.name for event in dispatch.events] == ["queued", "launched", "completed"]
    times = [event.timestamp for event in dispatch.events]
    assert times == sorted(times)


async def test_a_withdrawn_dispatch_ends_its_span_in_error(spans: tuple[object, object]) -> None:
    provider, exporter = spans
    async with ag.open_backend("host", tracer_provider=provider, max_in_flight=1) as backend:
        from tests.test_jobs import HostHold

        hold = HostHold()
        held = hold.take(backend)
        p = _inc(backend, ag.InOut(np.zeros(N, np.float32)))
        assert p.cancel()
        hold.release()
        await held
    names = [
        [event.name for event in s.events]
        for s in exporter.get_finished_spans()  # type: ignore[attr-defined]
    ]
    assert ["queued", "withdrawn", "exception"] in names
    assert ["queued", "launched", "completed"] in names


async def test_without_a_provider_no_span_is_made() -> None:
    async with ag.open_backend("host") as backend:
        assert backend._steer.tracer is None  # the global provider is not set in the tests
        await _inc(backend, ag.InOut(np.zeros(N, np.float32)))


async def test_a_batch_is_a_span_linking_its_callers(spans: tuple[object, object]) -> None:
    import asyncio

    provider, exporter = spans
    tracer = provider.get_tracer("test")  # type: ignore[attr-defined]
    async with ag.open_backend("host", tracer_provider=provider) as backend:
        rows = make(backend, Affine(), max_size=3, priority="low")

        async def call(i: int) -> object:
            with tracer.start_as_current_span(f"request {i}"):
                return await rows(np.full(F, i, np.float32))

        requests = await asyncio.gather(*(call(i) for i in range(3)))
        await rows.aclose()
    assert len(requests) == 3
    finished = exporter.get_finished_spans()  # type: ignore[attr-defined]
    by_name = {s.name: s for s in finished}
    batch = by_name["asyncgraph.batch"]
    request_ids = {by_name[f"request {i}"].context.span_id for i in range(3)}
    assert {link.context.span_id for link in batch.links} == request_ids
    dispatch = by_name["asyncgraph.dispatch"]
    assert dispatch.parent.span_id == batch.context.span_id
    assert dispatch.attributes["asyncgraph.priority"] == "low"
