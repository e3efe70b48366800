"""CUDA graphs: the capture lock and guard, recorded dispatches, captured pipelines, the cache.

See ``docs/graphs.md``.
"""

from ._cache import GraphCache as GraphCache
from ._cache import GraphCacheStatistics as GraphCacheStatistics
from ._captured import CapturedGraph as CapturedGraph
from ._captured import RecordedDispatch as RecordedDispatch
from ._choice import GraphChoiceStatistics as GraphChoiceStatistics
from ._graphs import CachedGraph as CachedGraph
from ._guard import CaptureGuard as CaptureGuard
from ._guard import CaptureLock as CaptureLock
from ._guard import CaptureMode as CaptureMode
from ._guard import CaptureStatus as CaptureStatus
from ._guard import capture_status as capture_status

__all__ = (
    "CachedGraph",
    "CaptureGuard",
    "CaptureLock",
    "CaptureMode",
    "CaptureStatus",
    "CapturedGraph",
    "GraphCache",
    "GraphCacheStatistics",
    "GraphChoiceStatistics",
    "RecordedDispatch",
    "capture_status",
)
