"""The seam between the front and the engines, counted; and no ``type: ignore`` for a job type.

The front and the engines meet through the types of one module (``_front/_engine_protocols.py``),
which ``docs/architecture.md`` lists under "The seam". A seam type is a class that module
defines, or a protocol or abstract class that one side defines and a class of the other side
implements: names as its base, or has every member of (its methods and attributes; the
compiled core's ``cdef class`` fields and methods count). The sides are folders: the front's
(``_front``, ``_jobs``, ``_args``, ``_buffers``) and the engines' (``_cuda``, ``_host``,
``capture``).
A protocol that declares nothing (``_buffers._resident.Use``, a name for any object) constrains
no one and is not counted.

A job-type ignore is a ``# type: ignore`` on a line that names a job class (``Job``,
``CudaJob``...) or hands a job on (``= job``, ``f(job)``), or a ``cast()`` to a job class: what
an engine writes when its contract does not know its jobs' type.

Like ``test_structure``, the checks read the source and never import the package; each runs on
small planted trees too, to show it fails.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from tests.test_structure import PACKAGE, SRC, load_modules

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
SEAM_MODULE = "_front._engine_protocols"
FRONT_SIDE = ("_front", "_jobs", "_args", "_buffers")
ENGINE_SIDE = ("_cuda", "_host", "capture")
MAX_SEAM_TYPES = 5
# Where job-type ignores are looked for, below the project's root.
TYPED_TREES = ("src", "tests", "benchmarks", "examples")

_SECTION = re.compile(r"^## The seam\n(.*?)(?=^## |\Z)", re.MULTILINE | re.DOTALL)
_LISTED = re.compile(r"^- `(\w+)", re.MULTILINE)
_CDEF_CLASS = re.compile(r"^cdef class (\w+)")
_CDEF_FIELD = re.compile(r"^\s+cdef\s+(?:public\s+|readonly\s+)?[\w.\[\]* ]+?\b(\w+)\s*(?:#.*)?$")
_CYTHON_METHOD = re.compile(r"^\s+(?:async\s+def|def|cpdef|cdef)\s+(?:[\w*]+\s+)*?(\w+)\s*\(")
_JOB_CLASS = re.compile(r"\b_?(?:[A-Z]\w*)?Job\b")
_HANDS_A_JOB = re.compile(r"=\s*\w*jobs?\s*$|[(,]\s*\w*jobs?\s*[,)]")
_IGNORE = re.compile(r"#\s*type:\s*ignore\b")


def listed_seam(text: str) -> list[str]:
    """The type names listed under ``## The seam`` of *text* (``- `Name` ...`` lines).

    Raises:
        ValueError: *text* has no such section.
    """
    found = _SECTION.search(text)
    if found is None:
        raise ValueError("no '## The seam' section")
    return _LISTED.findall(found.group(1))


def _side(module: str, package: str) -> str | None:
    first = module.removeprefix(f"{package}.").partition(".")[0]
    if first in FRONT_SIDE:
        return "front"
    if first in ENGINE_SIDE:
        return "engine"
    return None


def _base_name(node: ast.expr) -> str:
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _is_contract(cls: ast.ClassDef) -> bool:
    """Whether *cls* is a protocol or an abstract class."""
    bases = {_base_name(base) for base in cls.bases}
    meta = {_base_name(k.value) for k in cls.keywords if k.arg == "metaclass"}
    return bool(bases & {"Protocol", "ABC"} or "ABCMeta" in meta)


def _declared(cls: ast.ClassDef) -> set[str]:
    """What a protocol declares: its methods and its annotated attributes."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _members(cls: ast.ClassDef) -> set[str]:
    """What a class has: its methods, class attributes, ``__slots__`` and ``self.x`` fields."""
    names = _declared(cls)
    for statement in cls.body:
        if not isinstance(statement, ast.Assign):
            continue
        targets = {target.id for target in statement.targets if isinstance(target, ast.Name)}
        names |= targets
        value = statement.value
        if "__slots__" in targets and isinstance(value, ast.Tuple | ast.List):
            slots = [e.value for e in value.elts if isinstance(e, ast.Constant)]
            names |= {slot for slot in slots if isinstance(slot, str)}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return names


def _cython_classes(root: Path, package: str) -> list[tuple[str, str, set[str]]]:
    """(module, class, members) of each ``cdef class`` in the package's Cython sources; a class
    declared in a ``.pxd`` and defined in a ``.pxi`` has the members of both."""
    classes: dict[tuple[str, str], set[str]] = {}
    for path in sorted((root / package).rglob("*.px[di]")) + sorted(
        (root / package).rglob("*.pyx")
    ):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        current: set[str] | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            if found := _CDEF_CLASS.match(line):
                current = classes.setdefault((module, found.group(1)), set())
            elif line and not line[0].isspace() and not line.startswith("#"):
                current = None
            elif current is not None:
                member = _CYTHON_METHOD.match(line) or _CDEF_FIELD.match(line)
                if member:
                    current.add(member.group(1))
    return [(module, name, members) for (module, name), members in classes.items()]


def seam_types(root: Path, package: str) -> dict[str, str]:
    """The seam's types of the package under *root*: name -> why it is one."""
    modules = load_modules(root, package)
    found: dict[str, str] = {}
    seam = modules.get(f"{package}.{SEAM_MODULE}")
    if seam is not None:
        for statement in seam.tree.body:
            if isinstance(statement, ast.ClassDef):
                found[statement.name] = f"defined in {seam.name}"
    classes: list[tuple[str, str, ast.ClassDef | None, set[str]]] = [
        (module.name, node.name, node, _members(node))
        for module in modules.values()
        for node in ast.walk(module.tree)
        if isinstance(node, ast.ClassDef)
    ]
    classes += [(m, name, None, members) for m, name, members in _cython_classes(root, package)]
    for module_name, name, node, _ in classes:
        side = _side(module_name, package)
        if node is None or side is None or not _is_contract(node) or name in found:
            continue
        declared = _declared(node)
        for other, other_name, other_node, members in classes:
            if _side(other, package) in (None, side):
                continue
            bases = set() if other_node is None else {_base_name(b) for b in other_node.bases}
            if name in bases or (declared and declared <= members):
                found[name] = f"{module_name}.{name}, met by {other}.{other_name}"
                break
    return found


def check_seam(root: Path, package: str, doc: str) -> list[str]:
    """Where the seam of the package under *root* differs from the list in *doc*, or holds
    more than ``MAX_SEAM_TYPES`` types."""
    found = seam_types(root, package)
    listed = listed_seam(doc)
    problems = [
        f"{name} ({why}) is a seam type the architecture page does not list"
        for name, why in found.items()
        if name not in listed
    ]
    problems += [f"{name} is listed but is no seam type" for name in listed if name not in found]
    if len(found) > MAX_SEAM_TYPES:
        problems.append(f"{len(found)} seam types: {', '.join(found)}; at most {MAX_SEAM_TYPES}")
    return problems


def _comments(source: str) -> list[tokenize.TokenInfo]:
    return [
        token
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]


def job_type_ignores(root: Path, trees: tuple[str, ...] = TYPED_TREES) -> list[str]:
    """``path:line`` of each job-type ignore or cast in the ``.py`` files of *trees*."""
    found: list[str] = []
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            lines = source.splitlines()
            where = path.relative_to(root).as_posix()
            for token in _comments(source):
                if not _IGNORE.search(token.string):
                    continue
                row, column = token.start
                code = lines[row - 1][:column].rstrip()
                if _JOB_CLASS.search(code + token.string) or _HANDS_A_JOB.search(code):
                    found.append(f"{where}:{row}")
            for node in ast.walk(ast.parse(source)):
                if (
                    isinstance(node, ast.Call)
                    and _base_name(node.func) == "cast"
                    and node.args
                    and _JOB_CLASS.search(ast.unparse(node.args[0]))
                ):
                    found.append(f"{where}:{node.lineno} (cast)")
    return found


def test_the_seam_is_the_list_on_the_architecture_page() -> None:
    # The sides are folders of the package: one renamed away would silently be checked no more.
    package = SRC / PACKAGE
    assert [name for name in FRONT_SIDE + ENGINE_SIDE if not (package / name).is_dir()] == []
    problems = check_seam(SRC, PACKAGE, DOC.read_text(encoding="utf-8"))
    assert problems == [], "\n".join(problems)


def test_no_type_ignore_for_the_job_type() -> None:
    assert job_type_ignores(ROOT) == []


_FIVE = """from typing import Protocol, TypeVar

JobT = TypeVar("JobT")


class Engine(Protocol[JobT]):
    def launch(self, job: JobT) -> None: ...


class Sink(Protocol):
    def done(self, job: object) -> None: ...


class Links: ...


class FastFront: ...


class FastDispatch(Protocol):
    def dispatch(self) -> None: ...
"""

_DOC = """# Architecture

## The seam

- `Engine[JobT]`: the contract.
- `Sink`: what it reports to.
- `Links`: what it is made with.
- `FastFront`: what its fast path uses.
- `FastDispatch`: the fast path.

## Where to go
"""


def _tree(root: Path, files: dict[str, str]) -> None:
    for relative, source in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")


def test_the_seam_check_fails_on_a_sixth_type(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        {
            "__init__.py": "",
            "_front/__init__.py": "",
            "_front/_engine_protocols.py": _FIVE,
            "_jobs/__init__.py": "",
            "_jobs/_scheduler.py": (
                "from typing import Protocol\n\n\n"
                "class Use(Protocol):\n    '''Any object: declares nothing.'''\n\n\n"
                "class Queued(Protocol):\n    stamp: int\n\n\n"
                "class Job:\n    __slots__ = ('stamp',)\n"
            ),
            "_cuda/__init__.py": "",
            "_cuda/_engine.py": (
                "class CudaEngine:\n    def launch(self, job: object) -> None: ...\n"
            ),
        },
    )
    assert check_seam(tmp_path, "pkg", _DOC) == []  # Use declares nothing; Job is the front's
    assert check_seam(tmp_path, "pkg", _DOC.replace("- `Sink`: what it reports to.\n", "")) == [
        "Sink (defined in pkg._front._engine_protocols) is a seam type the architecture page "
        "does not list"
    ]
    # A sixth: a protocol of the front that an engine's class implements, listed or not.
    (tmp_path / "pkg" / "_jobs" / "_runner.py").write_text(
        "from typing import Protocol\n\n\nclass Runner(Protocol):\n"
        "    def is_ready(self, job: object) -> bool: ...\n",
        encoding="utf-8",
    )
    (tmp_path / "pkg" / "_cuda" / "_engine.py").write_text(
        "class CudaEngine:\n    def launch(self, job: object) -> None: ...\n\n"
        "    def is_ready(self, job: object) -> bool:\n        return True\n",
        encoding="utf-8",
    )
    sixth = "- `Runner`: the scheduler's.\n## Where to go"
    assert check_seam(tmp_path, "pkg", _DOC.replace("## Where to go", sixth)) == [
        "6 seam types: Engine, Sink, Links, FastFront, FastDispatch, Runner; at most 5"
    ]
    assert check_seam(tmp_path, "pkg", _DOC) == [
        "Runner (pkg._jobs._runner.Runner, met by pkg._cuda._engine.CudaEngine) is a seam type "
        "the architecture page does not list",
        "6 seam types: Engine, Sink, Links, FastFront, FastDispatch, Runner; at most 5",
    ]
    # The same through the compiled core: a cdef class that has a front protocol's fields.
    (tmp_path / "pkg" / "_jobs" / "_runner.py").unlink()
    (tmp_path / "pkg" / "_jobs" / "_door.py").write_text(
        "from typing import Protocol\n\n\n"
        "class FastJob(Protocol):\n    id: int\n    state: object\n",
        encoding="utf-8",
    )
    (tmp_path / "pkg" / "_cuda" / "_core.pxd").write_text(
        "cdef class FastJob:\n    cdef public object id\n    cdef public object state\n",
        encoding="utf-8",
    )
    assert check_seam(tmp_path, "pkg", _DOC)[0] == (
        "FastJob (pkg._jobs._door.FastJob, met by pkg._cuda._core.FastJob) is a seam type the "
        "architecture page does not list"
    )
    # And a class added to the seam module itself.
    (tmp_path / "pkg" / "_jobs" / "_door.py").unlink()
    seam = tmp_path / "pkg" / "_front" / "_engine_protocols.py"
    seam.write_text(_FIVE + "\n\nclass GraphFront: ...\n", encoding="utf-8")
    assert check_seam(tmp_path, "pkg", _DOC)[-1] == (
        "6 seam types: Engine, Sink, Links, FastFront, FastDispatch, GraphFront; at most 5"
    )
    assert check_seam(tmp_path, "pkg", _DOC.replace("- `FastDispatch`", "- `Gone`")) == [
        "FastDispatch (defined in pkg._front._engine_protocols) is a seam type the architecture "
        "page does not list",
        "GraphFront (defined in pkg._front._engine_protocols) is a seam type the architecture "
        "page does not list",
        "Gone is listed but is no seam type",
        "6 seam types: Engine, Sink, Links, FastFront, FastDispatch, GraphFront; at most 5",
    ]


def test_the_job_ignore_check_catches_planted_ones(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "engine.py").write_text(
        "from typing import cast\n\n\n"
        "class Engine:\n"
        "    def launch(self, job: Job) -> None:\n"
        "        cuda_job: CudaJob = job  # type: ignore[assignment]  # every job is a CudaJob\n"
        "        self.small.stage(job)  # type: ignore[arg-type]\n"
        "        self.run(cast(_HostJob, job))\n"
        "        self.in_flight[job.id] = job  # type: ignore[assignment]\n"
        "        # Not about the job type:\n"
        "        self.pending: Pending = None  # type: ignore[assignment]  # set when numbered\n"
        "        end = block.ptr + job.in_end  # type: ignore[union-attr]  # block is set\n"
        "        text = 'x = job  # type: ignore'  # a string, not a comment\n",
        encoding="utf-8",
    )
    assert job_type_ignores(tmp_path, ("src",)) == [
        "src/engine.py:6",
        "src/engine.py:7",
        "src/engine.py:9",
        "src/engine.py:8 (cast)",
    ]
