"""No import cycles under ``workflows/``, ``activities/`` and ``hermes/`` (issue 14, STYLE.md).

The check reads the source with :mod:`ast`, imports nothing, and builds one graph of
"module A imports module B". What counts as an import:

- every ``import`` / ``from ... import`` statement anywhere in the module: at module level,
  inside functions and methods (lazy imports), inside ``with
  workflow.unsafe.imports_passed_through():``, inside ``try``. A lazy import runs the
  other module just the same, only later, so it cannot hide a circle;
- except those under ``if TYPE_CHECKING:``, which never run;
- relative imports are resolved against the importing module's package;
- ``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg``
  (its ``__init__``);
- ``import a.b.c`` imports ``a.b.c`` only: Python also initialises ``a`` and ``a.b`` first,
  but counting that would make every package whose ``__init__`` re-exports a submodule
  look circular with the submodule's siblings.

Only edges between modules of the three trees (and the top-level ``worker`` module, a
cycle through which is just as real) are kept. A cycle fails the test, named module by
module: ``hermes.tools.registry -> hermes.tools.files -> hermes.tools.registry``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TREES = ("workflows", "activities", "hermes")
TOP_LEVEL_MODULES = ("worker",)


def find_modules(root: Path, trees: Iterable[str], top_level: Iterable[str] = ()) -> dict[str, Path]:
    """Module name -> source file of every ``.py`` under ``root/<tree>`` (and ``root/<name>.py``).

    A package is named by its directory (``hermes.cli`` for ``hermes/cli/__init__.py``).
    """
    modules: dict[str, Path] = {}
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    for name in top_level:
        path = root / f"{name}.py"
        if path.exists():
            modules[name] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement in ``tree``, at any depth, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the `else:` of `if TYPE_CHECKING:` does run
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that module ``name`` (source ``path``) imports.

    Raises:
        SyntaxError: the source does not parse.
        ValueError: a relative import that climbs above the top-level package.
    """
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        if node.level:
            base = package.split(".") if package else []
            if node.level > len(base):
                raise ValueError(f"{path}:{node.lineno}: relative import climbs above the top-level package")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            submodule = f"{target}.{alias.name}" if target else alias.name
            found.add(submodule if submodule in modules else target)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path, trees: Iterable[str], top_level: Iterable[str] = ()) -> dict[str, set[str]]:
    """Module -> the modules it imports, for every module of ``trees`` under ``root``."""
    modules = find_modules(root, trees, top_level)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One concrete cycle per strongly connected component with more than one module.

    Returns:
        Each cycle as a path that starts and ends with the same module
        (``["a", "b", "a"]``), smallest module first; sorted; empty if there is none.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    counter = 0
    # Iterative Tarjan: the graph has hundreds of modules, recursion would be fragile.
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return sorted(_a_cycle_in(component, graph) for component in components)


def _a_cycle_in(component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's smallest module back to itself."""
    first = min(component)
    previous: dict[str, str] = {}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == first:
                    path = [node]
                    while path[-1] != first:
                        path.append(previous[path[-1]])
                    return [*reversed(path), first]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {first} in its own component")  # Tarjan guarantees one


def describe(cycles: list[list[str]]) -> str:
    return "; ".join(" -> ".join(cycle) for cycle in cycles)


# ------------------------------------------------------------------ the repository


def test_no_module_under_workflows_activities_or_hermes_imports_one_that_imports_it_back():
    graph = import_graph(REPO_ROOT, TREES, TOP_LEVEL_MODULES)
    assert len(graph) > 50, f"found only {len(graph)} modules under {TREES}: is REPO_ROOT right?"
    cycles = find_cycles(graph)
    assert not cycles, f"import cycles (lazy imports count): {describe(cycles)}"


# ------------------------------------------------------------------ the checker itself


def _package(root: Path, files: dict[str, str]) -> Path:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root


def test_a_two_module_circle_is_found_and_named(tmp_path):
    root = _package(
        tmp_path,
        {"pkg/__init__.py": "", "pkg/a.py": "from pkg.b import thing\n", "pkg/b.py": "import pkg.a\nthing = 1\n"},
    )
    cycles = find_cycles(import_graph(root, ["pkg"]))
    assert describe(cycles) == "pkg.a -> pkg.b -> pkg.a"


def test_a_circle_closed_by_a_lazy_relative_import_inside_a_passthrough_block_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "",
            "pkg/sub/flow.py": (
                "from temporalio import workflow\n"
                "with workflow.unsafe.imports_passed_through():\n"
                "    from ..helpers import helper\n"
            ),
            "pkg/helpers.py": "def helper():\n    from .sub import flow\n    return flow\n",
        },
    )
    graph = import_graph(root, ["pkg"])
    assert graph["pkg.sub.flow"] == {"pkg.helpers"}
    assert graph["pkg.helpers"] == {"pkg.sub.flow"}  # `from .sub import flow`: flow is a module
    assert describe(find_cycles(graph)) == "pkg.helpers -> pkg.sub.flow -> pkg.helpers"


def test_from_a_package_import_of_a_plain_name_is_an_import_of_the_package(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import run\nVERSION = 1\n",
            "pkg/a.py": "from pkg import VERSION\ndef run():\n    return VERSION\n",
        },
    )
    assert describe(find_cycles(import_graph(root, ["pkg"]))) == "pkg -> pkg.a -> pkg"


def test_a_longer_circle_is_named_by_its_shortest_path(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": "import pkg.c\n",
            "pkg/c.py": "try:\n    import pkg.a\nexcept ImportError:\n    pass\n",
        },
    )
    assert describe(find_cycles(import_graph(root, ["pkg"]))) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"


def test_type_checking_imports_parent_packages_and_outside_modules_make_no_circle(tmp_path):
    root = _package(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import run\n",
            "pkg/a.py": "import json\nfrom pkg.b import helper\ndef run():\n    return helper()\n",
            "pkg/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.a import run\n"
                "def helper():\n    return 1\n"
            ),
        },
    )
    graph = import_graph(root, ["pkg"])
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert find_cycles(graph) == []


def test_a_relative_import_above_the_top_level_package_is_refused(tmp_path):
    root = _package(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .. import nothing\n"})
    with pytest.raises(ValueError, match="climbs above"):
        import_graph(root, ["pkg"])
