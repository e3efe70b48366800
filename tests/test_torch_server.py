"""The PyTorch serving recipe (examples/torch_server) in process: answers against numpy.

Needs a GPU and PyTorch; skipped, saying which is missing, elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.cuda

APP = Path(__file__).resolve().parent.parent / "examples" / "torch_server" / "serve_torch.py"


def _app() -> Any:
    pytest.importorskip("torch", reason="PyTorch is not installed")
    spec = importlib.util.spec_from_file_location("asyncgraph_example_torch_server", APP)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(model: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    params = [p.detach().cpu().numpy().astype(np.float64) for p in model.parameters()]
    h = x.astype(np.float64)
    for w, b in zip(params[::2], params[1::2], strict=True):
        h = np.maximum(h @ w.T + b, 0.0)
    return h


async def test_both_endpoints_answer_the_models_result_concurrently(
    rng: np.random.Generator,
) -> None:
    module = _app()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    app = module.app
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        model = app.state.model

        async def ask(path: str) -> None:
            x = rng.standard_normal((int(rng.integers(1, 5)), 1024), dtype=np.float32)
            response = await client.post(path, json={"x": x.tolist()})
            assert response.status_code == 200, response.text
            y = np.asarray(response.json()["y"])
            np.testing.assert_allclose(y, _reference(model, x), rtol=1e-4, atol=1e-4)

        await asyncio.gather(*(ask("/v1/mlp") for _ in range(32)))
        await asyncio.gather(*(ask("/v1/mlp/thread") for _ in range(8)))
        bad = await client.post("/v1/mlp", json={"x": [[1.0, 2.0]]})
        assert bad.status_code == 400
        assert "1024" in bad.json()["error"]
        health = await client.get("/health")
        assert health.json()["status"] == "ok"
        stats = app.state.backend.event_statistics()
        assert stats.idle == stats.created
