"""Pools of the CUDA backend: pinned host blocks, device memory, streams.

Each pool is a documented Protocol plus the default implementation, with a frozen
``statistics()`` and a ``__repr__`` showing its counts.
"""

from ._device import DeviceMemory as DeviceMemory
from ._device import DeviceMemoryStatistics as DeviceMemoryStatistics
from ._device import StreamOrderedDeviceMemory as StreamOrderedDeviceMemory
from ._pinned import WORST_CASE_WASTE as WORST_CASE_WASTE
from ._pinned import HostPool as HostPool
from ._pinned import PinnedBlock as PinnedBlock
from ._pinned import PinnedMemory as PinnedMemory
from ._pinned import PinnedPool as PinnedPool
from ._pinned import PinnedPoolStatistics as PinnedPoolStatistics
from ._pinned import size_class as size_class
from ._streams import StreamLane as StreamLane
from ._streams import StreamPool as StreamPool
from ._streams import StreamPoolProtocol as StreamPoolProtocol
from ._streams import StreamPoolStatistics as StreamPoolStatistics

__all__ = (
    "WORST_CASE_WASTE",
    "DeviceMemory",
    "DeviceMemoryStatistics",
    "HostPool",
    "PinnedBlock",
    "PinnedMemory",
    "PinnedPool",
    "PinnedPoolStatistics",
    "StreamLane",
    "StreamOrderedDeviceMemory",
    "StreamPool",
    "StreamPoolProtocol",
    "StreamPoolStatistics",
    "size_class",
)
