"""The docs name only what exists: test files and tests, the package's modules and their functions, benches."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "RESULTS.md"]
DOCS += sorted((ROOT / "docs").glob("*.md"))
MODULES = sorted(
    path.stem
    for path in (ROOT / "django_jobruns").iterdir()
    if (path.suffix == ".py" and path.stem != "__init__") or (path.is_dir() and (path / "__init__.py").exists())
)
TEST_REF = re.compile(r"(tests/[\w/]+\.py)(?:::([\w*]+))?")
NAME_REF = re.compile(r"`((?:" + "|".join(MODULES) + r")(?:\.[A-Za-z_]\w*)+)")
BENCH_REF = re.compile(r"(?:bench/|\./dev bench )([a-z_]+)(?:\.py)?")


def text() -> str:
    return "\n".join(path.read_text() for path in DOCS if path.exists())


def test_every_test_file_and_test_the_docs_name_exists():
    missing = []
    for path, name in set(TEST_REF.findall(text())):
        file = ROOT / path
        if not file.exists():
            missing.append(path)
            continue
        if name:
            defined = {node.name for node in ast.walk(ast.parse(file.read_text())) if isinstance(node, ast.FunctionDef)}
            pattern = re.compile("^" + re.escape(name).replace(r"\*", ".*") + "$")
            if not any(pattern.match(found) for found in defined):
                missing.append(f"{path}::{name}")
    assert missing == [], missing


def test_every_module_and_function_the_docs_name_exists():
    missing = []
    for ref in sorted(set(NAME_REF.findall(text()))):
        parts = ref.split(".")
        if parts[-1] == "py":
            continue  # a file of a Django project (``admin.py``), not this package's
        target: object = None
        for split in range(len(parts), 0, -1):  # the longest importable module, then attributes
            try:
                target = importlib.import_module("django_jobruns." + ".".join(parts[:split]))
            except ImportError:
                continue
            try:
                for attr in parts[split:]:
                    target = getattr(target, attr)
            except AttributeError:
                target = None
            break
        if target is None:
            missing.append(ref)
    assert missing == [], missing


@pytest.mark.parametrize("name", sorted(set(BENCH_REF.findall(text())) - {"perf", "RESULTS"}))
def test_every_bench_the_docs_name_exists(name):
    assert (ROOT / "bench" / f"{name}.py").exists() or (ROOT / "bench" / name).is_dir(), name


def test_the_readmes_sqlite_settings_pass_the_warning_check():
    """A project that follows the README's set-up passes ``check --fail-level WARNING`` (no jobruns.W001)."""
    from django_jobruns.checks import sqlite_transaction_mode_warnings

    readme = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "transaction_mode" in b]
    assert blocks, "the README shows the SQLite settings"
    project = {"DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}}
    exec(blocks[0], project)  # noqa: S102 -- the README's own settings block
    assert "django_jobruns" in project["INSTALLED_APPS"] and "rangefilter" in project["INSTALLED_APPS"]
    assert sqlite_transaction_mode_warnings(project["DATABASES"]) == []


COMMAND_REF = re.compile(r"manage\.py ([a-z_]+)((?:[^`\n]|`(?!`))*)")
FILE_REF = re.compile(r"(?<![\w/.-])((?:django_jobruns|docs|bench|tests|testproject|\.ci)/[\w./-]*\w)")


def _flags(command: str) -> set[str]:
    from django.core.management import get_commands, load_command_class

    parser = load_command_class(get_commands()[command], command).create_parser("manage.py", command)
    return {option for action in parser._actions for option in action.option_strings}


def _our_commands() -> set[str]:
    folder = ROOT / "django_jobruns" / "management" / "commands"
    return {path.stem for path in folder.glob("*.py") if not path.stem.startswith("_")}


def test_every_command_and_flag_the_readme_names_exists():
    """``manage.py NAME --flag`` in the README: the command exists, and so does each flag it is shown with."""
    from django.core.management import get_commands

    known = set(get_commands())
    problems = []
    for command, rest in COMMAND_REF.findall((ROOT / "README.md").read_text()):
        if command not in known:
            problems.append(f"manage.py {command}: no such command")
            continue
        flags = _flags(command)
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest.split("|")[0].split(";")[0]):
            if flag not in flags:
                problems.append(f"manage.py {command} {flag}: no such flag")
    assert problems == [], problems


def test_every_file_of_the_repository_the_docs_name_exists():
    missing = []
    for ref in sorted(set(FILE_REF.findall(text()))):
        path = ref.rstrip(".")
        if any(ch in path for ch in "*{<") or path.startswith(("tests/support/routed/", "bench/perf")):
            continue
        if not (ROOT / path).exists():
            missing.append(path)
    assert missing == [], missing


#: Flags the README names that belong to other tools (pip, Django's runserver, the demo's ./dev).
OTHER_TOOLS_FLAGS = {"--no-deps", "--insecure", "--no-input", "--fail-level", "--check", "--dry-run", "--ds"}


def test_every_flag_the_readme_names_in_code_belongs_to_a_command():
    """A ``--flag`` in the README's code (inline or in blocks) is one of the app's commands' flags."""
    ours: set[str] = set()
    for command in _our_commands():
        ours |= _flags(command)
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", readme, re.S)
    prose = re.sub(r"```[a-z]*\n.*?```", "", readme, flags=re.S)
    code = " ".join(blocks + re.findall(r"`([^`\n]+)`", prose))
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*[a-z])", code))
    assert named - ours - OTHER_TOOLS_FLAGS == set()
