"""Which tests start heavy processes of their own, read from their source, and the marker each
such test must carry. ``tests/conftest.py`` fails the collection (``pytest.UsageError``) when a
test does without it, so that ``make test`` (which deselects these markers) stays fast.

What is read: the test function's source, that of the fixtures it requests, and, through the
names they use, that of the helpers (functions, classes) and the string constants (driver
scripts) of the tests' own modules, transitively. Library code (``streamplatform``, ``webui``,
``demo``) is not read: a test that starts ``dagster dev`` calls ``webui.dagster_dev(...)``, a
cluster ``LocalCluster(...)``, and those calls are what is looked for.

Three views of that source, so that a pattern meets only what it is about:

- ``bare``: the code without its docstrings, comments or string contents (calls by name);
- ``commands``: each list, tuple or call as its string items and arguments joined by spaces,
  anything else as ``?`` (``[sys.executable, "-m", "streamplatform.cli", "run", ...]`` is
  ``? -m streamplatform.cli run ...``), the callee's name first for a call;
- ``strings``: every string constant but docstrings, and the string (or path) constants named
  in the code: the scripts a child process runs.

A light child process (a ``python -c`` that holds a store's lock, computes a fingerprint, or
exits holding a claim; a Java reference run; ``dagster definitions validate``) is no driver: it
starts no streaming job and no Spark, and needs no marker. A `streamplatform run` child does,
even one expected to stop before Spark starts.

Not seen: a heavy process started by a library helper other than those named above, or from a
fixture got with ``request.getfixturevalue``; a string that names a driver's code (say
``"StreamingJob("``) in a test with a light child process would be taken for its script.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent

# The markers of heavy outside processes, with their pyproject.toml descriptions.
MARKERS = {
    "child_process": "starts a child driver: a `streamplatform run` or python subprocess "
    "running a streaming job (its own SparkSession)",
    "cluster": "starts a multi-process Spark standalone cluster (LocalCluster, spark://)",
    "connect_server": "starts a Spark Connect server (LocalConnectServer, sc://)",
    "dagster_dev": "starts dagster dev, dagster-webserver, dagster-daemon or a code server "
    "(and the runs they launch)",
    "browser": "starts a headless browser (chromium)",
}

# A child process of any kind (in ``bare``).
_SPAWN = re.compile(
    r"\bsubprocess\.(?:run|Popen|call|check_call|check_output)\(|\bPopen\("
    r"|\bos\.(?:system|popen|spawn\w*|exec[lv]\w*|posix_spawn\w*)\("
    r"|(?<!psutil)\.Process\(|\bcreate_subprocess_\w+\("
)
# What makes a child process a driver: the script it runs starts a job or Spark (``strings``),
# or its command is `streamplatform run` or demo.py (``commands``).
_DRIVER_SCRIPT = re.compile(
    r"\bStreamingJob\(|\bspark_session\(|\bSparkSession\b|\.run_until_caught_up\(|\.run_forever\("
)
_DRIVER_COMMAND = re.compile(
    r"(?:^|\s)(?:-m streamplatform\.cli|\S*streamplatform|console_command) run(?:\s|$)"
    r"|(?:^|\s)\S*demo\.py(?:\s|$)|^make(?: \S+)* demo(?:\s|$)"
)


@dataclass
class Source:
    """The three views of a test's source (see the module's docstring)."""

    bare: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    strings: list[str] = field(default_factory=list)

    def has(self, view: str, pattern: re.Pattern[str]) -> str | None:
        """The first match of ``pattern`` in ``view``, for the message; None without one."""
        for text in getattr(self, view):
            found = pattern.search(text)
            if found:
                return found.group(0).strip()
        return None


def _rule(*checks: tuple[str, str]) -> Callable[[Source], str | None]:
    compiled = [(view, re.compile(pattern)) for view, pattern in checks]

    def evidence(source: Source) -> str | None:
        for view, pattern in compiled:
            found = source.has(view, pattern)
            if found:
                return found
        return None

    return evidence


_CLUSTER = _rule(
    ("bare", r"\bLocalCluster\("),
    ("commands", r"(?:^|\s)-m streamplatform\.local_cluster(?:\s|$)"),
    ("strings", r"\blocal-cluster\[|\bstart-(?:master|worker)\.sh\b|\bdeploy\.master\.Master\b"),
)
_CONNECT_SERVER = _rule(
    ("bare", r"\bLocalConnectServer\("),
    ("strings", r"\bSparkConnectServer\b|\bstart-connect-server\.sh\b"),
)
_DAGSTER_DEV = _rule(
    ("bare", r"\bdagster_dev\(|\bwebui\.dev\("),
    ("commands", r"^(?:\S*/)?dagster(?: -\S+)* dev(?:\s|$)|^\? -m dagster dev(?:\s|$)"),
    ("commands", r"^(?:\S*/)?dagster(?: -\S+)* (?:api grpc|code-server start)(?:\s|$)"),
    ("commands", r"^(?:\S*/)?dagster-(?:webserver|daemon)(?:\s|$)"),
    ("commands", r"^make(?: \S+)* ui(?:\s|$)"),
    ("strings", r"^\S*/dagster-(?:webserver|daemon)$"),
)
_BROWSER = _rule(
    ("bare", r"\bchromium\(|\bplaywright\b|\bselenium\b"),
    ("commands", r"^\S*chrom(?:e|ium)\b"),
    ("strings", r"--headless\b|--remote-debugging-port\b"),
)


def _child_process(source: Source) -> str | None:
    spawn = source.has("bare", _SPAWN)
    if spawn is None:
        return None
    driver = source.has("strings", _DRIVER_SCRIPT) or source.has("commands", _DRIVER_COMMAND)
    return f"{spawn} running {driver}" if driver else None


RULES: dict[str, Callable[[Source], str | None]] = {
    "child_process": _child_process,
    "cluster": _CLUSTER,
    "connect_server": _CONNECT_SERVER,
    "dagster_dev": _DAGSTER_DEV,
    "browser": _BROWSER,
}


def required_markers(source: Source) -> dict[str, str]:
    """Marker -> what in ``source`` calls for it."""
    found = {}
    for marker, rule in RULES.items():
        evidence = rule(source)
        if evidence:
            found[marker] = evidence
    return found


# --- reading a test's source ---------------------------------------------------------------


@functools.cache
def _within(filename: str | None, root: Path) -> bool:
    return filename is not None and Path(filename).resolve().is_relative_to(root)


def _namespace(obj: Any) -> dict[str, Any]:
    globals_ = getattr(obj, "__globals__", None)
    if globals_ is not None:
        return dict(globals_)
    module = sys.modules.get(getattr(obj, "__module__", ""), None)
    return vars(module) if module is not None else {}


def _without_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                node.body[0] = ast.Pass() if isinstance(first.value.value, str) else first


class _Blank(ast.NodeTransformer):
    """Every string constant emptied, f-strings too: the code around them is what is left."""

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        return ast.Constant("") if isinstance(node.value, str) else node

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        return ast.Constant("")


def _item_text(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.replace(" ", "\\ ") if node.value else "''"
    return "?"


def _commands(tree: ast.AST) -> list[str]:
    commands = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List | ast.Tuple):
            items = [_item_text(element) for element in node.elts]
        elif isinstance(node, ast.Call):
            callee = node.func
            name = callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "?")
            items = [name, *(_item_text(arg) for arg in node.args)]
        else:
            continue
        if any(item != "?" for item in items):
            commands.append(" ".join(items))
    return commands


def _is_literal(node: ast.expr) -> bool:
    """A string written in the source: "...", f"...", dedent("..."), with_name("..."), a + b."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.Call):
        return bool(node.args) and _is_literal(node.args[0])
    if isinstance(node, ast.BinOp):
        return _is_literal(node.left) and _is_literal(node.right)
    return False


@functools.cache
def _literal_names(filename: str) -> frozenset[str]:
    """The module-level names of ``filename`` bound to a string written in it (a driver
    script, a command's path); not to text read from elsewhere, such as a document."""
    try:
        tree = ast.parse(Path(filename).read_text())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and _is_literal(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.value is not None
            and _is_literal(node.value)
        ):
            names.add(node.target.id)
    return frozenset(names)


class _Reader:
    """Reads the source of tests under ``root`` (see the module's docstring), each function or
    class once: helpers are shared by many tests."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules = [
            module
            for module in list(sys.modules.values())
            if _within(getattr(module, "__file__", None), root)
        ]
        self.parsed: dict[Any, tuple[Source, list[Any]] | None] = {}

    def ours(self, obj: Any) -> bool:
        """Defined in a file under the root (the tests: helpers, fixtures, driver scripts),
        not in a library."""
        try:
            return _within(inspect.getsourcefile(obj), self.root)
        except TypeError:
            return False

    def written_in(self, name: str, value: Any, namespace: dict[str, Any]) -> bool:
        """Whether ``name`` (a string or path of ``namespace``) is written in a module under
        the root: the namespace's own, or the one it was imported from."""
        files = [namespace.get("__file__")]
        files += [m.__file__ for m in self.modules if getattr(m, name, None) is value]
        return any(_within(f, self.root) and name in _literal_names(str(f)) for f in files)

    def referenced(self, tree: ast.AST, namespace: dict[str, Any]) -> Iterable[Any]:
        """The functions and classes of ``namespace`` the code names (also as ``module.name``
        of a module under the root), and the strings and paths among them written there."""
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in namespace:
                name, value, where = node.id, namespace[node.id], namespace
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and isinstance(namespace.get(node.value.id), ModuleType)
                and self.ours(namespace[node.value.id])
                and hasattr(namespace[node.value.id], node.attr)
            ):
                module = namespace[node.value.id]
                name, value, where = node.attr, getattr(module, node.attr), vars(module)
            else:
                continue
            if isinstance(value, str | Path):
                if self.written_in(name, value, where):
                    yield value
            elif inspect.isfunction(value) or inspect.isclass(value):
                yield value

    def parse(self, obj: Any) -> tuple[Source, list[Any]] | None:
        """The views of one function or class under the root, and what it names."""
        if obj in self.parsed:
            return self.parsed[obj]
        self.parsed[obj] = None
        if (inspect.isfunction(obj) or inspect.isclass(obj)) and self.ours(obj):
            try:
                tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
            except (OSError, SyntaxError):
                return None
            _without_docstrings(tree)
            strings = [
                node.value
                for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
            ]
            commands = _commands(tree)
            referenced = list(self.referenced(tree, _namespace(obj)))
            bare = ast.unparse(_Blank().visit(tree))
            self.parsed[obj] = (Source([bare], commands, strings), referenced)
        return self.parsed[obj]

    def read(self, objects: Iterable[Any]) -> Source:
        source = Source()
        queue = [inspect.unwrap(obj) if callable(obj) else obj for obj in objects]
        seen: set[int] = set()
        while queue:
            obj = queue.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if isinstance(obj, str | Path):
                source.strings.append(str(obj))
                continue
            parsed = self.parse(obj)
            if parsed is not None:
                views, referenced = parsed
                source.bare += views.bare
                source.commands += views.commands
                source.strings += views.strings
                queue.extend(referenced)
        return source


def read_source(objects: Iterable[Any], root: Path = TESTS) -> Source:
    """The three views of ``objects`` (test functions, fixture functions) and, transitively,
    of the helpers and constants under ``root`` that they name."""
    return _Reader(root).read(objects)


# --- the collection check ------------------------------------------------------------------


def _missing_markers(
    item: Any, reader: _Reader, needs: dict[tuple, dict[str, str]]
) -> dict[str, str]:
    """For a collected test (a ``pytest.Function``): each marker it needs but lacks, with
    what in its source (or its fixtures') calls for it. ``needs``: what the tests read so far
    need (the cases of a parametrized test share their source)."""
    fixtures = []
    name2fixturedefs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        definitions = name2fixturedefs.get(name)
        if definitions:
            fixtures.append(definitions[-1].func)
    key = (item.function, *fixtures)
    if key not in needs:
        needs[key] = required_markers(reader.read(key))
    needed = needs[key]
    return {
        marker: evidence
        for marker, evidence in needed.items()
        if item.get_closest_marker(marker) is None
    }


def check(items: Iterable[Any], root: Path = TESTS) -> list[str]:
    """One line per test and marker it needs but lacks (empty when all is well)."""
    reader = _Reader(root)
    needs: dict[tuple, dict[str, str]] = {}
    problems = []
    for item in items:
        if not hasattr(item, "function"):
            continue  # a doctest
        for marker, evidence in _missing_markers(item, reader, needs).items():
            problems.append(
                f"{item.nodeid} lacks @pytest.mark.{marker} ({MARKERS[marker]}); "
                f"its source has {evidence!r}"
            )
    return problems


def fail_on_missing_markers(items: Iterable[Any], root: Path = TESTS) -> None:
    """``pytest.UsageError`` naming each test under ``root`` that lacks a marker it needs."""
    problems = check(items, root)
    if problems:
        raise pytest.UsageError(
            "tests that start heavy processes must carry their marker (tests/process_markers.py,"
            " README.md: Tests):\n  " + "\n  ".join(problems)
        )
