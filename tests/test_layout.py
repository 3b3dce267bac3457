"""The top of ``hermes/`` holds the public modules and packages named by concern (issue 29).

A user imports ``hermes.models``, ``hermes.errors``, ``hermes.names`` and ``hermes.settings``
(README, examples); everything else lives in a package whose name says its concern
(README "Layout"). A new module at the top, or a new package, is a layout decision: make it
here and in the README's table. The check reads the file tree and the packages' sources
with :mod:`ast`; it imports nothing.
"""

from __future__ import annotations

import ast

from tests.test_import_cycles import REPO_ROOT

HERMES = REPO_ROOT / "hermes"

TOP_MODULES = frozenset({"__init__.py", "errors.py", "models.py", "names.py", "settings.py"})
"""The modules at the top of ``hermes/``: the package itself and the public surface."""

PACKAGES = frozenset(
    {"api", "cli", "client", "content", "infra", "mcp", "memory", "providers", "security", "sessions", "tools"}
)
"""The packages under ``hermes/``, each listed with its concern in README "Layout"."""

DATA_DIRECTORIES = frozenset({"scripts"})
"""Directories of package data, not code (``hermes/scripts/demo.yaml``)."""


def test_the_top_of_hermes_holds_only_the_public_modules():
    found = {path.name for path in HERMES.glob("*.py")}
    assert found == TOP_MODULES, (
        f"modules at the top of hermes/ other than the public surface: {sorted(found - TOP_MODULES)}; "
        f"missing: {sorted(TOP_MODULES - found)}. Put a module in the package of its concern (README 'Layout')."
    )


def test_every_directory_of_hermes_is_a_listed_package_or_package_data():
    directories = {path.name for path in HERMES.iterdir() if path.is_dir() and path.name != "__pycache__"}
    packages = {name for name in directories if (HERMES / name / "__init__.py").exists()}
    assert packages == PACKAGES, f"unlisted: {sorted(packages - PACKAGES)}; gone: {sorted(PACKAGES - packages)}"
    assert directories - packages == DATA_DIRECTORIES


def test_every_package_of_hermes_says_its_concern_and_star_imports_nothing():
    for name in sorted(PACKAGES):
        path = HERMES / name / "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        assert ast.get_docstring(tree), f"{path}: a package's docstring says its concern"
        stars = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.names[0].name == "*"]
        assert not stars, f"{path}:{stars}: a star import hides what the package exports"


def _is_main_guard(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return (
        isinstance(node, ast.If)
        and isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def test_a_scripts_main_guard_is_its_last_statement():
    # Run as a script (``python worker.py``), a module runs main() when it reaches the
    # guard: a function defined after it did not exist yet (worker.py's embedder preload
    # failed with a NameError this way, and the first memory searches paid for it).
    late: list[str] = []
    for path in sorted(REPO_ROOT.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).parts
        if parts[0].startswith(".") or "site-packages" in parts or "node_modules" in parts:
            continue
        body = ast.parse(path.read_text(encoding="utf-8")).body
        guards = [i for i, node in enumerate(body) if _is_main_guard(node)]
        if guards and guards[-1] != len(body) - 1:
            after = body[guards[-1] + 1]
            late.append(f"{path.relative_to(REPO_ROOT)}:{after.lineno}")
    assert not late, f"statements after the `if __name__ == '__main__':` guard, undefined when run as a script: {late}"
