"""How many completions one poll of the reactor delivers: as many as the tasks they wake fit in
a loop iteration's budget, by what woken tasks cost the loop lately (``_reactor``)."""

from __future__ import annotations

from asyncgraph._cuda.core._watches import MIN_COMPLETIONS

__all__ = ("FALL", "ITERATION_BUDGET", "WakeBudget")

# The loop time the tasks one poll wakes may take, judged by what woken tasks cost lately.
ITERATION_BUDGET = 2e-3
# How far a woken task's cost below the estimate moves it (a moving average); above, it is taken.
FALL = 0.25


class WakeBudget:
    """How many completions one poll delivers: as many as the tasks they wake fit in
    ``ITERATION_BUDGET``, judged by what woken tasks cost the loop lately, and at least
    ``MIN_COMPLETIONS`` (so slow tasks never bring it down to one a loop iteration).

    The reactor measures the loop iteration that ran the tasks a poll woke, and the cost per
    task is learned (:meth:`learn`). A cost above the estimate becomes the estimate at once:
    that iteration already ran past the budget, and waking too many makes the loop late for
    everything else, while waking too few costs only another iteration's overhead (the next
    poll delivers the rest). A cost below it is averaged in (by ``FALL``), so one cheap
    iteration does not let the next poll wake many. When the loop goes idle the estimate is
    forgotten (:meth:`forget`): the last tasks of a burst, which only return, are cheap, and
    the next burst's need not be. A poll without an estimate delivers ``MIN_COMPLETIONS``,
    and what their tasks cost is the estimate.
    """

    __slots__ = ("cost",)

    def __init__(self) -> None:
        self.cost = 0.0  # loop time a woken task takes, in seconds; 0.0: none measured yet

    def limit(self) -> int:
        """How many completions the next poll may deliver."""
        cost = self.cost
        if not cost:
            return MIN_COMPLETIONS
        return max(MIN_COMPLETIONS, int(ITERATION_BUDGET / cost))

    def learn(self, elapsed: float, woke: int) -> None:
        """The loop ran *elapsed* seconds between a poll that woke *woke* tasks and the next."""
        # At least 1 us a task (at most 2000 a poll), and at most a whole budget (a stall of
        # the loop, not the tasks' doing, must not keep it at MIN_COMPLETIONS for long).
        sample = min(max(elapsed / woke, 1e-6), ITERATION_BUDGET)
        cost = self.cost
        self.cost = sample if sample > cost else cost + FALL * (sample - cost)

    def forget(self) -> None:
        """The loop went idle: the next tasks' cost is measured afresh."""
        self.cost = 0.0
