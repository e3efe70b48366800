"""Build the compiled dispatch core in place, without installing the package.

``pip install -e .`` builds it as part of the install; this builds only the extensions, next to
their sources (``src/asyncgraph/_cuda/core/_core_compiled.*.so``, and the modules whose objects
the core changes, compiled from their Python source: ``OWNERS`` in ``setup.py``, the same here),
for a machine where installing is not possible (no setuptools-scm, no package index). It needs
what ``setup.py`` needs: Cython, cuda-bindings, numpy, ``cuda.h`` and a C++ compiler. Run from
the project's root::

    python scripts/build_core.py
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# As setup.py's (tests/test_core_build.py checks they agree).
OWNERS = (
    "asyncgraph._jobs._pending",
    "asyncgraph._jobs._fast_door",
    "asyncgraph._buffers._resident",
)
OWNER_DIRECTIVES = {"language_level": "3", "annotation_typing": False, "nonecheck": True}


def cuda_include() -> str:
    """A directory holding ``cuda.h`` (as ``setup.py`` looks for one)."""
    candidates = [os.environ.get(name) for name in ("CUDA_HOME", "CUDA_PATH")]
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        for header in sorted(Path(root).glob("*/include/cuda.h"), reverse=True):
            candidates.append(str(header.parent.parent))
    candidates.append("/usr/local/cuda")
    for home in candidates:
        if home and (Path(home) / "include" / "cuda.h").is_file():
            return str(Path(home) / "include")
    raise SystemExit("cuda.h not found: set CUDA_HOME")


def main() -> None:
    import numpy
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    os.chdir(ROOT)
    extension = Extension(
        "asyncgraph._cuda.core._core_compiled",
        ["src/asyncgraph/_cuda/core/_core_compiled.pyx"],
        include_dirs=[cuda_include(), numpy.get_include()],
        define_macros=[("NPY_TARGET_VERSION", "NPY_1_26_API_VERSION")],
        language="c++",
    )
    owners = [Extension(name, [f"src/{name.replace('.', '/')}.py"]) for name in OWNERS]
    modules = cythonize(owners, compiler_directives=OWNER_DIRECTIVES, quiet=True)
    modules += cythonize(
        [extension], compiler_directives={"language_level": "3"}, include_path=["src"], quiet=True
    )
    distribution = Distribution({"ext_modules": modules, "package_dir": {"": "src"}})
    command = distribution.get_command_obj("build_ext")
    command.inplace = True
    command.ensure_finalized()
    command.run()
    built = sorted(
        str(p.relative_to(ROOT))
        for name in ("asyncgraph._cuda.core._core_compiled", *OWNERS)
        for p in ROOT.glob(f"src/{name.replace('.', '/')}.*.so")
    )
    print("built:", *built)


if __name__ == "__main__":
    sys.exit(main())
