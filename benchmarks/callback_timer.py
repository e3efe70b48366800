"""Timing an object's methods while they run as event-loop callbacks (``CallbackTimer``).

``bench_load.py`` puts it on the methods asyncgraph schedules on the loop (its
``OWN_CALLBACKS``) to measure how long each of asyncgraph's own callbacks holds the loop.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Any

from benchmarks import harness


class CallbackTimer:
    """Times every call of some methods, through a wrapper put on their classes meanwhile.

    ``with CallbackTimer(OWN_CALLBACKS) as timer:`` installs the wrappers; leaving the block puts
    the original methods back, whatever happened in it.

    Args:
        targets: ``(class, method name)`` pairs; each class must define the method itself.
        clock: the clock the wrappers read.

    Attributes:
        samples: the seconds each call took, in order, by ``"Class.method"``.
    """

    def __init__(
        self,
        targets: Iterable[tuple[type[Any], str]],
        *,
        clock: harness.Clock = time.perf_counter,
    ) -> None:
        self._targets = tuple(targets)
        self._clock = clock
        self._installed: list[tuple[type[Any], str, Any]] = []
        self.samples: dict[str, list[float]] = {
            f"{cls.__name__}.{name}": [] for cls, name in self._targets
        }

    def reset(self) -> None:
        """Forget the calls timed so far."""
        for samples in self.samples.values():
            samples.clear()

    def __enter__(self) -> CallbackTimer:
        if self._installed:
            raise RuntimeError("this CallbackTimer is installed already")
        try:
            for cls, name in self._targets:
                original = cls.__dict__.get(name)
                if original is None:
                    raise AttributeError(
                        f"{cls.__name__} defines no method {name!r} any more; update "
                        "OWN_CALLBACKS to what asyncgraph schedules on the loop (grep call_soon "
                        "in src/asyncgraph)"
                    )
                wrapper = self._wrap(original, self.samples[f"{cls.__name__}.{name}"])
                setattr(cls, name, wrapper)
                self._installed.append((cls, name, original))
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        while self._installed:
            cls, name, original = self._installed.pop()
            setattr(cls, name, original)

    def _wrap(self, original: Callable[..., Any], samples: list[float]) -> Callable[..., Any]:
        clock = self._clock
        record = samples.append

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return original(*args, **kwargs)
            finally:
                record(clock() - t0)

        return timed


def callback_summary(samples: Sequence[float]) -> dict[str, float]:
    """``calls``, ``p99_us`` and ``max_us`` of one callback's *samples* (seconds; NaN if none)."""
    if not samples:
        return {"calls": 0, "p99_us": float("nan"), "max_us": float("nan")}
    return {
        "calls": len(samples),
        "p99_us": harness.percentile(samples, 99) * 1e6,
        "max_us": max(samples) * 1e6,
    }
