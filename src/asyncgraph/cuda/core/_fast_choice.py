"""The fast path of the dispatch core that runs (``_choose``): the compiled extension's, or its
Python twin's (``_fast``, ``_fast_job``, ``_fast_plan``), chosen with the core so that the two
never mix.

Kept apart from the Python core's entry (``_core_python``), which holds only what the lower
layers use (a launcher, event records and queries, the reactor's watches): the fast path uses
the scheduler, the resident store and the pending result, and only the engine composes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _fast, _fast_job, _fast_plan
from ._choose import core

__all__ = ("RING_BYTES", "FastJob", "FastPath")

if TYPE_CHECKING:
    from ._fast import FastPath
    from ._fast_job import FastJob
    from ._fast_plan import RING_BYTES
else:
    _compiled: Any = core if core.COMPILED else None
    FastPath = _compiled.FastPath if _compiled else _fast.FastPath
    FastJob = _compiled.FastJob if _compiled else _fast_job.FastJob
    RING_BYTES = _compiled.RING_BYTES if _compiled else _fast_plan.RING_BYTES
