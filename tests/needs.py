"""What some tests need beyond the package, checked once: skipped where missing, or failed.

- the stand-in driver (``tests/fake_driver``), which needs a C compiler to build;
- NVRTC, which compiles kernels (the extra ``nvrtc``): the stand-in's scenarios compile theirs;
- the compiled dispatch core (``asyncgraph._cuda.core._core_compiled``), built where Cython and a C
compiler
  were present at install.

Where one is missing its tests are skipped with the reason and what to install; where its switch
(:data:`SWITCHES`) is set, they fail instead, so that a broken setup cannot pass as skips. CI
sets the switches its machine must meet (``.ci/run``); see ``docs/testing.md``. Tests ask with
the markers ``stand_in``, ``nvrtc`` and ``compiled`` (``tests/conftest.py`` checks them before
the test's fixtures run), or with the functions below where a test needs the value.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

from tests.fake_driver import build

__all__ = (
    "CORES",
    "OWNERS",
    "SWITCHES",
    "child_environment",
    "compiled_core",
    "missing",
    "nvrtc",
    "owners_compiled",
    "require",
    "source_copy",
    "stand_in",
    "switched_on",
    "unmet",
)

# The modules the compiled core changes the objects of, compiled from their Python source where
# the core is built (setup.py's OWNERS; tests/test_core_layout.py checks they agree).
OWNERS = (
    "asyncgraph._jobs._pending",
    "asyncgraph._jobs._fast_door",
    "asyncgraph._buffers._resident",
)

# marker -> the environment variable that turns its skip into a failure
SWITCHES = {
    "stand_in": "ASYNCGRAPH_REQUIRE_STAND_IN",
    "nvrtc": "ASYNCGRAPH_REQUIRE_NVRTC",
    "compiled": "ASYNCGRAPH_REQUIRE_COMPILED",
}


# The dispatch cores a stand-in test runs on, as a parameter: "compiled" only where it is built.
CORES = ["python", pytest.param("compiled", marks=pytest.mark.compiled)]


def switched_on(switch: str) -> bool:
    """Whether the environment variable *switch* is set to anything but ``""`` or ``"0"``."""
    return os.environ.get(switch, "").strip() not in ("", "0")


def missing(reason: str, switch: str) -> NoReturn:
    """Skip the test for *reason*, or fail it where *switch* is set."""
    if switched_on(switch):
        pytest.fail(f"{reason} ({switch} is set: a failure)", pytrace=False)
    pytest.skip(reason)


_EXTRA = "pip install -e '.[nvrtc]'"


@functools.cache
def _stand_in() -> Path | str:
    try:
        return build()
    except RuntimeError as exc:  # not Linux, or no C compiler
        return f"needs the stand-in driver: {exc}; install gcc (apt-get install gcc)"


@functools.cache
def _nvrtc() -> str | None:
    try:
        from cuda.bindings import nvrtc as bindings

        err, _major, _minor = bindings.nvrtcVersion()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"needs NVRTC to compile kernels, which is not installed ({first}); " + _EXTRA
    if err != bindings.nvrtcResult.NVRTC_SUCCESS:
        return f"needs NVRTC to compile kernels, which is unusable ({err}); " + _EXTRA
    return None


@functools.cache
def _compiled() -> ModuleType | str:
    try:
        return importlib.import_module("asyncgraph._cuda.core._core_compiled")
    except ImportError as exc:
        return (
            f"the compiled dispatch core is not built here ({exc}); reinstall with Cython and a "
            "C compiler present (pip install -e .), which builds it"
        )
    except Exception as exc:  # built, but it does not load (a layout it mirrors changed)
        return f"the compiled dispatch core does not load ({type(exc).__name__}: {exc})"


def unmet(marker: str) -> str | None:
    """Why what *marker* (a key of :data:`SWITCHES`) asks for is missing, or ``None``."""
    if marker == "stand_in":
        found = _stand_in()
        return found if isinstance(found, str) else None
    if marker == "nvrtc":
        return _nvrtc()
    found_core = _compiled()
    return found_core if isinstance(found_core, str) else None


def require(marker: str) -> None:
    """Skip (or fail, where its switch is set) unless what *marker* asks for is here."""
    reason = unmet(marker)
    if reason is not None:
        missing(reason, SWITCHES[marker])


def stand_in() -> Path:
    """The directory of the built stand-in ``libcuda.so.1``; skips (or fails) without one."""
    found = _stand_in()
    if isinstance(found, str):
        missing(found, SWITCHES["stand_in"])
    return found


def nvrtc() -> None:
    """Skip (or fail) where NVRTC cannot compile kernels."""
    require("nvrtc")


def compiled_core() -> ModuleType:
    """The compiled dispatch core; skips (or fails) where it is not built."""
    found = _compiled()
    if isinstance(found, str):
        missing(found, SWITCHES["compiled"])
    return found


def owners_compiled() -> bool:
    """Whether this process runs the compiled build of every module in :data:`OWNERS` (else it
    runs their Python source: where they were not built, or in a :func:`source_copy`)."""
    loaded = [importlib.import_module(name) for name in OWNERS]
    built = [isinstance(m.__loader__, importlib.machinery.ExtensionFileLoader) for m in loaded]
    if any(built) and not all(built):
        pytest.fail(f"some owners are built and some not: {dict(zip(OWNERS, built, strict=True))}")
    return all(built)


def source_copy(directory: Path, *, keep: tuple[str, ...] = ()) -> Path:
    """A copy of the package's source in *directory*, without the extension modules built in
    place (but those of the modules named in *keep*): with it first on ``PYTHONPATH``, a process
    runs the Python source of every module that was compiled. Returns the copy's source root."""
    package = Path(importlib.import_module("asyncgraph").__file__ or "").parent
    kept = {name.rpartition(".")[2] for name in keep}

    def ignore(folder: str, names: list[str]) -> list[str]:
        built = [n for n in names if n.endswith(".so") or n == "__pycache__"]
        return [n for n in built if n.split(".")[0] not in kept]

    shutil.copytree(package, directory / "asyncgraph", ignore=ignore)
    return directory


def child_environment(source: Path) -> dict[str, str]:
    """The environment of a process that imports ``asyncgraph`` from *source* (a
    :func:`source_copy`) and the tests from this checkout, without the switch that requires the
    compiled core."""
    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != SWITCHES["compiled"]}
    env["PYTHONPATH"] = os.pathsep.join((str(source), str(root)))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env
