"""The house in order: the ground floor imports nothing above it, and no module imports one that imports it."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "django_jobruns"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path], *, everywhere: bool) -> set[str]:
    """The package's modules ``name`` imports: at its top level, or ``everywhere`` (functions too)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    nodes = ast.walk(tree) if everywhere else iter(tree.body)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for candidate in (target, *(f"{target}.{alias.name}" for alias in node.names)):
                if candidate in modules and candidate != name:
                    found.add(candidate)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules and alias.name != name)
    return found


def test_models_import_nothing_of_the_package():
    modules = _modules()
    assert _imports("django_jobruns.models", modules["django_jobruns.models"], modules, everywhere=True) == set()


def test_no_import_circle_among_the_packages_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules, everywhere=False) for name, path in modules.items()}
    circles = []
    for start in graph:
        seen, frontier = set(), list(graph[start])
        while frontier:
            current = frontier.pop()
            if current == start:
                circles.append(start)
                break
            if current not in seen:
                seen.add(current)
                frontier.extend(graph[current])
    assert circles == [], circles


def test_no_vendor_is_named_outside_the_store_the_admin_and_migrations():
    """What a database is and does is the store's knowledge: ``connection.vendor`` is read nowhere else."""
    allowed = (PACKAGE / "store", PACKAGE / "admin", PACKAGE / "migrations")
    naming = []
    for path in PACKAGE.rglob("*.py"):
        if any(path.is_relative_to(folder) for folder in allowed):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ".vendor" in line or '"postgresql"' in line or '"mysql"' in line or '"sqlite"' in line:
                naming.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert naming == [], "\n".join(naming)


def test_the_store_package_imports_nothing_of_the_package_at_its_top():
    """The vendor facts under ``store/`` sit below ``db``: importing one must not import the stores (and models)."""
    modules = _modules()
    assert _imports("django_jobruns.store", modules["django_jobruns.store"], modules, everywhere=False) == set()


def test_importing_a_vendor_fact_loads_no_model():
    """``db`` (which the Tasks backend imports while Django loads TASKS) must import without the app registry."""
    import subprocess
    import sys

    code = (
        "import sys; import django_jobruns.db, django_jobruns.store.errors, django_jobruns.store.watchdog; "
        "print(sorted(m for m in sys.modules if m.startswith('django_jobruns')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    loaded = eval(out.stdout)  # noqa: S307 -- our own subprocess's printed list
    assert "django_jobruns.models" not in loaded
    assert "django_jobruns.store.base" not in loaded


def test_no_module_is_over_450_lines():
    long = {
        str(path.relative_to(ROOT)): count
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts and (count := len(path.read_text().splitlines())) > 450
    }
    assert long == {}, long
