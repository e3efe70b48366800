"""What importing asyncgraph loads: no cuda-python until a CUDA backend opens (or
``reset_device`` runs), and, for the pytest plugin every pytest run of the environment loads,
nothing but pytest and the error tree until a test uses one of its fixtures, markers or options.

Each check runs in a fresh interpreter: this one has imported everything long ago.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What the plugin module and the package it lives in import when pytest loads the plugin.
# (``asyncgraph._runtime`` is the error tree's folder: its ``__init__`` imports nothing.)
PLUGIN_MODULES = [
    "asyncgraph",
    "asyncgraph._runtime",
    "asyncgraph._runtime._exceptions",
    "asyncgraph.testing",
]


def _loaded_after(setup: str, code: str) -> list[str]:
    """The modules *code* imports in a fresh interpreter that ran *setup* first."""
    script = "\n".join(
        [
            "import json, sys",
            textwrap.dedent(setup),
            "before = set(sys.modules)",
            textwrap.dedent(code),
            "print(json.dumps(sorted(set(sys.modules) - before)))",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def _top_level(modules: list[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_import_asyncgraph_loads_the_error_tree_alone() -> None:
    loaded = _loaded_after("", "import asyncgraph")
    assert [name for name in loaded if name.startswith("asyncgraph")] == [
        "asyncgraph",
        "asyncgraph._runtime",
        "asyncgraph._runtime._exceptions",
    ]
    assert {"cuda", "numpy"} & _top_level(loaded) == set()


def test_every_public_name_without_cuda_python() -> None:
    # Every name of asyncgraph, asyncgraph.pool and asyncgraph.testing, and a host backend's
    # dispatch: cuda-python stays unloaded until a CUDA backend opens or reset_device runs.
    code = """
        import asyncio
        import numpy as np
        import asyncgraph as ag
        from asyncgraph import *
        from asyncgraph.pool import *
        from asyncgraph.testing import *
        from tests.kernels import SCALE

        async def main():
            async with ag.open_backend("host") as backend:
                x = np.ones(8, np.float32)
                await backend.dispatch(
                    SCALE, x, ag.Out(8, np.float32), np.float32(2), np.int32(8), grid=1, block=8
                )

        asyncio.run(main())
    """
    loaded = _loaded_after("", code)
    assert "asyncgraph._front._backend" in loaded  # the names were all imported ...
    assert [name for name in loaded if name.partition(".")[0] == "cuda"] == []  # ... not cuda


def test_the_pytest_plugin_loads_nothing_heavy() -> None:
    # pytest-asyncio is a plugin pytest has loaded already; the backend fixtures are its own.
    loaded = _loaded_after("import pytest, pytest_asyncio", "import asyncgraph.testing")
    assert loaded == PLUGIN_MODULES


INNER_TEST = """
import sys

def test_plain():
    heavy = sorted(m for m in sys.modules if m.partition(".")[0] in ("numpy", "cuda"))
    ours = sorted(m for m in sys.modules if m.partition(".")[0] == "asyncgraph")
    assert (heavy, ours) == ([], {ours!r})

def test_the_device_option_reads_without_loading_more(asyncgraph_device):
    assert asyncgraph_device == "host"
    assert sorted(m for m in sys.modules if m.startswith("asyncgraph")) == {ours!r}
"""

MARKED_TEST = """
import pytest

@pytest.mark.cuda
def test_on_a_gpu():
    pass

@pytest.mark.ray
def test_with_ray():
    pass
"""


def test_a_suite_that_uses_no_fixture_of_the_plugin_loads_no_more_of_asyncgraph(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the plugin (and pytest-asyncio, which its fixtures need) is loaded, so no other
    # plugin of this environment can load numpy.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_inner=INNER_TEST.replace("{ours!r}", repr(PLUGIN_MODULES)))
    result = pytester.runpytest_subprocess(
        "-p", "asyncgraph.testing", "-p", "pytest_asyncio", "--asyncgraph-device", "host"
    )
    result.assert_outcomes(passed=2)


def test_its_markers_stay_registered_for_strict_markers(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_marked=MARKED_TEST)
    result = pytester.runpytest_subprocess("-p", "asyncgraph.testing", "--strict-markers")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 2, outcomes
