"""Where the third-party MCP servers that ``install.sh`` installs are, as stdio commands.

Each function returns ``(command, args)`` for ``mcp.StdioServerParameters`` (or an
``mcpServers`` entry), with absolute paths, or ``None`` when that server is not installed
here. Tests pass the result to :func:`need`, which skips the test with the reason and the
command that installs it, except where ``HERMES_TEST_MCP_SERVERS_REQUIRED`` is set (as
``.ci/run`` does), where it fails the test instead: CI installs them, so they never skip
there.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / "npm" / "node_modules"
VENV = HERE / "py" / ".venv"
INSTALL_COMMAND = "bash tests/mcp_servers/install.sh"
REQUIRED_ENV = "HERMES_TEST_MCP_SERVERS_REQUIRED"
MIN_NODE_MAJOR = 20

StdioCommand = tuple[str, list[str]]


@functools.cache
def node() -> str | None:
    """The Node.js binary the npm servers run on.

    Returns:
        The one ``install.sh`` chose (recorded in ``npm/node_modules/.hermes-node``), else a
        ``node`` on ``PATH`` of major version 20 or newer; ``None`` if there is neither.
    """
    recorded = NODE_MODULES / ".hermes-node"
    if recorded.is_file():
        path = recorded.read_text(encoding="utf-8").strip()
        if path and os.access(path, os.X_OK):
            return path
    found = shutil.which("node")
    if found is None:
        return None
    try:
        out = subprocess.run(
            [found, "-p", "process.versions.node.split('.')[0]"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return found if int(out.strip()) >= MIN_NODE_MAJOR else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _npm_server(package: str, args: list[str]) -> StdioCommand | None:
    """``node <package's bin script> <args>``, or ``None`` if node or the package is missing."""
    script = NODE_MODULES / "@modelcontextprotocol" / package / "dist" / "index.js"
    binary = node()
    if binary is None or not script.is_file():
        return None
    return binary, [str(script), *args]


def _venv_script(name: str, args: list[str]) -> StdioCommand | None:
    """A console script of the servers' venv with ``args``, or ``None`` if it is missing."""
    script = VENV / "bin" / name
    if not os.access(script, os.X_OK):
        return None
    return str(script), args


def everything_stdio() -> StdioCommand | None:
    """``@modelcontextprotocol/server-everything`` over stdio (its first argument picks the
    transport: ``stdio``, ``sse`` or ``streamableHttp``)."""
    return _npm_server("server-everything", ["stdio"])


def everything_http() -> StdioCommand | None:
    """``@modelcontextprotocol/server-everything`` serving streamable HTTP at ``/mcp``; it
    listens on the port in its ``PORT`` environment variable (default 3001), on every
    interface."""
    return _npm_server("server-everything", ["streamableHttp"])


def filesystem_stdio(root: Path, *more_roots: Path) -> StdioCommand | None:
    """``@modelcontextprotocol/server-filesystem`` allowed to read and write under ``root``
    (and ``more_roots``), which must exist; paths outside them are refused by the server."""
    roots = [str(Path(r).resolve()) for r in (root, *more_roots)]
    return _npm_server("server-filesystem", roots)


def memory_stdio() -> StdioCommand | None:
    """``@modelcontextprotocol/server-memory``, a knowledge graph (entities, relations,
    observations) kept in the JSON-lines file named by its ``MEMORY_FILE_PATH``
    environment variable (default: beside its script); offline."""
    return _npm_server("server-memory", [])


def time_stdio(local_timezone: str = "UTC") -> StdioCommand | None:
    """``mcp-server-time`` with a fixed local time zone (an IANA name), so that its answers
    do not depend on the machine's."""
    return _venv_script("mcp-server-time", ["--local-timezone", local_timezone])


def git_stdio(repo: Path) -> StdioCommand | None:
    """``mcp-server-git`` restricted to the git repository ``repo`` (needs ``git`` on ``PATH``)."""
    return _venv_script("mcp-server-git", ["--repository", str(Path(repo).resolve())])


def need(command: StdioCommand | None, server: str) -> StdioCommand:
    """``command`` itself, or the end of the calling test if the server is not installed.

    Args:
        command: What one of the functions above returned.
        server: The server's name, for the message.

    Returns:
        ``command`` when it is not ``None``.

    Raises:
        pytest.skip.Exception: ``command`` is ``None`` (the message names the install command).
        pytest.fail.Exception: the same where ``HERMES_TEST_MCP_SERVERS_REQUIRED`` is set.
    """
    if command is not None:
        return command
    reason = f"MCP server {server} is not installed; run `{INSTALL_COMMAND}`"
    if os.environ.get(REQUIRED_ENV):
        pytest.fail(f"{reason} ({REQUIRED_ENV} is set, as in CI)")
    pytest.skip(reason)
