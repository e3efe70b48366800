"""OpenTelemetry spans of dispatches (the ``otel`` extra: opentelemetry-api).

A backend traces when a tracer provider is given (``BackendOptions.tracer_provider``) or set
globally when it opens; otherwise :func:`tracer_for` gives ``None`` and dispatches pay nothing.
Each dispatch of a tracing backend is a span ``asyncgraph.dispatch``, started in ``dispatch()``
under the caller's current context, with events ``queued``, ``launched`` and ``completed`` (or
``withdrawn``); ``docs/jobs.md`` lists its attributes.
"""

from __future__ import annotations

from typing import Any

from asyncgraph._runtime._exceptions import UnsupportedError, WithdrawnError

__all__ = (
    "SPAN_NAME",
    "batch_span",
    "caller",
    "current",
    "finished",
    "launched",
    "start",
    "tracer_for",
)

SPAN_NAME = "asyncgraph.dispatch"


def tracer_for(provider: Any) -> Any:
    """The tracer of *provider*, or of the global provider when *provider* is ``None`` and one
    is set; ``None`` when there is none (or opentelemetry-api is not installed).

    Raises:
        UnsupportedError: a provider was given but opentelemetry-api is not installed.
    """
    try:
        from opentelemetry import trace
    except ImportError:
        if provider is not None:
            raise UnsupportedError(
                "BackendOptions(tracer_provider=...) needs opentelemetry-api; install the "
                "'otel' extra: pip install 'asyncgraph[otel]'"
            ) from None
        return None
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None  # none set: no spans, no cost
    return provider.get_tracer("asyncgraph")


def start(
    tracer: Any, kernel: str, device: str, priority: str, bytes_in: int, bytes_out: int
) -> Any:
    """A started span of one dispatch, under the current context, with its ``queued`` event."""
    span = tracer.start_span(
        SPAN_NAME,
        attributes={
            "asyncgraph.kernel": kernel,
            "asyncgraph.device": device,
            "asyncgraph.priority": priority,
            "asyncgraph.bytes_in": bytes_in,
            "asyncgraph.bytes_out": bytes_out,
        },
    )
    span.add_event("queued")
    return span


def launched(span: Any) -> None:
    """The dispatch was handed to the device."""
    span.add_event("launched")


def finished(span: Any, outcome: object) -> None:
    """The dispatch completed (or failed, or was withdrawn: *outcome* is its error); end it."""
    if isinstance(outcome, BaseException):
        from opentelemetry.trace import Status, StatusCode

        span.add_event("withdrawn" if isinstance(outcome, WithdrawnError) else "failed")
        span.record_exception(outcome)
        span.set_status(Status(StatusCode.ERROR, type(outcome).__name__))
    else:
        span.add_event("completed")
    span.end()


def caller() -> Any:
    """The span context of the caller's current span (for a batch's span to link)."""
    from opentelemetry import trace

    return trace.get_current_span().get_span_context()


def current(span: Any) -> Any:
    """A context manager making *span* the current one (without ending it)."""
    from opentelemetry import trace

    return trace.use_span(span, end_on_exit=False)


def batch_span(tracer: Any, callers: list[Any], size: int) -> Any:
    """A started span ``asyncgraph.batch`` linking the spans of the batch's *callers* (their
    span contexts, as :func:`caller` took them)."""
    from opentelemetry.trace import Link

    links = [Link(context) for context in callers if context is not None and context.is_valid]
    return tracer.start_span(
        "asyncgraph.batch", links=links, attributes={"asyncgraph.batch_size": size}
    )
