"""Copies between GPUs: access to each other's memory, set up once per pair.

``cuMemcpyPeerAsync`` copies between two devices' memory directly (over NVLink or PCIe) only
where the copying device may access the other's memory, and there are two kinds of access:

- a context's access to a peer context (``cuCtxEnablePeerAccess``), which covers memory from
  ``cuMemAlloc``;
- a memory pool's grant to another device (``cuMemPoolSetAccess``, through ``cuda.core``'s
  ``DeviceMemoryResource.peer_accessible_by``), which covers the memory of a stream-ordered
  pool: what the backends allocate from. Context access does not cover it: on two NVIDIA H100
  80GB HBM3 linked by NVLink, a peer copy between two pools' allocations ran 37 GB/s (the
  driver staged it through host memory) and 392 GB/s once each pool gave the other device
  access.

Where ``cuDeviceCanAccessPeer`` says no, the copy still works, staged by the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from cuda.bindings import driver as drv

if TYPE_CHECKING:
    from asyncgraph._cuda.device._cuda_device import Device

__all__ = ("DEVICE", "PEER", "STAGED", "route")

DEVICE: Final = "device"  # one context: cuMemcpyDtoDAsync
PEER: Final = "peer"  # two GPUs, directly over their link
STAGED: Final = "staged"  # two GPUs that cannot reach each other's memory: through the host

# Pairs of contexts (accessing, accessed) whose peer access was settled: enabled or impossible.
_contexts: dict[tuple[int, int], bool] = {}


def route(device: Device, source: Device) -> str:
    """How *device* (whose context is current) copies from *source*'s memory: :data:`DEVICE`,
    :data:`PEER` or :data:`STAGED`. The first time for a pair, gives *device* the access the
    devices allow: to *source*'s context, and to *source*'s memory pool."""
    known = source.routes.get(device.ctx.address)
    if known is not None:
        return known
    if source.ctx.address == device.ctx.address:
        kind = DEVICE
    elif not _context_access(device, source):
        kind = STAGED
    else:
        kind = PEER if source.grant_access(device.ordinal) else STAGED
    source.routes[device.ctx.address] = kind
    return kind


def _context_access(device: Device, peer: Device) -> bool:
    """Let *device*'s context (current) access *peer*'s, once per pair, where the devices allow
    it; whether it may."""
    key = (device.ctx.address, peer.ctx.address)
    known = _contexts.get(key)
    if known is not None:
        return known
    code, can = drv.cuDeviceCanAccessPeer(device.handle, peer.handle)
    allowed = code == drv.CUresult.CUDA_SUCCESS and bool(can)
    if allowed:
        code = drv.cuCtxEnablePeerAccess(peer.context, 0)[0]
        allowed = code in (
            drv.CUresult.CUDA_SUCCESS,
            drv.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        )
    _contexts[key] = allowed
    return allowed
