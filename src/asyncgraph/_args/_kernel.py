"""Kernel declarations, independent of any backend, and their parameter lists.

A :class:`Kernel` is declared once (at module level in a server, say) and used with any backend:
the CUDA backend compiles its source with NVRTC on first use; the host backend runs its ``host``
callable. The parameter list is read from the CUDA source when it is simple enough to read
(``extern "C" __global__ void name(const float* x, float* y, int n)``), so that dispatch can
check argument count, kinds and dtypes before any work starts, on either backend.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from asyncgraph._runtime._exceptions import ArgumentTypeError, CompileError

__all__ = (
    "Kernel",
    "Param",
    "check_kernel",
)

# C parameter types whose numpy dtype is certain. Anything else is accepted unchecked.
_CTYPES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "__half": "float16",
    "half": "float16",
    "bool": "bool",
    "char": "int8",
    "signed char": "int8",
    "int8_t": "int8",
    "unsigned char": "uint8",
    "uint8_t": "uint8",
    "short": "int16",
    "short int": "int16",
    "int16_t": "int16",
    "unsigned short": "uint16",
    "unsigned short int": "uint16",
    "uint16_t": "uint16",
    "int": "int32",
    "signed": "int32",
    "signed int": "int32",
    "int32_t": "int32",
    "unsigned": "uint32",
    "unsigned int": "uint32",
    "uint32_t": "uint32",
    "long long": "int64",
    "long long int": "int64",
    "int64_t": "int64",
    "unsigned long long": "uint64",
    "unsigned long long int": "uint64",
    "uint64_t": "uint64",
    "size_t": "uint64",
}
_QUALIFIERS = frozenset({"__restrict__", "restrict", "__restrict", "volatile", "__grid_constant__"})
_IDENT = re.compile(r"[A-Za-z_]\w*")
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\s*\([^)]*\)")
# Callables whose call returns an object instead of running their body: (test, description).
_NEVER_RUN: tuple[tuple[Callable[[object], bool], str], ...] = (
    (inspect.iscoroutinefunction, "the coroutine function {!r} (async def)"),
    (inspect.isasyncgenfunction, "the async generator function {!r}"),
    (inspect.isgeneratorfunction, "the generator function {!r}"),
)


@attrs.frozen
class Param:
    """One kernel parameter as read from the CUDA source.

    Attributes:
        name: the parameter's name in the source.
        ctype: its C type as written, normalised (``"const float*"``).
        pointer: whether it is a pointer (takes an array or buffer) or a value (takes a scalar).
        const: for a pointer, whether the pointee is ``const`` (the kernel only reads it).
        dtype: the numpy dtype the C type corresponds to; ``None`` when unknown (``void*``, a
            struct, a typedef this reader does not know) and so not checked.
    """

    name: str
    ctype: str
    pointer: bool
    const: bool
    dtype: np.dtype[Any] | None


def _parse_param(text: str) -> Param | None:
    text = " ".join(text.replace("*", " * ").replace("&", " & ").split())
    if not text or "&" in text or "[" in text or "<" in text:
        return None
    tokens = [t for t in text.split(" ") if t not in _QUALIFIERS]
    stars = tokens.count("*")
    if stars > 1 or not tokens or not _IDENT.fullmatch(tokens[-1]):
        return None
    name = tokens[-1]
    pointer = stars == 1
    if pointer:
        star = tokens.index("*")
        base = tokens[:star]
        # "float* const x" makes the pointer const, not the pointee.
        after = [t for t in tokens[star + 1 : -1] if t != "const"]
        if after:
            return None
    else:
        base = tokens[:-1]
    const = "const" in base
    base_type = " ".join(t for t in base if t != "const")
    if not base_type:
        return None
    dtype_name = _CTYPES.get(base_type)
    dtype = np.dtype(dtype_name) if dtype_name is not None else None
    ctype = ("const " if const else "") + base_type + ("*" if pointer else "")
    return Param(name=name, ctype=ctype, pointer=pointer, const=const, dtype=dtype)


def _global_functions(source: str) -> dict[str, str]:
    """Map each ``__global__`` function name in *source* to its parameter text."""
    code = _LAUNCH_BOUNDS.sub(" ", _COMMENTS.sub(" ", source))
    found: dict[str, str] = {}
    for match in re.finditer(r"__global__", code):
        rest = code[match.end() :]
        paren = rest.find("(")
        if paren < 0:
            continue
        head = rest[:paren]
        if "(" in head or ";" in head or "{" in head:
            continue
        # The parameter list runs to the matching close parenthesis.
        depth, end = 0, -1
        for i in range(paren, len(rest)):
            if rest[i] == "(":
                depth += 1
            elif rest[i] == ")":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        names = _IDENT.findall(head)
        if end < 0 or not names:
            continue
        found[names[-1]] = rest[paren + 1 : end]
    return found


def _never_runs(host: Callable[..., object]) -> str | None:
    """Describe *host* if calling it would not run its body (``async def``, generators)."""
    fn: object = host
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):
        fn = type(fn).__call__  # a callable object: the method a call runs
    for test, what in _NEVER_RUN:
        if test(fn):
            return what.format(getattr(fn, "__qualname__", repr(fn)))
    return None


def _declares_function(source: str, name: str) -> bool:
    """Whether *source* names a function *name* where :func:`_global_functions` cannot read it.

    That is ``name(`` or ``name<...>(`` outside every function body (so not a call, and not a
    parameter's name), in a declaration that is not ``__device__`` only: a kernel declared
    through a macro, after an attribute, or as a template instantiation.
    """
    code = _COMMENTS.sub(" ", source)
    for match in re.finditer(rf"\b{re.escape(name)}\s*(?:<[^;{{}}]*>\s*)?\(", code):
        before = code[: match.start()]
        if before.count("{") != before.count("}"):
            continue  # inside a body: a call
        head = re.split(r"[;{}]", before)[-1]
        if "__global__" in head or "__device__" not in head:
            return True
    return False


def parse_signature(source: str, name: str) -> tuple[Param, ...] | None:
    """Read the parameter list of kernel *name* from *source*.

    Returns:
        The parameters, or ``None`` when the declaration is beyond this simple reader
        (templates, macros, references, arrays); dispatch then checks no parameter types.
    """
    params_text = _global_functions(source).get(name)
    if params_text is None:
        return None
    params_text = params_text.strip()
    if params_text in ("", "void"):
        return ()
    params = []
    for part in params_text.split(","):
        param = _parse_param(part)
        if param is None:
            return None
        params.append(param)
    return tuple(params)


class Kernel:
    """A GPU kernel, declared once and usable on every backend.

    Args:
        source: CUDA C++ source holding the kernel (``extern "C" __global__ void name(...)``).
        name: the kernel's function name in *source*.
        host: a plain Python function with the kernel's argument order, arrays in place of
            pointers, that writes its results into its output arrays (``out[:] = 2 * x``) and
            returns ``None``. The host backend runs it in a worker thread; tests use it as the
            reference. Optional on the CUDA backend.
        options: NVRTC options, as keyword arguments of ``cuda.core.ProgramOptions``
            (``{"use_fast_math": True}``). The architecture is always the device's.

    Raises:
        CompileError: *source* declares no ``__global__`` function called *name* (one the
            parameter reader cannot read, behind a macro or a template, is taken on trust).
        ArgumentTypeError: an argument is not of the type documented above (an empty
            *source* included); *host* is an ``async def``, a generator or an async generator
            function, whose body a call would not run. It is a ``TypeError``.
    """

    __slots__ = ("_options", "host", "name", "params", "source")

    def __init__(
        self,
        source: str,
        name: str,
        *,
        host: Callable[..., object] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(source, str) or not source.strip():
            got = repr(source) if isinstance(source, str) else type(source).__name__
            raise ArgumentTypeError(f"Kernel source must be a non-empty str of CUDA C++, got {got}")
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ArgumentTypeError(f"Kernel name must be a C identifier, got {name!r}")
        if host is not None and not callable(host):
            raise ArgumentTypeError(
                f"Kernel host= must be callable, got {type(host).__name__}; pass the function "
                "the host backend runs, or None"
            )
        never = _never_runs(host) if host is not None else None
        if never is not None:
            raise ArgumentTypeError(
                f"Kernel host= must be a plain function, got {never}, whose body the host "
                "backend would never run — write a plain def that writes into its output "
                "arguments and returns None"
            )
        if options is not None and not isinstance(options, Mapping):
            raise ArgumentTypeError(
                "Kernel options= must be a mapping of cuda.core ProgramOptions keywords, "
                f"got {type(options).__name__}"
            )
        functions = _global_functions(source)
        if name not in functions and not _declares_function(source, name):
            found = ", ".join(sorted(functions)) or "none"
            raise CompileError(
                name,
                f"the source declares no __global__ function named {name!r} "
                f"(found: {found}); pass the kernel's function name",
            )
        self.source = source
        self.name = name
        self.host = host
        self._options = tuple(sorted((options or {}).items()))
        self.params: tuple[Param, ...] | None = parse_signature(source, name)

    @property
    def options(self) -> dict[str, Any]:
        """The NVRTC options given at declaration (a copy)."""
        return dict(self._options)

    def __repr__(self) -> str:
        params = "?" if self.params is None else ", ".join(p.ctype for p in self.params)
        host = ", host" if self.host is not None else ""
        return f"<Kernel {self.name}({params}){host}>"


def check_kernel(kernel: object, where: str) -> None:
    """Refuse anything but a :class:`Kernel` given to *where* (``compile()``)."""
    if not isinstance(kernel, Kernel):
        raise ArgumentTypeError(
            f"{where} takes an asyncgraph.Kernel, got {type(kernel).__name__}; declare it with "
            "asyncgraph.Kernel(source, name, host=...)"
        )
