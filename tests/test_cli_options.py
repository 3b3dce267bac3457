"""The options of the ``hermes`` commands, read from the Click command tree (no servers).

Each command group of ``hermes/cli/`` declares its options in its own module; these tests
catch one group's option leaking into another's (the memory group's required ``--user``
once replaced the shared one, so ``chat``, ``send`` and ``sessions`` ignored HERMES_USER).
"""

from __future__ import annotations

from typing import Any

import pytest
import typer.main

from hermes.cli import app


def _context(command: Any) -> Any:
    # Typer vendors its own Click (typer._click): take the Context class from the command.
    return command.context_class(command)


def _option(path: tuple[str, ...], name: str) -> Any:
    command = typer.main.get_command(app)
    for part in path:
        assert hasattr(command, "get_command"), f"{part!r}: {command.name} has no subcommands"
        found = command.get_command(_context(command), part)
        assert found is not None, f"no command {' '.join(path)}"
        command = found
    for param in command.params:
        if param.name == name and param.param_type_name == "option":
            return param
    raise AssertionError(f"hermes {' '.join(path)} has no option {name!r}")


@pytest.mark.parametrize("path", [("chat",), ("send",), ("sessions",)])
def test_the_user_of_a_conversation_command_defaults_to_hermes_user(path):
    user = _option(path, "user")
    assert user.envvar == "HERMES_USER" and not user.required
    assert "HERMES_USER" in (user.help or "")


@pytest.mark.parametrize("path", [("approve",), ("reject",)])
def test_the_approver_defaults_to_hermes_user(path):
    assert _option(path, "approver").envvar == "HERMES_USER"


@pytest.mark.parametrize("path", [("memory", "search"), ("memory", "list"), ("memory", "add"), ("memory", "forget")])
def test_a_memory_command_needs_an_explicit_user(path):
    user = _option(path, "user")
    assert user.required and user.envvar is None


def test_every_command_group_is_registered_in_the_order_of_the_help():
    command = typer.main.get_command(app)
    assert list(command.list_commands(_context(command))) == [
        "dev", "worker", "codec-server", "demo", "chat", "send", "sessions", "show", "close", "repair",
        "approve", "reject", "approvals", "tools", "serve", "encryption-key", "command-key", "doctor", "healthcheck", "mcp",
        "memory", "keys", "deploy",
    ]
