"""Builds the optional compiled dispatch core, ``asyncgraph._cuda.core._core_compiled``, and the
modules whose objects it changes (:data:`OWNERS`), compiled from their Python source.

Everything else about the package is in ``pyproject.toml``. The extension is Cython against
``cuda.bindings.cydriver`` (whose ``.pxd`` files declare the driver API through ``cuda.h``) and
numpy's C API, so the build needs Cython, cuda-bindings, numpy, ``cuda.h`` and a C compiler.
``cuda.h`` is looked for in ``$CUDA_HOME``/``$CUDA_PATH``, in NVIDIA's ``nvidia-cuda-runtime``
wheel and in ``/usr/local/cuda``. The extension is optional: where any of this is missing, or on
a platform other than Linux, the build says why and the package installs without it, running on
the Python twin of the core (``asyncgraph._cuda.core._core_python``).
``ASYNCGRAPH_REQUIRE_COMPILED=1`` makes a failed build an error instead (CI sets it).

The owners (:data:`OWNERS`) are plain Python modules, each with a ``.pxd`` of the same name that
declares its classes as extension types (Cython's pure Python mode); the core ``cimport``s them
and calls their methods through C. Where they are not built, the same ``.py`` runs as Python.
``scripts/build_core.py`` builds the same extensions in place.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REQUIRED = os.environ.get("ASYNCGRAPH_REQUIRE_COMPILED", "").strip() not in ("", "0")
SOURCE = "src/asyncgraph/_cuda/core/_core_compiled.pyx"
# The modules the compiled core changes the state of, through their own methods (cimported).
OWNERS = (
    "asyncgraph._jobs._pending",
    "asyncgraph._jobs._fast_door",
    "asyncgraph._buffers._resident",
)
# Their compiled build: their annotations are not types to Cython (their .pxd declares those),
# and a field of None read through a typed argument raises AttributeError as in Python.
OWNER_DIRECTIVES = {"language_level": "3", "annotation_typing": False, "nonecheck": True}


def _say(message: str) -> None:
    print(f"asyncgraph: {message}", file=sys.stderr)


def _cuda_include() -> str | None:
    """A directory holding ``cuda.h``, or ``None``."""
    candidates = [os.environ.get(name) for name in ("CUDA_HOME", "CUDA_PATH")]
    spec = importlib.util.find_spec("nvidia")  # NVIDIA's wheels share this namespace
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        for header in sorted(Path(root).glob("*/include/cuda.h"), reverse=True):
            candidates.append(str(header.parent.parent))
    candidates.append("/usr/local/cuda")
    for home in candidates:
        if home and (Path(home) / "include" / "cuda.h").is_file():
            return str(Path(home) / "include")
    return None


def _extensions() -> list[Extension]:
    if not sys.platform.startswith("linux"):
        _say("the compiled core is built on Linux only; installing the Python core")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        _say("Cython is not installed; installing the Python core")
        return []
    if importlib.util.find_spec("cuda.bindings") is None:
        _say("cuda-bindings is not installed; installing the Python core")
        return []
    include = _cuda_include()
    if include is None:
        _say("cuda.h not found (set CUDA_HOME); installing the Python core")
        return []
    try:
        import numpy
    except ImportError:
        _say("numpy is not installed; installing the Python core")
        return []
    extension = Extension(
        "asyncgraph._cuda.core._core_compiled",
        [SOURCE],
        include_dirs=[include, numpy.get_include()],
        # numpy's C API as of 1.26 (the oldest numpy asyncgraph supports), whatever builds it.
        define_macros=[("NPY_TARGET_VERSION", "NPY_1_26_API_VERSION")],
        language="c++",  # cydriver.pxd includes <type_traits>
        optional=not REQUIRED,
    )
    owners = [
        Extension(name, [f"src/{name.replace('.', '/')}.py"], optional=not REQUIRED)
        for name in OWNERS
    ]
    built = cythonize(owners, compiler_directives=OWNER_DIRECTIVES, quiet=True)
    built += cythonize(
        [extension], compiler_directives={"language_level": "3"}, include_path=["src"], quiet=True
    )
    return list(built)


class OptionalBuildExt(build_ext):
    """build_ext that says, and goes on, when the optional extension fails to compile."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            if REQUIRED:
                raise
            _say(f"the compiled core did not build ({exc}); installing the Python core")


_EXTENSIONS = _extensions()
if REQUIRED and not _EXTENSIONS:
    raise SystemExit("ASYNCGRAPH_REQUIRE_COMPILED is set, but the compiled core cannot build")
setup(ext_modules=_EXTENSIONS, cmdclass={"build_ext": OptionalBuildExt})
