"""Structural rules of asyncgraph's source, read with ``ast`` (and the compiled core's Cython
sources with ``tokenize``): nothing here imports the package.

Each checker takes a source root (the folder that holds the package) and the package's name and
returns one line per violation. The tests run them on ``src/``, and on small synthetic trees to
prove that each can fail.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "asyncgraph"
# A module (or a Cython source) is split by concept, not by size: one past WARN_LINES is
# warned of (is it still one concept?), one of MAX_LINES or more fails.
WARN_LINES = 800
MAX_LINES = 1000

# Private attributes of standard-library or third-party objects that the heuristic cannot tell
# apart from ours. Add only one met in the source, with a comment saying whose it is. Empty
# today: the one met, asyncio._get_running_loop, is on a name bound by ``import asyncio``, and
# attributes of names imported from outside the package are never checked.
FOREIGN_PRIVATE_ATTRS: frozenset[str] = frozenset()

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


@dataclass(frozen=True)
class Module:
    name: str  # dotted: asyncgraph._runtime._loop, asyncgraph.pool (for pool/__init__.py)
    is_package: bool
    lines: int
    tree: ast.Module


def load_modules(root: Path, package: str) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        source = path.read_text(encoding="utf-8")
        name = ".".join(parts)
        modules[name] = Module(name, is_package, len(source.splitlines()), ast.parse(source))
    return modules


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def iter_imports(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement, anywhere, with whether it sits under ``if TYPE_CHECKING:``."""
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, typing_only = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, typing_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, typing_only) for child in node.orelse)
        else:
            stack.extend((child, typing_only) for child in ast.iter_child_nodes(node))


def _from_base(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = (module.name if module.is_package else module.name.rpartition(".")[0]).split(".")
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def resolve(
    module: Module, node: ast.Import | ast.ImportFrom, modules: dict[str, Module]
) -> Iterator[tuple[str, str | None, str]]:
    """(target module, imported symbol or None for a module, local name) per imported name.

    Names outside the package are skipped; no edge is added to a target's parent packages.
    """
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = alias.name
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target:
                yield target, None, alias.asname or alias.name.partition(".")[0]
        return
    base = _from_base(module, node)
    for alias in node.names:
        local = alias.asname or alias.name
        if f"{base}.{alias.name}" in modules:
            yield f"{base}.{alias.name}", None, local
        elif base in modules:
            yield base, alias.name, local


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the graph's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return components


def _shortest_cycle(graph: dict[str, set[str]], start: str, members: set[str]) -> list[str]:
    parents: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph.get(v, set()) & members):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parents[path[-1]])
                return [*reversed(path), start]
            if w not in parents:
                parents[w] = v
                queue.append(w)
    return [start]


def check_import_cycles(root: Path, package: str, typing: bool = False) -> list[str]:
    """Cycles among the package's runtime imports, and imports from the package's ``__init__``.

    Imports under ``if TYPE_CHECKING:`` make no edge, unless *typing* (then a cycle closed only
    through them is found too, and imports from the ``__init__`` are left to the runtime
    check). Imports of the top-level ``__init__`` (typing-only ones too) are reported on their
    own and kept out of the graph: it imports nearly every module, so any edge into it would
    merge them all into one cycle.
    """
    modules = load_modules(root, package)
    graph: dict[str, set[str]] = defaultdict(set)
    lines: dict[tuple[str, str], list[str]] = defaultdict(list)
    problems: list[str] = []
    from_init: list[str] = []
    for module in modules.values():
        for node, typing_only in iter_imports(module.tree):
            where = f"{module.name}:{node.lineno}: {ast.unparse(node)}"
            for target, symbol, _ in resolve(module, node, modules):
                if target == package and module.name != package:
                    from_init.append(
                        f"{where}  (takes {symbol or 'the package'} from {package}/__init__.py;"
                        " import from the defining module)"
                    )
                elif (typing or not typing_only) and target not in (module.name, package):
                    graph[module.name].add(target)
                    if where not in lines[module.name, target]:
                        lines[module.name, target].append(where)
    for component in _strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        cycle = " -> ".join(_shortest_cycle(graph, component[0], members))
        problems.append(f"import cycle among {len(component)} modules, e.g. {cycle}; made by:")
        for source in component:
            for target in sorted(graph[source] & members):
                made = sorted(lines[source, target], key=lambda w: int(w.split(":")[1]))
                problems.extend(f"    {where}  (-> {target})" for where in made)
    return problems if typing else problems + from_init


def check_module_lengths(root: Path, package: str, limit: int = MAX_LINES) -> list[str]:
    return [
        f"{module.name}: {module.lines} lines (limit: fewer than {limit})"
        for module in load_modules(root, package).values()
        if module.lines >= limit
    ]


def _walk_scope(nodes: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes of one scope: a def or class is yielded, its body is not entered."""
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _scope_names(nodes: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in _walk_scope(nodes):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _class_names(cls: ast.ClassDef) -> set[str]:
    """Class-level names and methods, ``__slots__`` entries, ``self.x = ...`` in its methods."""
    names = _scope_names(cls.body)
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
        ):
            names.update(
                n.value
                for n in ast.walk(stmt.value)
                if isinstance(n, ast.Constant) and isinstance(n.value, str)
            )
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.args.args:
            first = stmt.args.args[0].arg
            names.update(
                n.attr
                for n in ast.walk(stmt)
                if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name)
                and n.value.id == first
            )
    return names


def defined_private_names(module: Module) -> set[str]:
    names = _scope_names(module.tree.body)
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef):
            names |= _class_names(node)
    return {name for name in names if is_private(name)}


def check_private_access(root: Path, package: str) -> list[str]:
    """Heuristic: uses of private names (``_x``) that another module of the package defines,
    in the Python modules and (:func:`check_cython_private_access`) the Cython sources.

    Flags ``from X import _name`` and ``X._name`` for X a module of the package (unless
    ``_name`` is a submodule of X), and ``expr._name`` (``self``/``cls`` included) where the
    module itself defines no ``_name``: not at module level, nor in one of its classes.
    """
    modules = load_modules(root, package)
    defined = {name: defined_private_names(module) for name, module in modules.items()}

    def owners(attr: str) -> str:
        return ", ".join(sorted(m for m, names in defined.items() if attr in names)) or "none"

    problems: list[str] = []
    for module in modules.values():
        aliases: dict[str, str] = {}  # local name -> module of the package it is bound to
        foreign: set[str] = set()  # local names bound to imports from outside the package
        for node, _ in iter_imports(module.tree):
            resolved = list(resolve(module, node, modules))
            for target, symbol, local in resolved:
                if symbol is None:
                    aliases[local] = target
                elif is_private(symbol):
                    problems.append(
                        f"{module.name}:{node.lineno}: from {target} import {symbol}"
                        f" (defined in: {owners(symbol)})"
                    )
            if not resolved and (isinstance(node, ast.Import) or node.level == 0):
                foreign.update(a.asname or a.name.partition(".")[0] for a in node.names)
        for access in ast.walk(module.tree):
            if not isinstance(access, ast.Attribute) or not is_private(access.attr):
                continue
            value = access.value
            if isinstance(value, ast.Name) and value.id in aliases:
                target = aliases[value.id]
                if target == module.name or f"{target}.{access.attr}" in modules:
                    continue
            elif (
                (isinstance(value, ast.Name) and value.id in foreign)
                or access.attr in FOREIGN_PRIVATE_ATTRS
                or access.attr in defined[module.name]
            ):
                continue
            expr = ast.unparse(value)
            expr = expr if len(expr) <= 40 else expr[:37] + "..."
            where = f"{module.name}:{access.lineno}"
            problems.append(f"{where}: {expr}.{access.attr} (defined in: {owners(access.attr)})")
    problems.extend(check_cython_private_access(root, package))
    return sorted(problems, key=lambda p: (p.split(":")[0], int(p.split(":")[1])))


# -- the compiled core's Cython sources ----------------------------------------------------------

_INCLUDE = re.compile(r'^\s*include\s+"([^"]+)"', re.MULTILINE)
_DECLARING = frozenset(("cdef", "cpdef", "ctypedef"))
_BLOCKS = frozenset(("struct", "union", "enum", "extern"))  # their members are declarations
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class CythonModule:
    """One extension module: its ``.pyx``, the ``.pxd`` of the same name and every ``.pxi`` it
    includes, read as one (they share one namespace)."""

    name: str  # dotted, as the .pyx would import: asyncgraph._cuda.core._core_compiled
    files: list[Path] = field(default_factory=list)
    defined: set[str] = field(default_factory=set)  # private names declared or bound in it


def _tokens(path: Path) -> list[tokenize.TokenInfo]:
    source = path.read_text(encoding="utf-8")
    return list(tokenize.generate_tokens(io.StringIO(source).readline))


def _logical_lines(tokens: list[tokenize.TokenInfo]) -> Iterator[list[tokenize.TokenInfo]]:
    """The tokens of each logical line, comments and layout left out."""
    line: list[tokenize.TokenInfo] = []
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
    for token in tokens:
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if line:
                yield line
            line = []
        elif token.type not in skip:
            line.append(token)


def _declared(tokens: list[tokenize.TokenInfo]) -> set[str]:
    """The names a Cython source declares or binds (not those it only reads): every name on a
    ``cdef``/``cpdef``/``ctypedef`` line and in a struct, enum or extern block, names after
    ``def``/``class``/``as``/``for``/``global`` (imports aside), assignment targets, and
    ``self.x = ...`` stores. A heuristic, like :func:`defined_private_names`."""
    names: set[str] = set()
    block_indent = -1  # the indentation of an open struct/enum/extern block's header
    for line in _logical_lines(tokens):
        indent = line[0].start[1]
        if block_indent >= 0 and indent <= block_indent:
            block_indent = -1
        words = [t.string for t in line if t.type == tokenize.NAME]
        bare = [
            t
            for k, t in enumerate(line)
            if t.type == tokenize.NAME and (k == 0 or line[k - 1].string != ".")
        ]
        declaring = bool(words) and words[0] in _DECLARING
        if block_indent >= 0 or declaring:
            names.update(t.string for t in bare)
            if declaring and _BLOCKS & set(words) and line[-1].string == ":":
                block_indent = indent
            continue
        if words and words[0] in ("import", "cimport", "from"):
            continue  # what it imports is another module's
        for k, token in enumerate(line[:-1]):
            after = line[k + 1]
            if token.string in ("def", "class", "as", "global") and after.type == tokenize.NAME:
                names.add(after.string)
        if words and words[0] == "for" and "in" in words:
            names.update(words[1 : words.index("in")])
        strings = [t.string for t in line]
        if "=" in strings:
            target = line[: strings.index("=")]
            for k, token in enumerate(target):
                if token.type != tokenize.NAME:
                    continue
                before = target[k - 1].string if k else ","
                if before == "," or (before == "." and k >= 2 and target[k - 2].string == "self"):
                    names.add(token.string)
    return names


def load_cython(root: Path, package: str) -> dict[str, CythonModule]:
    """The package's extension modules, each ``.pyx`` with its ``.pxd`` and included ``.pxi``
    (a ``.pxi`` or ``.pxd`` that no ``.pyx`` takes in is a module of its own name)."""
    modules: dict[str, CythonModule] = {}
    taken: set[Path] = set()
    for pyx in sorted((root / package).rglob("*.pyx")):
        module = CythonModule(".".join(pyx.relative_to(root).with_suffix("").parts))
        pending = [pyx, *([pyx.with_suffix(".pxd")] if pyx.with_suffix(".pxd").exists() else [])]
        while pending:
            path = pending.pop(0)
            if path in module.files:
                continue
            module.files.append(path)
            taken.add(path)
            text = path.read_text(encoding="utf-8")
            pending.extend(path.parent / name for name in _INCLUDE.findall(text))
        modules[module.name] = module
    for path in sorted((root / package).rglob("*.px[id]")):
        if path not in taken:
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            modules.setdefault(name, CythonModule(name)).files.append(path)
    for module in modules.values():
        for path in module.files:
            module.defined |= {n for n in _declared(_tokens(path)) if is_private(n)}
    return modules


def _cython_imports(
    line: list[tokenize.TokenInfo], module: CythonModule, modules: dict[str, Module]
) -> tuple[dict[str, str], set[str], list[str]]:
    """Of an import line: local names bound to the package's modules, local names bound to
    anything outside the package, and the private names it takes from a module of the
    package."""
    words = [t.string for t in line]
    aliases: dict[str, str] = {}
    foreign: set[str] = set()
    taken: list[str] = []
    cut = next((k for k, w in enumerate(words) if w in ("import", "cimport")), -1)
    if cut == 0:  # import x.y as z, w: never the package (it imports itself relatively)
        for entry in " ".join(words[1:]).replace(" . ", ".").split(" , "):
            target, _, local = entry.partition(" as ")
            foreign.add(local or target.partition(".")[0])
        return aliases, foreign, taken
    if words[0] != "from" or cut < 0:
        return aliases, foreign, taken
    source = "".join(words[1:cut])
    base = source.lstrip(".")
    if level := len(source) - len(base):
        parts = module.name.split(".")[:-level]
        base = ".".join([*parts, base] if base else parts)
    for entry in " ".join(w for w in words[cut + 1 :] if w not in "()").split(" , "):
        name, _, local = entry.partition(" as ")
        if f"{base}.{name}" in modules:
            aliases[local or name] = f"{base}.{name}"
        elif base in modules and is_private(name):
            taken.append(f"from {base} import {name}")
        elif base not in modules:
            foreign.add(local or name)
    return aliases, foreign, taken


def check_cython_private_access(root: Path, package: str) -> list[str]:
    """Heuristic, as :func:`check_private_access` for Python: in the Cython sources, ``x._name``
    where the extension module (its ``.pyx``, ``.pxd`` and ``.pxi`` together) declares no
    ``_name``, ``from X import _name`` from a module of the package, and a string that is a
    private name another module defines, whether this one does too (a slot reached by name,
    ``getattr(x, "_name")``): an owner lends such names itself."""
    python = load_modules(root, package)
    cython = load_cython(root, package)
    defined = {name: defined_private_names(module) for name, module in python.items()}
    for name, module in cython.items():  # a .pxd beside a .py declares that module's types
        defined[name] = defined.get(name, set()) | module.defined

    def owners(attr: str) -> str:
        return ", ".join(sorted(m for m, names in defined.items() if attr in names)) or "none"

    problems: list[str] = []
    for module in cython.values():
        for path in module.files:
            where = path.relative_to(root).as_posix()
            aliases: dict[str, str] = {}
            foreign: set[str] = set()
            tokens = _tokens(path)
            imports: set[int] = set()  # the rows of import lines (their dots are no attributes)
            for line in _logical_lines(tokens):
                if line[0].string in ("import", "cimport", "from"):
                    imports.update(range(line[0].start[0], line[-1].end[0] + 1))
                    found, outside, taken = _cython_imports(line, module, python)
                    aliases.update(found)
                    foreign |= outside
                    problems.extend(
                        f"{where}:{line[0].start[0]}: {t} (defined in: {owners(t.split()[-1])})"
                        for t in taken
                    )
            for k, token in enumerate(tokens):
                if token.type == tokenize.STRING:
                    text = token.string.strip("\"'")
                    others = {m for m, names in defined.items() if text in names} - {module.name}
                    if _IDENTIFIER.match(text) and is_private(text) and others:
                        problems.append(
                            f"{where}:{token.start[0]}: {token.string} names a private member"
                            f" (defined in: {owners(text)})"
                        )
                    continue
                if token.type != tokenize.NAME or not is_private(token.string) or k < 2:
                    continue
                if token.start[0] in imports:
                    continue
                if tokens[k - 1].string != ".":
                    continue
                value = tokens[k - 2]
                if value.type == tokenize.NAME and value.string in foreign:
                    continue
                if value.type == tokenize.NAME and value.string in aliases:
                    target = aliases[value.string]
                    if f"{target}.{token.string}" in python:
                        continue
                elif token.string in module.defined:
                    continue
                problems.append(
                    f"{where}:{token.start[0]}: {value.string}.{token.string}"
                    f" (defined in: {owners(token.string)})"
                )
    return sorted(problems, key=lambda p: (p.split(":")[0], int(p.split(":")[1])))


def _report(title: str, problems: list[str]) -> None:
    if problems:
        pytest.fail(f"{title} ({len(problems)}):\n" + "\n".join(problems), pytrace=False)


def test_no_import_cycle() -> None:
    _report(
        "import cycles and imports from the package __init__", check_import_cycles(SRC, PACKAGE)
    )


def test_no_import_cycle_through_typing_imports_either() -> None:
    _report(
        "import cycles, typing-only imports included",
        check_import_cycles(SRC, PACKAGE, typing=True),
    )


def check_cython_lengths(root: Path, limit: int = MAX_LINES) -> list[str]:
    """The compiled core's sources (``.pyx``, ``.pxi``, ``.pxd``) of *limit* lines or more."""
    problems = []
    for path in sorted(root.rglob("*.p[xy][xid]")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines >= limit:
            problems.append(f"{path.relative_to(root)}: {lines} lines (limit: fewer than {limit})")
    return problems


def _warn_long(title: str, found: list[str]) -> None:
    """Warn of the sources past :data:`WARN_LINES` (a failure is for :data:`MAX_LINES`)."""
    if found:
        warnings.warn(f"{title} ({len(found)}):\n" + "\n".join(found), UserWarning, stacklevel=2)


def test_cython_sources_stay_under_1000_lines() -> None:
    assert any(SRC.rglob("*.pxi")), "no Cython sources found: the check would pass vacuously"
    _report(f"Cython sources of {MAX_LINES} lines or more", check_cython_lengths(SRC))
    _warn_long(
        f"Cython sources of {WARN_LINES} lines or more", check_cython_lengths(SRC, WARN_LINES)
    )


def test_modules_stay_under_1000_lines() -> None:
    _report(f"modules of {MAX_LINES} lines or more", check_module_lengths(SRC, PACKAGE))
    long = check_module_lengths(SRC, PACKAGE, WARN_LINES)
    _warn_long(f"modules of {WARN_LINES} lines or more", long)


def test_a_long_module_is_warned_of_and_a_longer_one_fails(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "_long.py").write_text("x = 1\n" * WARN_LINES, encoding="utf-8")
    assert check_module_lengths(tmp_path, "pkg") == []  # no failure
    long = check_module_lengths(tmp_path, "pkg", WARN_LINES)
    assert long == [f"pkg._long: {WARN_LINES} lines (limit: fewer than {WARN_LINES})"]
    with pytest.warns(UserWarning, match=r"^modules of 800 lines or more \(1\):\npkg\._long: "):
        _warn_long("modules of 800 lines or more", long)


def check_module_names(root: Path, package: str) -> list[str]:
    """Modules of the package that share a file name (``__init__`` aside): a reader should
    guess a module from its name, wherever it stands."""
    where: dict[str, list[str]] = defaultdict(list)
    for name, module in load_modules(root, package).items():
        if not module.is_package:
            where[name.rpartition(".")[2]].append(name)
    return [
        f"{stem}: {', '.join(sorted(names))}"
        for stem, names in sorted(where.items())
        if len(names) > 1
    ]


def test_no_two_modules_share_a_name() -> None:
    _report("modules that share a name", check_module_names(SRC, PACKAGE))


def test_the_name_check_finds_a_shared_name(tmp_path: Path) -> None:
    for relative in ("__init__.py", "_a.py", "sub/__init__.py", "sub/_a.py", "sub/_b.py"):
        (tmp_path / "pkg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / relative).write_text("", encoding="utf-8")
    assert check_module_names(tmp_path, "pkg") == ["_a: pkg._a, pkg.sub._a"]


MAX_DEPTH = 10


def iter_load_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: at module level (under ``try``, ``if``
    or a class body too), not inside a function, nor under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))


def check_import_depth(root: Path, package: str, limit: int = MAX_DEPTH) -> list[str]:
    """Chains of modules, each importing the next as it loads, longer than *limit* modules:
    the longest one, reported once per module that starts one."""
    modules = load_modules(root, package)
    graph: dict[str, set[str]] = defaultdict(set)
    for module in modules.values():
        for node in iter_load_imports(module.tree):
            for target, _, _ in resolve(module, node, modules):
                if target not in (module.name, package):
                    graph[module.name].add(target)
    chains: dict[str, list[str]] = {}

    def chain(name: str) -> list[str]:  # the import graph has no cycle (tested above)
        if name not in chains:
            longest = max((chain(t) for t in sorted(graph[name])), key=len, default=[])
            chains[name] = [name, *longest]
        return chains[name]

    return [
        f"{len(chain(name))} modules deep: {' -> '.join(chain(name))}"
        for name in sorted(modules)
        if len(chain(name)) > limit
    ]


def test_the_import_graph_is_at_most_ten_modules_deep() -> None:
    _report(f"import chains over {MAX_DEPTH} modules", check_import_depth(SRC, PACKAGE))


def test_the_depth_check_finds_a_deep_chain(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "_m0.py").write_text("", encoding="utf-8")
    for k in range(1, 4):  # _m3 -> _m2 -> _m1 -> _m0 as they load
        (package / f"_m{k}.py").write_text(f"from ._m{k - 1} import x\n", encoding="utf-8")
    (package / "_lazy.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ._m3 import x\n\n\n"
        "def f():\n    from ._m3 import y\n",
        encoding="utf-8",
    )
    assert check_import_depth(tmp_path, "pkg", limit=4) == []
    assert check_import_depth(tmp_path, "pkg", limit=3) == [
        "4 modules deep: pkg._m3 -> pkg._m2 -> pkg._m1 -> pkg._m0"
    ]


def check_formatter_skips(root: Path) -> list[str]:
    """Lines of the package that keep the formatter off (``# fmt: skip``, ``# fmt: off``): a
    module squeezed under the line limit that way is over it."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"#\s*fmt:\s*(skip|off)", line):
                found.append(f"{path.relative_to(root)}:{number}")
    return found


def test_no_line_keeps_the_formatter_off(tmp_path: Path) -> None:
    _report("'# fmt: skip' or '# fmt: off' in the package", check_formatter_skips(SRC / PACKAGE))
    (tmp_path / "m.py").write_text("x = (1,\n     2)  # fmt: skip\n", encoding="utf-8")
    assert check_formatter_skips(tmp_path) == ["m.py:2"]


def test_no_private_member_used_outside_its_module() -> None:
    _report("private members used outside their module", check_private_access(SRC, PACKAGE))


SYNTHETIC = {
    "__init__.py": "from ._a import A as A\n",
    # A cycle made by an import inside a function.
    "_a.py": (
        "class A:\n    def __init__(self) -> None:\n        self._x = 1\n\n"
        "    def f(self) -> int:\n        from ._b import g\n\n        return g() + self._x\n"
    ),
    "_b.py": "from . import _a\n\n\ndef g() -> int:\n    return _a.A()._x\n",
    # A cycle through a subpackage's __init__, reached with `from .. import`.
    "_p.py": "from .sub import S\n",
    "sub/__init__.py": "from ._s import S as S\n",
    "sub/_s.py": "from .. import _p\n\n\nclass S:\n    pass\n",
    # Typing-only: not a cycle.
    "_t1.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ._t2 import T2\n",
    "_t2.py": "from . import _t1\n\n\nclass T2:\n    pass\n",
    # Private reach-ins, and a symbol taken from the package's __init__.
    "_c.py": (
        "import sys\n\nfrom . import A, _d\nfrom ._d import _y\n\n\n"
        "def peek(a: A) -> int:\n    sys._getframe()\n    return a._x + _d._z + _y\n"
    ),
    "_d.py": "_y = 1\n_z = 2\n",
    "_big.py": "x = 1\n" * MAX_LINES,
    # The compiled core: a .pyx, its .pxd and a .pxi it includes, read as one module.
    "_core.pyx": (
        'include "_core_part.pxi"\n\n\ncdef class C:\n    def f(self, a):\n'
        "        return self._own + a._x\n"
    ),
    "_core.pxd": "cdef class C:\n    cdef object _own\n",
    "_core_part.pxi": (
        "# a._x in a comment is not a use\nimport asyncio as _asyncio\n"
        "from ._d import _y\nfrom . import _d\n\n"
        "cdef object _running = _asyncio._get_running_loop  # another library's\n"
        'cdef Py_ssize_t X = _slot(C, "_x")  # a slot of another module, reached by name\n\n\n'
        'def g(b):\n    """b._x in a docstring is not a use."""\n    return _d._z + b._own\n'
    ),
}


def test_structure_checks_catch_what_they_claim(tmp_path: Path) -> None:
    for relative, source in SYNTHETIC.items():
        path = tmp_path / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")

    cycles = "\n".join(check_import_cycles(tmp_path, "pkg"))
    assert "import cycle among 2 modules, e.g. pkg._a -> pkg._b -> pkg._a" in cycles, cycles
    assert "pkg._a:6: from ._b import g  (-> pkg._b)" in cycles, cycles
    assert "import cycle among 3 modules, e.g. pkg._p -> pkg.sub -> pkg.sub._s -> pkg._p" in cycles
    assert "pkg._c:3: from . import A, _d  (takes A from pkg/__init__.py" in cycles, cycles
    assert "_t1" not in cycles, cycles
    typing = "\n".join(check_import_cycles(tmp_path, "pkg", typing=True))
    assert "import cycle among 2 modules, e.g. pkg._t1 -> pkg._t2 -> pkg._t1" in typing, typing
    assert "from . import A, _d" not in typing, typing  # the runtime check reports those

    (tmp_path / "pkg" / "_big.pxi").write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    assert check_cython_lengths(tmp_path) == [
        f"pkg/_big.pxi: {MAX_LINES} lines (limit: fewer than {MAX_LINES})"
    ]
    assert check_module_lengths(tmp_path, "pkg") == [
        f"pkg._big: {MAX_LINES} lines (limit: fewer than {MAX_LINES})"
    ]

    private = check_private_access(tmp_path, "pkg")
    assert sorted(private) == [
        "pkg._b:5: _a.A()._x (defined in: pkg._a)",
        "pkg._c:4: from pkg._d import _y (defined in: pkg._d)",
        "pkg._c:9: _d._z (defined in: pkg._d)",
        "pkg._c:9: a._x (defined in: pkg._a)",
        "pkg/_core.pyx:6: a._x (defined in: pkg._a)",
        "pkg/_core_part.pxi:12: _d._z (defined in: pkg._d)",
        "pkg/_core_part.pxi:3: from pkg._d import _y (defined in: pkg._d)",
        'pkg/_core_part.pxi:7: "_x" names a private member (defined in: pkg._a)',
    ], private
    core = load_cython(tmp_path, "pkg")["pkg._core"]
    assert [path.name for path in core.files] == ["_core.pyx", "_core.pxd", "_core_part.pxi"]


# -- no attribute of another object set from outside ---------------------------------------------

# Attributes of other libraries' objects that their own API sets by assignment (a ctypes
# function's prototype, a numpy array's flags). Add only one met in the source, with its owner.
FOREIGN_SETTABLE_ATTRS = frozenset(
    {
        "argtypes",  # ctypes: a foreign function's parameter types
        "restype",  # ctypes: its result type
        "writeable",  # numpy: ndarray.flags.writeable
    }
)
_ASSIGN_OPS = frozenset({"=", "+=", "-=", "*=", "/=", "//=", "%=", "|=", "&=", "^=", "<<=", ">>="})


def _outside_target(target: ast.expr, imported: set[str], owned: set[str]) -> str | None:
    """*target* of an assignment or ``del`` in its source form, if it sets an attribute of an
    object this module does not own: one reached through another object's attribute
    (``self.graphs.replay_fast``, ``a.b.c``) or a name bound by an import (a module, another
    module's class), unless a class of this module owns an attribute of that name (*owned*);
    ``None`` otherwise."""
    if not isinstance(target, ast.Attribute) or target.attr in FOREIGN_SETTABLE_ATTRS:
        return None
    if target.attr in owned and not (
        isinstance(target.value, ast.Name) and target.value.id in imported
    ):
        return None
    owner = target.value
    if isinstance(owner, ast.Attribute) or (isinstance(owner, ast.Name) and owner.id in imported):
        return ast.unparse(target)
    return None


def owned_attributes(tree: ast.Module) -> set[str]:
    """The attributes the classes of a module own: those in their ``__slots__`` or bodies
    (attrs fields too) and those their methods set on their first parameter (``self``)."""
    names: set[str] = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                names.add(item.target.id)
            elif isinstance(item, ast.Assign):
                names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                if any(isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets):
                    names.update(
                        e.value
                        for e in ast.walk(item.value)
                        if isinstance(e, ast.Constant) and isinstance(e.value, str)
                    )
        for fn in ast.walk(cls):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.args.args:
                me = fn.args.args[0].arg
                names.update(
                    n.attr
                    for n in ast.walk(fn)
                    if isinstance(n, ast.Attribute)
                    and isinstance(n.ctx, (ast.Store, ast.Del))
                    and isinstance(n.value, ast.Name)
                    and n.value.id == me
                )
    return names


def _imported_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node, _typing in iter_imports(tree):
        for alias in node.names:
            names.add((alias.asname or alias.name).split(".")[0])
    return names


def check_outside_assignments(root: Path, package: str) -> list[str]:
    """Assignments (``=``, augmented, annotated, ``del``, ``setattr``/``delattr`` on anything
    but ``self``) that set an attribute of an object from outside its owner: the owner's
    method must do it. Read with ``ast``; an attribute of a local name or a parameter is not
    followed (the object's class is not known statically), one reached through another
    object's attribute or an imported name is."""
    problems: list[str] = []
    for name, module in load_modules(root, package).items():
        imported = _imported_names(module.tree)
        owned = owned_attributes(module.tree)
        for node in ast.walk(module.tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in _unpacked(target)]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = list(node.targets)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr")
                and node.args
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id == "self")
            ):
                called = f"{ast.unparse(node.func)}({ast.unparse(node.args[0])}, ...)"
                problems.append(f"{name}:{node.lineno}: {called}")
            for target in targets:
                found = _outside_target(target, imported, owned)
                if found is not None:
                    problems.append(f"{name}:{target.lineno}: {found}")
    return problems


def _unpacked(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _unpacked(element)]
    return [target]


def check_cython_outside_assignments(root: Path, package: str) -> list[str]:
    """The same in the compiled core's Cython sources (read with ``tokenize``): a statement
    that assigns to a name reached through two attributes or more (``self._front.x = v``),
    unless the module declares a field of that name (one of its own types')."""
    problems: list[str] = []
    for module in load_cython(root, package).values():
        owned = {name for path in module.files for name in _declared(_tokens(path))}
        for path in module.files:
            for line in _logical_lines(_tokens(path)):
                words = [token.string for token in line]
                end = next((k for k, word in enumerate(words) if word in _ASSIGN_OPS), None)
                if end is None or end < 5 or any(w in ("(", "[", ",", "<") for w in words[:end]):
                    continue
                names, dots = words[:end:2], words[1:end:2]
                if names[-1] in owned or names[-1] in FOREIGN_SETTABLE_ATTRS:
                    continue  # a field of one of its own types (or another library's API)
                if dots and all(d == "." for d in dots):
                    where = f"{path.relative_to(root)}:{line[0].start[0]}"
                    problems.append(f"{where}: {''.join(words[:end])}")
    return problems


def test_no_attribute_of_another_object_is_set_from_outside() -> None:
    _report(
        "attributes set from outside their owner (call the owner's method instead)",
        check_outside_assignments(SRC, PACKAGE) + check_cython_outside_assignments(SRC, PACKAGE),
    )


_PLANTED = {
    "__init__.py": "",
    "_owner.py": (
        "class Graphs:\n    def __init__(self):\n        self.replay_fast = None\n\n"
        "    def serve(self, fast):\n        self.replay_fast = fast.replay  # its own\n"
    ),
    "_engine.py": (
        "from . import _owner\nfrom ._owner import Graphs\n\n\n"
        "class Engine:\n    def __init__(self, fast):\n        self.graphs = Graphs()\n"
        "        self.graphs.serve(fast)  # through the owner: fine\n"
        "        self.count = 0  # its own: fine\n"
        "        self.graphs.replay_fast = fast.replay  # planted\n"
        "        self.graphs.telemetry.hits += 1  # planted\n"
        "        _owner.DEFAULT = 3  # planted: another module's global\n"
        "        Graphs.limit = 4  # planted: another module's class\n"
        "        setattr(fast, 'x', 1)  # planted\n"
        "        del self.graphs.replay_fast  # planted\n"
        "        a, self.graphs.b = 1, 2  # planted\n"
        "        view = fast.view()\n        view.flags.writeable = False  # numpy's own API\n"
    ),
    "_core.pyx": (
        "cdef class Fast:\n    def go(self, job):\n        job.state = 1  # its own record\n"
        "        self._front.door.count = 2  # planted\n"
        "        self._front.door.count += 1  # planted\n"
        "        self.n = self._front.door.count  # a read\n"
        "        if self._front.door.count == 2:\n            pass\n"
    ),
}


def test_the_outside_assignment_check_catches_a_planted_one(tmp_path: Path) -> None:
    for relative, source in _PLANTED.items():
        (tmp_path / "pkg" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / relative).write_text(source, encoding="utf-8")
    assert sorted(check_outside_assignments(tmp_path, "pkg")) == [
        "pkg._engine:10: self.graphs.replay_fast",
        "pkg._engine:11: self.graphs.telemetry.hits",
        "pkg._engine:12: _owner.DEFAULT",
        "pkg._engine:13: Graphs.limit",
        "pkg._engine:14: setattr(fast, ...)",
        "pkg._engine:15: self.graphs.replay_fast",
        "pkg._engine:16: self.graphs.b",
    ]
    assert check_cython_outside_assignments(tmp_path, "pkg") == [
        "pkg/_core.pyx:4: self._front.door.count",
        "pkg/_core.pyx:5: self._front.door.count",
    ]
