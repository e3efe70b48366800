"""The host backend's worker threads: daemon threads, so a host function that never returns
does not hold the process's exit.

``concurrent.futures.ThreadPoolExecutor`` joins its threads as the interpreter shuts down,
before ``atexit`` hooks run: a host function that never returned kept the process alive, and
the backend's ``backend.exit_in_flight`` report (an ``atexit`` hook) came only after it
returned, when nothing was in flight any more. These threads are never waited for at exit,
as the CUDA backend's waiter threads are not; ``shutdown()`` (the backend's close) still joins
them.

Threads start as work comes, as ``ThreadPoolExecutor``'s do: a new one only when no started
one is idle, up to *count*.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from asyncgraph._runtime._exceptions import BackendClosedError
from asyncgraph._runtime._telemetry import logger as _log

__all__ = ("Workers",)


class Workers:
    """At most *count* daemon threads named ``<name>_<i>`` that run what they are given, in
    the order given.

    Args:
        count: the most threads.
        name: the threads' name prefix.
    """

    __slots__ = ("_count", "_idle", "_lock", "_name", "_queue", "_stopped", "_threads")

    def __init__(self, count: int, name: str) -> None:
        self._count = count
        self._name = name
        self._queue: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)  # released by a thread each time it waits for work
        # Reentrant: a backend dropped in the middle of submit() (a collection there) stops its
        # workers from its finalizer, on this same thread.
        self._lock = threading.RLock()
        self._stopped = False

    @property
    def threads(self) -> int:
        """How many threads were started."""
        return len(self._threads)

    def submit(self, fn: Callable[[], object]) -> None:
        """Run *fn* on a worker thread; an exception it raises is logged and dropped.

        Raises:
            BackendClosedError: the workers were shut down.
        """
        with self._lock:
            if self._stopped:
                raise BackendClosedError("the host backend's worker threads were shut down")
            self._queue.put(fn)
            if self._idle.acquire(blocking=False) or len(self._threads) >= self._count:
                return  # an idle thread takes it, or the next to be free does
            thread = threading.Thread(
                target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def _work(self) -> None:
        take = self._queue.get
        while True:
            fn = take()
            if fn is None:
                return
            try:
                fn()
            except Exception as exc:  # the jobs catch their own errors: this is a bug's trace
                _log.error("host.worker_failed", error=repr(exc))
            del fn
            self._idle.release()

    def _stop(self) -> list[threading.Thread]:
        with self._lock:
            if self._stopped:
                return []
            self._stopped = True
            threads = list(self._threads)
        for _ in range(self._count):  # one for each thread there may be, after the work given
            self._queue.put(None)
        return threads

    def shutdown(self) -> None:
        """Let the threads finish what they were given, then end them; blocks until they did."""
        current = threading.current_thread()
        for thread in self._stop():
            if thread is not current:
                thread.join()

    def shutdown_now(self) -> None:
        """End the threads once they finished what they were given, without waiting."""
        self._stop()
