"""The example code location uses only public names of the library and of Dagster, and the
library never imports the example.

The example (``definitions.py``, ``pipelines.py``, ``assets/``, ``jobs/``, ``resources/``,
``demo.py``, ``webui.py``) is what a team copies into its own project: what it imports from
``streamplatform`` must be something a project may rely on. Read with ``ast``, without importing
the example:

- ``from streamplatform[.<package>] import X``: the module is ``streamplatform`` or one of its
  public packages, and ``X`` is in that module's ``__all__``; ``import streamplatform[.<package>]``
  names a public module too, and an attribute taken from it is in ``__all__``;
- nothing from a private module of Dagster (``dagster._core...``) or a private name of it, and a
  name taken from ``dagster`` is one of its top-level names;
- no module under ``platform/`` imports the example's modules.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_MODULES = ("definitions.py", "pipelines.py", "demo.py", "webui.py")
EXAMPLE_PACKAGES = ("assets", "jobs", "resources")
# The library's public API: streamplatform and the packages it names (each with its __all__).
PUBLIC_MODULES = frozenset({
    "streamplatform", "streamplatform.dagster", "streamplatform.serdes", "streamplatform.state",
    "streamplatform.errors", "streamplatform.dlq", "streamplatform.kafka", "streamplatform.dsl",
    "streamplatform.placement",
})  # fmt: skip
DAGSTER_PACKAGES = ("dagster", "dagster_pyspark")


def example_files() -> list[Path]:
    files = [ROOT / name for name in EXAMPLE_MODULES]
    for package in EXAMPLE_PACKAGES:
        files += sorted((ROOT / package).rglob("*.py"))
    return files


def example_top_level_names() -> set[str]:
    return {Path(name).stem for name in EXAMPLE_MODULES} | set(EXAMPLE_PACKAGES)


def public_names(module: str) -> set[str]:
    return set(importlib.import_module(module).__all__)


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ``["a", "b", "c"]``; None for anything but names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def streamplatform_problems(path: Path, tree: ast.Module) -> Iterator[str]:
    bound: dict[str, str] = {}  # a local name -> the public module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            if top != "streamplatform":
                continue
            if node.module not in PUBLIC_MODULES:
                names = ", ".join(alias.name for alias in node.names)
                yield (f"{_where(path, node)}: from {node.module} import {names}: "
                       f"{node.module} is not a public module of the library")  # fmt: skip
                continue
            exported = public_names(node.module)
            for alias in node.names:
                if alias.name not in exported:
                    yield (f"{_where(path, node)}: {node.module}.{alias.name} is not in "
                           f"{node.module}.__all__")  # fmt: skip
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "streamplatform":
                    continue
                if alias.name not in PUBLIC_MODULES:
                    yield (f"{_where(path, node)}: import {alias.name}: not a public module of "
                           "the library")  # fmt: skip
                elif alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound["streamplatform"] = "streamplatform"
    if not bound:
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
            continue
        parts = _dotted(node)
        if parts is None or parts[0] not in bound:
            continue
        module, rest = bound[parts[0]], parts[1:]
        while rest and f"{module}.{rest[0]}" in PUBLIC_MODULES:
            module, rest = f"{module}.{rest[0]}", rest[1:]
        if rest and rest[0] not in public_names(module):
            yield f"{_where(path, node)}: {module}.{rest[0]} is not in {module}.__all__"


def dagster_problems(path: Path, tree: ast.Module) -> Iterator[str]:
    bound: dict[str, str] = {}  # a local name -> the Dagster package it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] not in DAGSTER_PACKAGES:
                continue
            if len(parts) > 1:
                yield (f"{_where(path, node)}: from {node.module} import ...: a module inside "
                       f"{parts[0]}, import its public names from {parts[0]} itself")  # fmt: skip
                continue
            for alias in node.names:
                yield from _dagster_name(path, node, parts[0], alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] not in DAGSTER_PACKAGES:
                    continue
                if len(parts) > 1:
                    yield f"{_where(path, node)}: import {alias.name}: a module inside {parts[0]}"
                else:
                    bound[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in bound):  # fmt: skip
            yield from _dagster_name(path, node, bound[node.value.id], node.attr)


def _dagster_name(path: Path, node: ast.AST, package: str, name: str) -> Iterator[str]:
    module = importlib.import_module(package)
    public = getattr(module, "__all__", None)
    if name.startswith("_"):
        yield f"{_where(path, node)}: {package}.{name} is private"
    elif public is not None and name not in public:
        yield f"{_where(path, node)}: {package}.{name} is not in {package}.__all__"
    elif public is None and name not in vars(module):
        # dagster has no __all__: its public API is what its __init__ defines (names it serves
        # through __getattr__ are deprecated aliases).
        yield f"{_where(path, node)}: {package}.{name} is not a top-level name of {package}"


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_the_example_is_where_this_test_looks():
    files = example_files()
    assert all(path.is_file() for path in files)
    assert {path.parent.name for path in files} >= set(EXAMPLE_PACKAGES)
    # The check itself sees what it must refuse.
    bad = ast.parse(
        "import dagster as dg\n"
        "import streamplatform\n"
        "from streamplatform.runtime.logs import CommitLog\n"
        "from streamplatform.dagster import lateness\n"
        "from dagster._core.storage.tags import RUN_KEY_TAG\n"
        "x = dg._core\n"
        "y = streamplatform.home\n"
    )
    fake = ROOT / "definitions.py"
    problems = [*streamplatform_problems(fake, bad), *dagster_problems(fake, bad)]
    assert len(problems) == 5, problems


@pytest.mark.parametrize("path", example_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_example_uses_public_names_only(path):
    tree = parsed(path)
    problems = [*streamplatform_problems(path, tree), *dagster_problems(path, tree)]
    assert not problems, "\n".join(problems)


def test_public_modules_export_what_they_list():
    """Every name of a public module's ``__all__`` is there (the lazy ones load)."""
    for module_name in sorted(PUBLIC_MODULES):
        module = importlib.import_module(module_name)
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, f"{module_name}.__all__ lists {missing}, which it does not have"


def test_the_run_tags_are_dagsters():
    """jobs/in_process.py tags runs with Dagster's documented tag strings; Dagster's own
    (private) constants are what the daemon uses."""
    from dagster._core.storage import tags

    from jobs import in_process

    assert in_process.RUN_KEY_TAG == tags.RUN_KEY_TAG
    assert in_process.SENSOR_NAME_TAG == tags.SENSOR_NAME_TAG
    assert in_process.SCHEDULE_NAME_TAG == tags.SCHEDULE_NAME_TAG


def test_the_library_never_imports_the_example():
    example = example_top_level_names()
    problems = []
    for path in sorted((ROOT / "platform").rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            problems += [
                f"{_where(path, node)}: imports {module}"
                for module in modules
                if module.split(".")[0] in example
            ]
    assert not problems, "\n".join(problems)


# Exceptions of the package that are not an operator's to catch, and why: each is left out of
# the root or of ``streamplatform``'s exports on purpose. A new error is under the root and
# exported, or it is added here with its reason.
INTERNAL_ERRORS = {
    # Tests' fault injection (STREAMPLATFORM_FAIL_ONCE) stands for a crash: it must not be caught
    # as a platform error by ``except StreamPlatformError``, and no operator ever sees it.
    "streamplatform.runtime.faults.InjectedFailure",
    # `streamplatform topics produce|consume`'s one-line errors: under the root (the CLI prints
    # them as one line), but raised and caught inside the command, never an API's.
    "streamplatform.kafka.topic_tools.TopicToolError",
}


def package_modules() -> tuple[list[object], list[str]]:
    """Every module of ``streamplatform``, imported; and those left out, with why: only a
    module whose import needs a third-party package that is not installed (an optional extra)
    is left out, any other import error fails the test."""
    import pkgutil

    import streamplatform

    modules, left_out = [], []
    for info in pkgutil.walk_packages(streamplatform.__path__, "streamplatform."):
        try:
            modules.append(importlib.import_module(info.name))
        except ImportError as error:
            missing = error.name or ""
            if not missing or missing.split(".")[0] == "streamplatform":
                raise
            left_out.append(f"{info.name} (needs {missing})")
    return modules, left_out


def test_every_error_an_operator_catches_has_one_exported_root():
    """Every exception class the package defines derives from ``StreamPlatformError`` and is
    exported from ``streamplatform``, but for the commented INTERNAL_ERRORS. Found by walking
    every module, so that a new error cannot be missed by a list here."""
    import inspect

    import streamplatform
    from streamplatform.serdes import SerializationError

    root = streamplatform.StreamPlatformError
    modules, left_out = package_modules()
    errors = {
        f"{module.__name__}.{name}": value
        for module in modules
        for name, value in vars(module).items()
        if inspect.isclass(value) and issubclass(value, Exception)
        and not issubclass(value, Warning)  # a warning category is no error
        and value.__module__ == module.__name__ and not name.startswith("_")
    }  # fmt: skip
    assert len(errors) > 20, sorted(errors)  # the walk found the package's errors
    assert errors.keys() >= INTERNAL_ERRORS, "INTERNAL_ERRORS names a class that is gone"
    public = {path: error for path, error in errors.items() if path not in INTERNAL_ERRORS}
    not_rooted = sorted(path for path, error in public.items() if not issubclass(error, root))
    assert not not_rooted, f"not under StreamPlatformError: {not_rooted} (left out: {left_out})"
    not_exported = sorted(
        path for path, error in public.items()
        if error.__name__ not in streamplatform.__all__
        or getattr(streamplatform, error.__name__) is not error
    )  # fmt: skip
    assert not not_exported, f"not exported from streamplatform: {not_exported}"
    # The built-in bases stay, so that code catching those goes on working.
    assert issubclass(streamplatform.ConfigError, ValueError)
    assert issubclass(streamplatform.KafkaInputError, RuntimeError)
    assert issubclass(streamplatform.QueryError, ValueError)
    assert issubclass(streamplatform.NoSuitableJava, FileNotFoundError)
    assert issubclass(streamplatform.TopicNotAuthorizedError, LookupError)
    # A record's fault stays the handlers' (process_all lets StreamsError fail the task).
    assert not issubclass(SerializationError, streamplatform.StreamsError)
