"""Which dispatch core runs: the compiled extension (``_core_compiled``) or its Python twin
(``_core_python``).

``ASYNCGRAPH_CORE=compiled`` chooses the compiled core when it is built and loads (else the
Python one, with the reason); ``ASYNCGRAPH_CORE=python`` or ``ASYNCGRAPH_PURE_PYTHON=1`` the
Python one. Without either, :data:`DEFAULT` decides: the compiled core wherever it built and
loads (it passes the CUDA suite and the benchmarks on a GPU, ``docs/core.md``), else the Python
core, with the reason. A compiled core that is built but does not match the modules it cimports
(the owners of the objects it changes, compiled beside it: one of them runs as Python, say, or
was built from another source) fails at its import with another error than ``ImportError``; then
the Python core runs too, with a ``RuntimeWarning`` that says why.

The choice is made once, at import; ``python -m asyncgraph info`` reports it.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import TYPE_CHECKING

from asyncgraph._cuda.core import _core_python

__all__ = ("CORE_ENV", "DEFAULT", "PURE_ENV", "core", "describe", "why_python")

CORE_ENV = "ASYNCGRAPH_CORE"
PURE_ENV = "ASYNCGRAPH_PURE_PYTHON"
DEFAULT = "compiled"


def _choose() -> tuple[object, str]:
    if os.environ.get(PURE_ENV, "").strip() not in ("", "0"):
        return _core_python, f"{PURE_ENV} is set"
    wanted = os.environ.get(CORE_ENV, "").strip().lower()
    if wanted not in ("", "compiled", "python"):
        return _core_python, f"{CORE_ENV}={wanted!r} is neither 'compiled' nor 'python'"
    if (wanted or DEFAULT) == "python":
        if wanted:
            return _core_python, f"{CORE_ENV}=python"
        return _core_python, f"the default; {CORE_ENV}=compiled chooses the compiled core"
    try:
        compiled = importlib.import_module(
            f"{__package__}._core_compiled"
        )  # built where it could be
    except ImportError as exc:
        return _core_python, f"the compiled core is not available: {exc}"
    except Exception as exc:  # it loaded, and disagrees with the classes it mirrors
        why = (
            f"the compiled core does not match this asyncgraph ({type(exc).__name__}: {exc}); "
            "rebuild it (pip install -e . in a checkout)"
        )
        warnings.warn(f"asyncgraph: {why}; the Python core runs", RuntimeWarning, stacklevel=2)
        return _core_python, why
    return compiled, ""


if TYPE_CHECKING:
    core = _core_python
    why_python = ""
else:
    core, why_python = _choose()


def describe() -> str:
    """Which core runs, and why the Python one if it does."""
    if core.COMPILED:
        return "compiled (asyncgraph._cuda.core._core_compiled, against cuda.bindings.cydriver)"
    return f"Python ({why_python})"
