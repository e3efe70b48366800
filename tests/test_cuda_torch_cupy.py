"""PyTorch and CuPy work awaited and ordered with asyncgraph's, on a GPU, against numpy.

Each test is skipped, saying why, where PyTorch or CuPy is not installed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import asyncgraph as ag

from .kernels import INC

pytestmark = pytest.mark.cuda

N = 1 << 20  # float32 elements: 4 MiB


@pytest.fixture
async def gpu() -> AsyncIterator[Any]:
    async with ag.open_backend("cuda") as backend:
        yield backend


def _mlp(rng: np.random.Generator, torch: Any) -> tuple[Any, list[np.ndarray[Any, Any]]]:
    """The serving benchmark's model: 4 x Linear(1024, 1024) + ReLU, fp32, and its weights."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    layers: list[Any] = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda().eval()
    weights = [p.detach().cpu().numpy() for p in model.parameters()]
    return model, weights


def _mlp_reference(x: np.ndarray[Any, Any], weights: list[np.ndarray[Any, Any]]) -> Any:
    h = x.astype(np.float64)
    for w, b in zip(weights[::2], weights[1::2], strict=True):
        h = np.maximum(h @ w.T.astype(np.float64) + b, 0.0)
    return h


async def test_a_pytorch_model_is_awaited_on_its_stream(gpu: Any, rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    model, weights = _mlp(rng, torch)
    for _ in range(20):
        x = rng.standard_normal((4, 1024), dtype=np.float32)
        out = torch.empty((4, 1024), pin_memory=True)
        with torch.no_grad():
            y = model(torch.from_numpy(x).cuda(non_blocking=True))
            out.copy_(y, non_blocking=True)
        await gpu.wait(torch.cuda.current_stream())
        np.testing.assert_allclose(out.numpy(), _mlp_reference(x, weights), rtol=1e-4, atol=1e-4)


async def test_many_pytorch_requests_at_once(gpu: Any, rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    torch.backends.cuda.matmul.allow_tf32 = False
    model, weights = _mlp(rng, torch)

    async def request() -> None:
        x = rng.standard_normal((4, 1024), dtype=np.float32)
        out = torch.empty((4, 1024), pin_memory=True)
        with torch.no_grad():
            out.copy_(model(torch.from_numpy(x).cuda(non_blocking=True)), non_blocking=True)
        await gpu.wait(torch.cuda.current_stream())
        np.testing.assert_allclose(out.numpy(), _mlp_reference(x, weights), rtol=1e-4, atol=1e-4)

    await asyncio.gather(*(request() for _ in range(64)))
    stats = gpu.event_statistics()
    assert stats.idle == stats.created


async def test_pytorch_side_streams_and_events(gpu: Any) -> None:
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # about 10 ms of GPU clock
        x = torch.ones(N, device="cuda") * 3
        event = torch.cuda.Event()
        event.record(side)
    await gpu.wait(event)
    assert event.query()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
    await gpu.wait(side)
    assert side.query()
    assert float(x.sum()) == 3 * N
    with pytest.raises(ag.ArgumentTypeError, match="never recorded"):
        gpu.wait(torch.cuda.Event())


async def test_a_dispatch_after_pytorch_sees_its_writes(gpu: Any, rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    x = rng.standard_normal(N, dtype=np.float32)
    buf = await gpu.upload(np.zeros(N, np.float32))
    view = torch.from_dlpack(buf)  # the buffer's memory, in place
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)
        view.copy_(torch.from_numpy(x).pin_memory().cuda(non_blocking=True))
    await gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=N // 256, block=256,
                       after=side)  # fmt: skip
    np.testing.assert_array_equal(await gpu.download(buf), x + np.float32(1))


async def test_pytorch_ordered_after_a_dispatch_sees_its_writes(gpu: Any) -> None:
    torch = pytest.importorskip("torch")
    buf = await gpu.upload(np.zeros(N, np.float32))
    view = torch.from_dlpack(buf)
    blocker = torch.cuda.Stream()
    with torch.cuda.stream(blocker):
        torch.cuda._sleep(20_000_000)
    pending = gpu.dispatch(INC, buf, np.float32(5), np.int32(N), grid=N // 256, block=256,
                           after=blocker)  # fmt: skip
    consumer = torch.cuda.Stream()
    await gpu.order(consumer, after=pending)
    with torch.cuda.stream(consumer):
        total = view.sum()
    await gpu.wait(consumer)
    assert float(total) == 5 * N
    await pending


async def test_cupy_streams_and_events(gpu: Any, rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    x = rng.standard_normal(N, dtype=np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        d = cp.asarray(x)
        y = cp.sqrt(cp.abs(d)) * 2
        out = cp.cuda.alloc_pinned_memory(x.nbytes)
        host = np.frombuffer(out, np.float32, N)
        y.get(stream=stream, out=host)
        event = stream.record()
    await gpu.wait(event)
    np.testing.assert_allclose(host, np.sqrt(np.abs(x)) * 2, rtol=1e-6)
    with stream:
        y2 = d * 4
    await gpu.wait(stream)
    assert stream.done
    np.testing.assert_allclose(cp.asnumpy(y2), x * 4, rtol=1e-6)


async def test_a_dispatch_after_cupy_sees_its_writes(gpu: Any, rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    x = rng.standard_normal(N, dtype=np.float32)
    buf = await gpu.upload(np.zeros(N, np.float32))
    view = cp.from_dlpack(buf)
    stream = cp.cuda.Stream(non_blocking=True)
    spin = cp.RawKernel(
        r"""extern "C" __global__ void wait_a_while(long long cycles)
        { long long t0 = clock64(); while (clock64() - t0 < cycles) { } }""",
        "wait_a_while",
    )
    with stream:
        spin((1,), (1,), (np.int64(20_000_000),))
        view[:] = cp.asarray(x)
    await gpu.dispatch(INC, buf, np.float32(1), np.int32(N), grid=N // 256, block=256,
                       after=stream)  # fmt: skip
    np.testing.assert_array_equal(await gpu.download(buf), x + np.float32(1))
