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


def test_hermes_dev_takes_every_port_setting_as_an_option_that_wins_over_its_variable(monkeypatch):
    from typer.testing import CliRunner

    from hermes.cli import stack
    from hermes.settings import Settings

    ports = sorted(name for name in Settings.model_fields if name.endswith("_port"))
    assert ports and sorted(stack.DEV_PORTS) == ports
    for name in ports:
        option = _option(("dev",), name)
        assert option.opts == ["--" + name.replace("_", "-")] and f"HERMES_{name.upper()}" in (option.help or "")
        assert f"else {Settings.model_fields[name].default})" in option.help

    seen = []
    monkeypatch.setattr(stack, "run_command", lambda main, settings, **_: seen.append(settings) or main().close())
    monkeypatch.setenv("HERMES_REDIS_PORT", "16379")
    monkeypatch.setenv("HERMES_UI_PORT", "18233")
    result = CliRunner().invoke(app, ["dev", "--temporal-port", "17233", "--ui-port", "18234", "--codec-port", "18081"])
    assert result.exit_code == 0, result.output
    [settings] = seen
    assert (settings.temporal_port, settings.ui_port, settings.redis_port, settings.codec_port) == (17233, 18234, 16379, 18081)
    assert CliRunner().invoke(app, ["dev", "--redis-port", "70000"]).exit_code == 2
