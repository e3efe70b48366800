"""NVTX ranges around dispatches, for Nsight Systems (``BackendOptions(nvtx_enabled=True)``).

Two ranges per dispatch in the ``asyncgraph`` domain: ``submit <kernel>``, pushed on the loop's
thread around the host's submission (validation is done; copies and the launch are enqueued),
and ``dispatch <kernel>``, started at submission and ended when the loop learned of its
completion, so the timeline shows each dispatch's whole life beside the kernels it launched.
Uses the ``nvtx`` package (extra ``nvtx``); without a profiler attached its calls do nothing.
"""

from __future__ import annotations

from typing import Any

from asyncgraph._runtime._exceptions import UnsupportedError

__all__ = ("NvtxRanges",)


class NvtxRanges:
    """The ranges of one backend; attributes are made once per kernel name.

    Raises:
        UnsupportedError: the ``nvtx`` package is not installed.
    """

    __slots__ = ("_dispatch", "_domain", "_submit")

    def __init__(self) -> None:
        try:
            import nvtx
        except ImportError:
            raise UnsupportedError(
                "BackendOptions(nvtx_enabled=True) needs the nvtx package: "
                "pip install 'asyncgraph[nvtx]'"
            ) from None
        self._domain: Any = nvtx.get_domain("asyncgraph")
        self._submit: dict[str, Any] = {}
        self._dispatch: dict[str, Any] = {}

    def push_submit(self, kernel: str) -> None:
        """Open the ``submit`` range on this thread; :meth:`pop_submit` closes it."""
        attributes = self._submit.get(kernel)
        if attributes is None:
            attributes = self._submit[kernel] = self._domain.get_event_attributes(
                message=f"submit {kernel}", color="green"
            )
        self._domain.push_range(attributes)

    def pop_submit(self) -> None:
        """Close the innermost ``submit`` range of this thread."""
        self._domain.pop_range()

    def start_dispatch(self, kernel: str) -> Any:
        """Start a ``dispatch`` range; returns its id for :meth:`end_dispatch`."""
        attributes = self._dispatch.get(kernel)
        if attributes is None:
            attributes = self._dispatch[kernel] = self._domain.get_event_attributes(
                message=f"dispatch {kernel}", color="blue"
            )
        return self._domain.start_range(attributes)

    def end_dispatch(self, range_id: Any) -> None:
        """End a range :meth:`start_dispatch` started."""
        self._domain.end_range(range_id)
