"""How a backend steers its dispatches: their priority class, queue deadline and trace span.

:class:`Steering` holds a backend's defaults (``BackendOptions.default_priority``,
``queue_timeout``, the tracer of ``tracer_provider``), checks what a call passes, and starts a
dispatch's span. The scheduler orders and withdraws (``_jobs/_scheduler.py``); this only says
what each dispatch asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncgraph._runtime import _tracing
from asyncgraph._runtime._priority import (
    NORMAL,
    PRIORITIES,
    check_priority,
    check_queue_timeout,
)

if TYPE_CHECKING:
    from asyncgraph._jobs._scheduler import Job

    from ._options import BackendOptions

__all__ = ("Steering",)


class Steering:
    """A backend's defaults for its dispatches' class, deadline and tracing.

    Attributes:
        rank: the default class's rank (``PRIORITIES`` order).
        queue_timeout: the default queue deadline in seconds, or ``None``.
        tracer: the OpenTelemetry tracer of its spans, or ``None`` (no spans).
        plain: whether a dispatch that names no class and no deadline is of the default class
            (``"normal"``), without deadline or span: only such a dispatch may take the fast
            path, whose streams are the default class's.
    """

    __slots__ = ("plain", "queue_timeout", "rank", "tracer")

    def __init__(self, options: BackendOptions) -> None:
        self.rank = check_priority(options.default_priority, "BackendOptions")
        self.queue_timeout = check_queue_timeout(options.queue_timeout, "BackendOptions")
        self.tracer: Any = _tracing.tracer_for(options.tracer_provider)
        self.plain = self.rank == NORMAL and self.queue_timeout is None and self.tracer is None

    def resolve(
        self, priority: object, queue_timeout: object, where: str
    ) -> tuple[int, float | None]:
        """The rank and the deadline (seconds, or ``None``) of a call passing *priority* and
        *queue_timeout* (``None``: the backend's defaults).

        Raises:
            DispatchError: *priority* names no class, or *queue_timeout* is negative.
            ArgumentTypeError: either is of the wrong type.
        """
        rank = self.rank if priority is None else check_priority(priority, where)
        if queue_timeout is None:
            return rank, self.queue_timeout
        return rank, check_queue_timeout(queue_timeout, where)

    def start_span(self, job: Job, device: str) -> None:
        """Give *job* its span (while tracing), under the caller's current context."""
        if self.tracer is not None:
            call = job.call
            job.span = _tracing.start(
                self.tracer,
                call.kernel.name,
                device,
                PRIORITIES[job.priority],
                call.bytes_in,
                call.bytes_out,
            )
