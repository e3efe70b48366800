"""Backend options: one frozen attrs class, validated on construction."""

from __future__ import annotations

from typing import Any

import attrs

from asyncgraph._runtime._exceptions import ArgumentTypeError, DispatchError
from asyncgraph._runtime._priority import check_priority, check_queue_timeout

__all__ = ("BackendOptions", "resolve_options")


def _int_field(attribute: attrs.Attribute[Any], value: object, least: int, none: bool) -> None:
    """Refuse *value* for an int field of at least *least* (or ``None`` where *none*)."""
    if none and value is None:
        return
    what = "a positive int" if least == 1 else "a non-negative int"
    if none:
        what += " or None"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"BackendOptions.{attribute.name} must be {what}, got {value!r}")
    if value < least:
        raise DispatchError(f"BackendOptions.{attribute.name} must be {what}, got {value!r}")


def _positive(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    _int_field(attribute, value, 1, none=False)


def _optional_positive(
    _inst: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    _int_field(attribute, value, 1, none=True)


def _non_negative(_inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    _int_field(attribute, value, 0, none=False)


@attrs.frozen(kw_only=True)
class BackendOptions:
    """How a backend is sized and what it plugs in.

    Attributes:
        streams: CUDA streams dispatches of the default priority class are spread over (CUDA
            backend only); each other class has a quarter as many (at least one) of its own.
        host_workers: worker threads that run ``host=`` functions on the host backend;
            ``None`` (the default) means one per CPU core (``os.cpu_count()``).
        max_in_flight: dispatches submitted and not yet completed, at most; further dispatches
            queue in call order until one completes.
        max_queued: dispatches waiting in that queue, at most; ``None`` (the default) leaves it
            unbounded. When it is full, ``dispatch()`` raises :class:`QueueFullError` and
            ``await backend.submit(...)`` waits for room: the backpressure a server applies.
        pinned_pool_bytes: bytes of idle pinned host blocks the pinned pool keeps cached; idle
            blocks beyond it are freed (CUDA backend).
        host_pool: a pinned host pool to use instead of the default (``asyncgraph.pool``).
        device_memory: a ``cuda.core`` ``MemoryResource`` for device allocations, instead of
            the memory pool the CUDA backend creates and owns (see ``docs/pools.md``).
        dispatch_events_enabled: emit a structlog debug event per dispatch (``dispatch.completed``
            / ``dispatch.failed``) and per batch of a batcher (``batch.launched``). Off by
            default, so the hot path pays nothing for logging.
        poll_window: seconds the completion reactor polls a pending CUDA event from the loop
            before it hands the wait to its waiter thread (CUDA backend).
        spin_window: seconds a task awaiting the only dispatch in flight polls its completion
            before it yields to the loop (CUDA backend); a short kernel then completes without
            a trip around the loop. The loop is held for at most this long; 0 turns it off.
        graph_cache_bytes: bound on the pinned and device bytes of the graphs that
            ``dispatch(graph="auto")`` records (CUDA backend); least recently used go first.
        graph_repeats: dispatches of one signature before ``graph="auto"`` measures it (eager
            dispatches against replays of a graph it records).
        nvtx_enabled: mark each dispatch with NVTX ranges for Nsight Systems (needs the
            ``nvtx`` package, extra ``nvtx``); see ``docs/observability.md``.
        default_priority: the priority class of a dispatch that names none: ``"high"``,
            ``"normal"`` (the default) or ``"low"`` (``docs/jobs.md``).
        queue_timeout: seconds a dispatch that passes no ``queue_timeout`` may wait for an
            in-flight slot before it is withdrawn with :class:`QueueTimeoutError`; ``None``
            (the default) waits as long as it takes.
        tracer_provider: an OpenTelemetry ``TracerProvider`` whose tracer makes a span of
            each dispatch; ``None`` (the default): the global provider, if one is set when
            the backend opens (extra ``otel``; ``docs/jobs.md``).
        fast_path_enabled: launch the steady state of dispatches in one call of the dispatch
            core (CUDA backend; see ``docs/core.md``). ``False`` runs every dispatch the
            general way, for comparison; results and errors are the same either way.

    Raises:
        ArgumentTypeError: a sized field is not an int (or a window not a number).
        DispatchError: a sized field or a window is out of its range (``host_workers=0``).
    """

    streams: int = attrs.field(default=4, validator=_positive)
    host_workers: int | None = attrs.field(default=None, validator=_optional_positive)
    max_in_flight: int = attrs.field(default=256, validator=_positive)
    max_queued: int | None = attrs.field(default=None, validator=_optional_positive)
    pinned_pool_bytes: int = attrs.field(default=256 << 20, validator=_non_negative)
    host_pool: Any = None
    device_memory: Any = None
    dispatch_events_enabled: bool = False
    poll_window: float = attrs.field(default=200e-6)
    spin_window: float = attrs.field(default=50e-6)
    graph_cache_bytes: int = attrs.field(default=64 << 20, validator=_non_negative)
    graph_repeats: int = attrs.field(default=2, validator=_positive)
    nvtx_enabled: bool = False
    fast_path_enabled: bool = True
    default_priority: str = attrs.field(default="normal")
    queue_timeout: float | None = attrs.field(default=None)
    tracer_provider: Any = None

    @poll_window.validator
    @spin_window.validator
    def _check_window(self, attribute: attrs.Attribute[float], value: float) -> None:
        what = f"BackendOptions.{attribute.name} must be a non-negative number of seconds"
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ArgumentTypeError(f"{what}, got {value!r}")
        if not value >= 0:  # NaN too
            raise DispatchError(f"{what}, got {value!r}")

    @default_priority.validator
    def _check_priority(self, _attribute: attrs.Attribute[str], value: str) -> None:
        check_priority(value, "BackendOptions")

    @queue_timeout.validator
    def _check_queue_timeout(
        self, _attribute: attrs.Attribute[float | None], value: object
    ) -> None:
        check_queue_timeout(value, "BackendOptions")


def resolve_options(call: str, options: object, option_kwargs: dict[str, Any]) -> BackendOptions:
    """The options of ``open_backend()`` or ``open_group()`` (named by *call*): *options*, or a
    :class:`BackendOptions` made of the keywords.

    Raises:
        ArgumentTypeError: both were given, *options* is not a :class:`BackendOptions` (a dict
            say), or a keyword is no field of it.
        DispatchError: a field's value is wrong.
    """
    if options is not None and option_kwargs:
        raise ArgumentTypeError(
            f"{call}() takes options=BackendOptions(...) or its fields as keywords, not both"
        )
    if options is not None:
        if not isinstance(options, BackendOptions):
            fields = (
                ", ".join(f"{k}={v!r}" for k, v in options.items())
                if isinstance(options, dict)
                else "..."
            )
            raise ArgumentTypeError(
                f"{call}(options={options!r}): pass options=asyncgraph.BackendOptions({fields}), "
                "or the fields as keywords"
            )
        return options
    unknown = sorted(set(option_kwargs) - _FIELDS)
    if unknown:
        named = ", ".join(f"{name}=..." for name in unknown)
        raise ArgumentTypeError(
            f"{call}({named}): BackendOptions has no such field; its fields are "
            f"{', '.join(sorted(_FIELDS))}"
        )
    return BackendOptions(**option_kwargs)


_FIELDS = frozenset(field.name for field in attrs.fields(BackendOptions))
