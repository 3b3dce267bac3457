"""The demo is a leaf: no product module imports ``hermes.cli.offline_demo`` but the CLI's demo command
(issue 29; STYLE.md: "A demo or a CLI command is a leaf: product code never imports it").

What the product shares with the demo lives where it belongs: deciding an approval in
:mod:`hermes.sessions.approvals`, watching a turn in :mod:`hermes.sessions.live_view`, the servers in
:mod:`hermes.infra.local_servers`, waiting for Ctrl-C in :mod:`hermes.infra.process`, the console
view in :mod:`hermes.cli.chat_view`. Imports are read with :mod:`ast` by the import-cycle
check's graph (lazy imports count, ``if TYPE_CHECKING:`` ones do not).
"""

from __future__ import annotations

from tests.test_import_cycles import REPO_ROOT, TOP_LEVEL_MODULES, TREES, import_graph

DEMO = "hermes.cli.offline_demo"
DEMO_COMMAND = "hermes.cli.demo"
"""The ``hermes demo`` command: the one module allowed to import :data:`DEMO`."""


def test_no_module_but_the_cli_demo_command_imports_the_demo():
    graph = import_graph(REPO_ROOT, TREES, TOP_LEVEL_MODULES)
    assert DEMO in graph and DEMO_COMMAND in graph, f"{DEMO} or {DEMO_COMMAND} not found under {TREES}"
    importers = sorted(name for name, imported in graph.items() if DEMO in imported)
    assert importers == [DEMO_COMMAND], (
        f"{DEMO} is a leaf; only {DEMO_COMMAND} may import it, but these do: {importers}. "
        "Move what they use to a product module (approvals, live_view, local_servers, process, cli.chat_view)."
    )
