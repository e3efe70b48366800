"""Every Python example of README.md and docs/*.md runs (pytest-examples finds them), on the host
backend unless its fence says otherwise.

A fence's info string says what an example needs beyond the host backend, as attributes:
``{.python test="cuda"}`` (a CUDA GPU: skipped, saying so, where none is found),
``{.python test="cuda,ray"}``, or ``{.python test="skip" reason="..."}`` for one that cannot run
in the suite (PyTorch, CuPy or several GPUs), with the reason shown in the skip.

An example that is a whole program (it ends in ``asyncio.run``, ``trio.run`` or ``anyio.run``)
runs as it is. Any other is a fragment of its page: it runs as the body of a coroutine, with a
backend open as ``backend`` (and ``gpu``) and the names its page's text gives it (the kernels,
arrays and objects below, one set per page), so that an ``await`` at its top level works.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import importlib.util
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog
from pytest_examples import CodeExample, EvalExample, find_examples

import asyncgraph as ag
from asyncgraph.testing import assert_matches_host

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NEEDS = {"cuda": pytest.mark.cuda, "ray": pytest.mark.ray}
Array = np.ndarray[Any, Any]

# -- the kernels the pages use -------------------------------------------------------------------


def _saxpy_host(x: Array, y: Array, out: Array, a: np.float32, n: np.int32) -> None:
    out[: int(n)] = a * x[: int(n)] + y[: int(n)]


SAXPY = ag.Kernel(
    r"""extern "C" __global__ void saxpy(const float* x, const float* y, float* out, float a,
                                        int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = a * x[i] + y[i]; }""",
    "saxpy",
    host=_saxpy_host,
)


def _scale_host(x: Array, out: Array, a: np.float32, n: np.int32) -> None:
    out[: int(n)] = a * x[: int(n)]


SCALE = ag.Kernel(
    r"""extern "C" __global__ void scale(const float* x, float* out, float a, int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = a * x[i]; }""",
    "scale",
    host=_scale_host,
)


def _reduce_host(x: Array, out: Array, n: np.int32) -> None:
    out[0] = x[: int(n)].sum()


REDUCE = ag.Kernel(
    r"""extern "C" __global__ void reduce(const float* x, float* out, int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) atomicAdd(out, x[i]); }""",
    "reduce",
    host=_reduce_host,
)


def _add_host(x: Array, w: Array, out: Array, n: np.int32) -> None:
    out[: int(n)] = x[: int(n)] + w[: int(n)]


ADD = ag.Kernel(
    r"""extern "C" __global__ void add(const float* x, const float* w, float* out, int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] + w[i]; }""",
    "add",
    host=_add_host,
)

# docs/batching.md shows this source in a ```cuda block.
AFFINE_ROWS_SRC = r"""
extern "C" __global__ void affine_rows(const float* x, float* y, const float* bias, float a,
                                       int features, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * features) y[i] = a * x[i] + bias[i % features];
}
"""


def _affine_rows_host(
    x: Array, y: Array, bias: Array, a: np.float32, features: np.int32, n: np.int32
) -> None:
    rows, f = int(n), int(features)
    np.add(a * x.reshape(rows, f), bias.reshape(f), out=y.reshape(rows, f))


AFFINE_ROWS = ag.Kernel(AFFINE_ROWS_SRC, "affine_rows", host=_affine_rows_host)


class _Model:
    """docs/batching.md's ``model``: an async model of a batch of texts."""

    async def encode(self, texts: list[str]) -> list[Array]:
        return [np.full(4, len(text), np.float32) for text in texts]


def _example_service() -> Any:
    """examples/server/app.py, the service docs/serving.md walks through."""
    spec = importlib.util.spec_from_file_location("docs_app", ROOT / "examples/server/app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- each page's names ---------------------------------------------------------------------------


def _arrays() -> dict[str, Any]:
    n = 1 << 12
    rng = np.random.default_rng(0)
    x, y = rng.random((2, n), dtype=np.float32)
    return {"n": n, "x": x, "y": y, "a": np.float32(2.0), "g": (n + 255) // 256, "b": 256}


def _names(page: str) -> dict[str, Any]:
    """The names a page's examples use without defining them, as its text describes them."""
    names: dict[str, Any] = {"ag": ag, "np": np, "asyncio": asyncio}
    pages = {"README.md", "quickstart.md", "reliability.md", "serving.md", "testing.md", "jobs.md"}
    if page in pages:
        names |= _arrays() | {"SAXPY": SAXPY, "saxpy": SAXPY, "REDUCE": REDUCE}
        names["n"] = np.int32(names["n"])
        names["assert_matches_host"] = assert_matches_host
    if page == "batching.md":
        rng = np.random.default_rng(0)
        names |= {
            "AFFINE_ROWS_SRC": AFFINE_ROWS_SRC,
            "AFFINE_ROWS": AFFINE_ROWS,
            "bias": rng.random(4, dtype=np.float32),
            "x": rng.random(4, dtype=np.float32),
            "model": _Model(),
        }
    if page == "resident.md":
        names |= {"w": np.ones(1024, np.float32), "SCALE": SCALE}
    if page == "scale-out.md":
        names |= _arrays() | {"kernel": ADD, "blocks": _arrays()["g"]}
        names["w"] = names["y"]
    if page == "serving.md":
        app = _example_service()
        rng = np.random.default_rng(0)
        names |= {
            "DENSE": app.DENSE,
            "FEATURES": app.FEATURES,
            "MAX_ROWS": app.MAX_ROWS,
            "BLOCK": app.BLOCK,
            "batch_delay": app.batch_delay,
            "weights": rng.random((app.FEATURES, app.FEATURES), dtype=np.float32),
            "bias": rng.random(app.FEATURES, dtype=np.float32),
        }
    return names


@contextlib.asynccontextmanager
async def _backend_names(page: str, device: str) -> AsyncIterator[dict[str, Any]]:
    """The page's names and what needs a backend: the backend itself and, on some pages, an
    object made from it (closed after the example)."""
    async with ag.open_backend(device) as backend:
        names = {"backend": backend, "gpu": backend}
        if page == "batching.md":
            async with ag.batcher(
                backend,
                AFFINE_ROWS,
                inputs=[ag.Row((4,), np.float32)],
                outputs=[ag.Row((4,), np.float32)],
                shared=(_names(page)["bias"], np.float32(2.0), np.int32(4)),
                launch=lambda n: ((n * 4 + 255) // 256, 256),
            ) as batcher:
                yield names | {"batcher": batcher}
            return
        yield names


# -- finding and running them --------------------------------------------------------------------


def _params() -> Iterator[Any]:
    for example in find_examples(*PAGES):
        settings = example.prefix_settings()
        test = settings.get("test", "")
        marks: list[pytest.MarkDecorator] = []
        if test == "skip":
            marks.append(pytest.mark.skip(reason=settings.get("reason", "")))
        else:
            marks += [NEEDS[need] for need in test.split(",") if need in NEEDS]
        yield pytest.param(example, id=f"{example.path.name}:{example.start_line}", marks=marks)


EXAMPLES = list(_params())


def _is_program(source: str) -> bool:
    """Whether *source* is a whole program: a top-level ``asyncio.run(...)``, ``trio.run(...)``
    or ``anyio.run(...)``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "run"
                and isinstance(func.value, ast.Name)
                and func.value.id in {"asyncio", "trio", "anyio"}
            ):
                return True
    return False


@contextlib.contextmanager
def _structlog_kept() -> Iterator[None]:
    """docs/observability.md configures structlog for the process: give the suite its own back."""
    config = structlog.get_config()
    try:
        yield
    finally:
        structlog.configure(**config)


async def _run_fragment(body: Callable[[], Any], page: str, device: str) -> None:
    async with _backend_names(page, device) as names:
        body.__globals__.update(names)
        await body()


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_runs(example: CodeExample, eval_example: EvalExample) -> None:
    page = example.path.name
    names = _names(page)
    with _structlog_kept():
        if _is_program(example.source):
            eval_example.run(example, module_globals=names)
            return
        wrapped = dataclasses.replace(
            example,
            source="async def _example():\n" + textwrap.indent(example.source, "    "),
            start_line=example.start_line - 1,
        )
        module = eval_example.run(wrapped, module_globals=names)
        device = "cuda" if "cuda" in example.prefix_settings().get("test", "") else "host"
        asyncio.run(_run_fragment(module["_example"], page, device))


def test_every_page_with_python_has_its_examples_found() -> None:
    found = {example.path.name for param in EXAMPLES for example in param.values}
    for page in PAGES:
        if "```python" in page.read_text(encoding="utf-8"):
            assert page.name in found


def test_every_fence_says_what_it_needs_in_words_the_suite_knows() -> None:
    for param in EXAMPLES:
        (example,) = param.values
        settings = example.prefix_settings()
        assert settings.get("test", "") in {"", "skip", "cuda", "ray", "cuda,ray"}, param.id
        if settings.get("test") == "skip":
            assert len(settings.get("reason", "")) > 10, f"{param.id}: say why it is skipped"
