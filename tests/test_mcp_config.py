"""MCP server configuration (hermes.mcp.config): the editors' ``mcpServers`` shape with
Hermes' keys, every refusal with its file and key, ``${ENV}`` resolved on the worker and
kept out of every ``repr()``, and the model-facing tool names.

The real-world configs are the ones the servers' READMEs give for Claude Desktop.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes.errors import ConfigError
from hermes.mcp.config import (
    TOOL_NAME_RE,
    McpConfig,
    ResolvedServer,
    ServerConfig,
    ToolHints,
    load_mcp_config,
    merge_tool_names,
    parse_mcp_config,
    redact,
    resolve,
    resolve_all,
    sanitize_tool_name,
)
from hermes.tools.registry import PERMISSION_RANK

TOKEN = "tok-8fK2-very-secret-Qz91"


def write(tmp_path: Path, data: Any, name: str = "mcp.json") -> Path:
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def refused(tmp_path: Path, servers: dict[str, Any] | Any, *, environ: dict[str, str] | None = None) -> ConfigError:
    """The ConfigError for a file whose ``mcpServers`` is ``servers``; checks it names the file."""
    path = write(tmp_path, {"mcpServers": servers})
    with pytest.raises(ConfigError) as info:
        load_mcp_config(path, environ=environ)
    assert info.value.source == str(path)
    assert str(path) in str(info.value)
    return info.value


def one(entry: dict[str, Any], name: str = "srv") -> ServerConfig:
    return parse_mcp_config({"mcpServers": {name: entry}}).servers[name]


# ---------------------------------------------------------------- real-world configs

README_CONFIGS = {
    # modelcontextprotocol/servers, src/filesystem/README.md ("Usage with Claude Desktop", NPX)
    "filesystem": {
        "command": "npx",
        "args": [
            "-y",
            "@modelcontextprotocol/server-filesystem",
            "/Users/username/Desktop",
            "/path/to/other/allowed/dir",
        ],
    },
    # src/everything/README.md
    "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
    # src/time/README.md ("Using uvx", and the --local-timezone customisation)
    "time": {"command": "uvx", "args": ["mcp-server-time", "--local-timezone=America/New_York"]},
    # src/git/README.md ("Using uvx")
    "git": {"command": "uvx", "args": ["mcp-server-git", "--repository", "path/to/git/repo"]},
    # a remote server with a bearer token from the worker's environment
    "remote": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
}


def test_readme_configs_of_official_servers_load_as_written(tmp_path: Path) -> None:
    config = load_mcp_config(write(tmp_path, {"mcpServers": README_CONFIGS}))
    assert list(config.servers) == ["filesystem", "everything", "time", "git", "remote"]
    fs = config.servers["filesystem"]
    assert fs.transport == "stdio"
    assert fs.command == "npx"
    assert fs.args == tuple(README_CONFIGS["filesystem"]["args"])
    assert fs.args[1] == "@modelcontextprotocol/server-filesystem"
    assert config.servers["time"].args == ("mcp-server-time", "--local-timezone=America/New_York")
    assert config.servers["git"].command == "uvx"
    assert config.servers["git"].args[1:] == ("--repository", "path/to/git/repo")
    remote = config.servers["remote"]
    assert remote.transport == "streamable-http"
    assert remote.url == "https://mcp.example.com/mcp"
    assert remote.headers == {"Authorization": "Bearer ${TOKEN}"}  # unresolved: safe to travel


def test_defaults_of_hermes_keys_are_applied_to_every_server() -> None:
    config = parse_mcp_config({"mcpServers": README_CONFIGS}, "readme")
    for name, server in config.servers.items():
        assert server.name == name
        assert server.group == name
        assert server.timeout_seconds == 30
        assert server.list_ttl_seconds == 300
        assert server.idle_seconds == 300
        assert server.enabled is True
        assert server.allow is None and server.deny == ()
        assert server.permission is None and server.idempotency is None  # not written: see policy()
        policy = server.policy("any_tool")
        assert (policy.permission, policy.permission_source) == ("read", "default")
        assert (policy.idempotency, policy.idempotency_source) == ("none", "default")  # not known to be safe to retry
        assert server.source == "readme"
    assert config.source == "readme"


def test_yaml_config_gives_the_same_servers_as_json(tmp_path: Path) -> None:
    from_json = load_mcp_config(write(tmp_path, {"mcpServers": README_CONFIGS}, "a.json"))
    from_yaml = load_mcp_config(write(tmp_path, {"mcpServers": README_CONFIGS}, "a.yaml"))
    same_source = {n: s.model_copy(update={"source": from_yaml.source}) for n, s in from_json.servers.items()}
    assert from_yaml.servers == same_source


def test_remote_server_token_is_resolved_on_the_worker_and_masked_everywhere(tmp_path: Path) -> None:
    config = load_mcp_config(write(tmp_path, {"mcpServers": README_CONFIGS}), environ={"TOKEN": TOKEN})
    # The loaded config never holds the value, even when checked against the environment.
    assert TOKEN not in config.model_dump_json()
    resolved = resolve(config.servers["remote"], {"TOKEN": TOKEN})
    assert resolved.headers == {"Authorization": f"Bearer {TOKEN}"}
    assert resolved.url == "https://mcp.example.com/mcp"
    for text in (repr(resolved), str(resolved), repr(config), str(config.servers["remote"]), f"{resolved}"):
        assert TOKEN not in text
    assert "Authorization" in repr(resolved)
    message = f"401 from server: token {TOKEN} rejected (header 'Bearer {TOKEN}')"
    assert redact(message, resolved) == "401 from server: token *** rejected (header '***')"


def test_editor_type_key_and_transport_names_are_accepted() -> None:
    assert one({"type": "stdio", "command": "x"}).transport == "stdio"
    assert one({"type": "http", "url": "http://localhost:8000/mcp"}).transport == "streamable-http"
    assert one({"type": "streamable-http", "url": "http://h/mcp"}).transport == "streamable-http"
    assert one({"type": "sse", "url": "http://h/sse"}).transport == "sse"
    assert one({"transport": "sse", "url": "http://h/sse"}).transport == "sse"
    assert one({"transport": "http", "url": "http://h/mcp"}).transport == "streamable-http"
    assert one({"type": "http", "transport": "streamable-http", "url": "http://h/mcp"}).transport == "streamable-http"
    assert one({"url": "https://h/mcp"}).transport == "streamable-http"


def test_hermes_keys_are_read_with_per_tool_overrides() -> None:
    server = one(
        {
            "url": "https://tickets.example/mcp",
            "timeout_seconds": 12.5,
            "allow": ["get_*", "create_ticket"],
            "deny": ["*_internal"],
            "permission": "read",
            "idempotency": "idempotent",
            "tools": {
                "create_ticket": {
                    "permission": "write",
                    "idempotency": "keyed",
                    "description_suffix": "  Opens a real ticket. ",
                },
                "get_raw": {"description_suffix": ""},
            },
            "description_suffix": " Belongs to the ticket system; CI logs are in ci_* tools. ",
            "list_ttl_seconds": 0,
            "idle_seconds": 60,
            "enabled": False,
            "group": "tickets",
        },
        name="tk",
    )
    assert (server.timeout_seconds, server.list_ttl_seconds, server.idle_seconds) == (12.5, 0, 60)
    assert server.enabled is False and server.group == "tickets"
    get = server.policy("get_ticket")
    assert (get.permission, get.idempotency) == ("read", "idempotent")
    assert get.description_suffix == "Belongs to the ticket system; CI logs are in ci_* tools."
    create = server.policy("create_ticket")
    assert (create.permission, create.idempotency) == ("write", "keyed")
    assert create.description_suffix == "Opens a real ticket."
    assert server.policy("get_raw").description_suffix is None
    assert server.describe("get_ticket", "Fetch a ticket.  ") == (
        "Fetch a ticket.\n\nBelongs to the ticket system; CI logs are in ci_* tools."
    )
    assert server.describe("get_raw", "Raw JSON.") == "Raw JSON."
    assert server.describe("get_ticket", None) == "Belongs to the ticket system; CI logs are in ci_* tools."


def test_allow_and_deny_globs_filter_tool_names_and_deny_wins() -> None:
    server = one({"command": "x", "allow": ["read_*", "list_?ir*", "[gs]et_*"], "deny": ["*secret*"]})
    assert server.allows("read_file")
    assert server.allows("list_dir") and not server.allows("list_files")
    assert server.allows("get_x") and server.allows("set_x") and not server.allows("put_x")
    assert not server.allows("write_file")
    assert not server.allows("read_secret_file")  # allowed by read_*, denied by *secret*
    assert not server.allows("READ_FILE")  # case-sensitive on every platform
    everything = one({"command": "x", "deny": ["delete_*"]})
    assert everything.allows("anything") and not everything.allows("delete_repo")
    assert not one({"command": "x", "allow": []}).allows("anything")


def test_server_config_survives_a_json_round_trip_with_references_intact() -> None:
    server = one(
        {"url": "https://${HOST}/mcp", "headers": {"X-Key": "${KEY}"}, "tools": {"t": {"permission": "admin"}}}
    )
    again = ServerConfig.model_validate_json(server.model_dump_json())
    assert again == server
    assert again.url == "https://${HOST}/mcp"
    config = parse_mcp_config({"mcpServers": {"a": {"command": "x", "args": ["$${literal}"]}}})
    assert McpConfig.model_validate_json(config.model_dump_json()) == config


# ---------------------------------------------------------------- refusals: file, key, expected


def test_misspelt_key_is_refused_with_did_you_mean(tmp_path: Path) -> None:
    err = refused(tmp_path, {"git": {"comand": "uvx", "args": ["mcp-server-git"]}})
    assert err.key == "mcpServers.git.comand"
    assert "did you mean 'command'?" in str(err)
    err = refused(tmp_path, {"git": {"command": "uvx", "timeout_second": 3}})
    assert err.key == "mcpServers.git.timeout_second" and "did you mean 'timeout_seconds'?" in str(err)


def test_misspelt_key_inside_a_tool_override_lists_the_override_keys(tmp_path: Path) -> None:
    err = refused(tmp_path, {"fs": {"command": "npx", "tools": {"write_file": {"permision": "write"}}}})
    assert err.key == "mcpServers.fs.tools.write_file.permision"
    assert "did you mean 'permission'?" in str(err)
    assert "expected one of: permission, idempotency, description_suffix" in str(err)


def test_keys_of_other_clients_are_refused_with_what_to_write_instead(tmp_path: Path) -> None:
    err = refused(tmp_path, {"fs": {"command": "npx", "disabled": True}})
    assert err.key == "mcpServers.fs.disabled" and "enabled: false" in str(err)
    err = refused(tmp_path, {"order_service": {"url": "http://internal.example/order-mcp", "timeout": 30}})
    assert err.key == "mcpServers.order_service.timeout" and "timeout_seconds" in str(err)


def test_unknown_top_level_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, {"mcpServer": {"a": {"command": "x"}}})
    with pytest.raises(ConfigError, match="did you mean 'mcpServers'") as info:
        load_mcp_config(path)
    assert info.value.key == "mcpServer"
    with pytest.raises(ConfigError, match="'mcpServers' is missing"):
        parse_mcp_config({})
    with pytest.raises(ConfigError, match="expected a mapping of server names") as info:
        parse_mcp_config({"mcpServers": [{"command": "x"}]})
    assert info.value.key == "mcpServers"


def test_both_command_and_url_are_refused(tmp_path: Path) -> None:
    err = refused(tmp_path, {"x": {"command": "npx", "url": "https://h/mcp"}})
    assert err.key == "mcpServers.x"
    assert "expected either `command`" in str(err) and "found both" in str(err)


def test_neither_command_nor_url_is_refused(tmp_path: Path) -> None:
    err = refused(tmp_path, {"x": {"args": ["a"]}})
    assert err.key == "mcpServers.x" and "found neither" in str(err)


@pytest.mark.parametrize("url", ["ftp://files.example/mcp", "localhost:8080/mcp", "/mcp", "https:///mcp", "ws://h/mcp"])
def test_url_that_is_not_absolute_http_is_refused(tmp_path: Path, url: str) -> None:
    err = refused(tmp_path, {"remote": {"url": url}})
    assert err.key == "mcpServers.remote.url"
    assert "expected an absolute http:// or https:// url" in str(err) and repr(url) in str(err)


def test_url_from_the_environment_is_checked_once_resolved_without_showing_it() -> None:
    server = one({"url": "${MCP_URL}"})
    assert resolve(server, {"MCP_URL": "https://h/mcp"}).url == "https://h/mcp"
    with pytest.raises(ConfigError, match="once \\$\\{...\\} was resolved") as info:
        resolve(server, {"MCP_URL": "file:///etc/passwd-secretish"})
    assert info.value.key == "mcpServers.srv.url"
    assert "passwd-secretish" not in str(info.value)
    assert "${MCP_URL}" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "where", "expected"),
    [
        ("allow", "read_*", "allow", "valid list"),
        ("allow", ["read_*", 3], "allow[1]", "valid string"),
        ("deny", {"a": 1}, "deny", "valid list"),
        ("deny", [""], "deny[0]", "expected a glob"),
    ],
)
def test_globs_of_the_wrong_type_are_refused(tmp_path: Path, key: str, value: Any, where: str, expected: str) -> None:
    err = refused(tmp_path, {"fs": {"command": "npx", key: value}})
    assert err.key == f"mcpServers.fs.{where}"
    assert expected in str(err)


def test_unknown_transport_is_refused_listing_the_known_ones(tmp_path: Path) -> None:
    err = refused(tmp_path, {"r": {"url": "https://h/mcp", "transport": "websocket"}})
    assert err.key == "mcpServers.r.transport"
    assert "'stdio', 'streamable-http', 'sse' or 'http'" in str(err) and "'websocket'" in str(err)
    err = refused(tmp_path, {"r": {"url": "https://h/mcp", "type": "grpc"}})
    assert err.key == "mcpServers.r.type"


@pytest.mark.parametrize(
    ("entry", "where", "expected"),
    [
        ({"type": "stdio", "url": "https://h/mcp"}, "type", "started from `command`"),
        ({"transport": "sse", "command": "npx"}, "transport", "found 'sse'"),
        ({"type": "http", "command": "npx"}, "type", "found 'http'"),
        ({"type": "sse", "transport": "streamable-http", "url": "https://h/mcp"}, "transport", "`type` says 'sse'"),
        ({"url": "https://h/mcp", "args": ["--x"]}, "args", "`args` is for a server started from `command`"),
        ({"url": "https://h/mcp", "env": {"A": "1"}}, "env", "`env` is for"),
        ({"url": "https://h/mcp", "cwd": "/tmp"}, "cwd", "`cwd` is for"),
        ({"command": "npx", "headers": {"A": "b"}}, "headers", "`headers` are sent to an HTTP server"),
        ({"command": "  "}, "command", "expected the program to start"),
        ({"url": "https://h/mcp", "headers": {"Bad Header": "x"}}, 'headers["Bad Header"]', "expected a header name"),
        ({"url": "https://h/mcp", "headers": {"X-A": "a\r\nX-B: b"}}, "headers.X-A", "on one line"),
        ({"command": "x", "env": {"A=B": "1"}}, 'env["A=B"]', "environment variable name"),
        ({"command": "x", "tools": {"": {"permission": "write"}}}, 'tools[""]', "expected a tool name"),
        ({"command": "x", "group": " "}, "group", "expected a tool group name"),
        ({"command": "x", "permission": "owner"}, "permission", "expected 'read', 'write' or 'admin'"),
        ({"command": "x", "idempotency": "maybe"}, "idempotency", "'idempotent', 'keyed' or 'none'"),
        ({"command": "x", "tools": {"t": {"idempotency": "yes"}}}, "tools.t.idempotency", "'idempotent'"),
        ({"command": "x", "enabled": "yes"}, "enabled", "valid boolean"),
        ({"command": "x", "env": {"PORT": 8080}}, "env.PORT", "valid string"),
        ({"command": "x", "list_ttl_seconds": -1}, "list_ttl_seconds", "greater than or equal to 0"),
        ({"command": "x", "idle_seconds": 0}, "idle_seconds", "greater than 0"),
    ],
)
def test_server_entries_that_do_not_fit_are_refused_at_their_key(
    tmp_path: Path, entry: dict[str, Any], where: str, expected: str
) -> None:
    err = refused(tmp_path, {"s": entry})
    assert err.key == f"mcpServers.s.{where}"
    assert expected in str(err)


def test_several_problems_in_one_server_are_counted_after_the_first(tmp_path: Path) -> None:
    err = refused(tmp_path, {"s": {"command": "x", "permission": "owner", "idempotency": "maybe", "enabled": "no"}})
    assert err.key == "mcpServers.s.permission"
    assert "(2 more problems in this server)" in str(err)


@pytest.mark.parametrize("value", [0, -5, "30", True, None])
def test_timeout_that_is_not_a_positive_number_is_refused(tmp_path: Path, value: Any) -> None:
    err = refused(tmp_path, {"git": {"command": "uvx", "timeout_seconds": value}})
    assert err.key == "mcpServers.git.timeout_seconds"
    assert "expected" in str(err) and "found" in str(err)


def test_infinite_timeout_written_in_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"git": {"command": "uvx", "timeout_seconds": Infinity}}}')
    with pytest.raises(ConfigError, match="finite number") as info:
        load_mcp_config(path)
    assert info.value.key == "mcpServers.git.timeout_seconds"


def test_non_string_arg_is_refused_at_its_index(tmp_path: Path) -> None:
    err = refused(tmp_path, {"git": {"command": "uvx", "args": ["mcp-server-git", 42, "--repository"]}})
    assert err.key == "mcpServers.git.args[1]"
    assert "expected a valid string; found 42" in str(err)


def test_every_unset_environment_variable_is_named_at_once(tmp_path: Path) -> None:
    servers = {
        "github": {"command": "npx", "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "${GH_TOKEN}"}},
        "remote": {
            "url": "https://${REMOTE_HOST}/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN}", "X-Org": "${ORG}"},
        },
        "off": {"command": "x", "args": ["${NEVER_SET}"], "enabled": False},
    }
    err = refused(tmp_path, servers, environ={"ORG": "acme-corporation"})
    message = str(err)
    for variable, key in [
        ("GH_TOKEN", "mcpServers.github.env.GITHUB_PERSONAL_ACCESS_TOKEN"),
        ("REMOTE_HOST", "mcpServers.remote.url"),
        ("TOKEN", "mcpServers.remote.headers.Authorization"),
    ]:
        assert f"{variable} (at {key})" in message
    assert err.key == "mcpServers.github.env.GITHUB_PERSONAL_ACCESS_TOKEN"
    assert "ORG (at" not in message and "acme-corporation" not in message
    assert "NEVER_SET" not in message  # a disabled server's variables need not be set
    # Without an environment, loading does not check variables at all.
    assert set(load_mcp_config(write(tmp_path, {"mcpServers": servers})).servers) == {"github", "remote", "off"}
    with pytest.raises(ConfigError) as info:
        resolve_all(parse_mcp_config({"mcpServers": servers}), {})
    assert "GH_TOKEN" in str(info.value) and "TOKEN (at" in str(info.value) and "NEVER_SET" not in str(info.value)


def test_resolve_names_every_unset_variable_of_its_server() -> None:
    server = one({"command": "${NODE}", "args": ["--dir", "${DIR}", "${DIR}/sub"], "cwd": "${WORK}"})
    with pytest.raises(ConfigError) as info:
        resolve(server, {"WORK": "/w"})
    assert "NODE (at mcpServers.srv.command), DIR (at mcpServers.srv.args[1])" in str(info.value)
    assert info.value.key == "mcpServers.srv.command"


def test_environment_references_are_resolved_in_every_templated_field() -> None:
    environ = {"NODE": "/opt/node/bin/npx", "ROOT": "/srv/data", "LEVEL": "debug", "HOST": "mcp.internal", "KEY": TOKEN}
    stdio = resolve(
        one(
            {
                "command": "${NODE}",
                "args": ["-y", "${ROOT}/docs", "${env:LEVEL}"],
                "env": {"LOG": "${LEVEL}"},
                "cwd": "${ROOT}",
            }
        ),
        environ,
    )
    assert stdio.command == "/opt/node/bin/npx"
    assert stdio.args == ("-y", "/srv/data/docs", "debug")
    assert stdio.env == {"LOG": "debug"}
    assert stdio.cwd == "/srv/data"
    http = resolve(one({"url": "https://${HOST}:8443/mcp", "headers": {"X-Api-Key": "${KEY}"}}), environ)
    assert http.url == "https://mcp.internal:8443/mcp"
    assert http.headers == {"X-Api-Key": TOKEN}
    assert isinstance(http, ResolvedServer) and http.name == "srv" and http.transport == "streamable-http"


def test_double_dollar_is_a_literal_and_not_a_variable() -> None:
    server = one({"command": "sh", "args": ["-c", "echo $${HOME} and $$HOME", "$${NOT_A_VAR}"]})
    resolved = resolve(server, {})
    assert resolved.args == ("-c", "echo ${HOME} and $$HOME", "${NOT_A_VAR}")
    assert resolved.secrets == ()


@pytest.mark.parametrize("text", ["${input:token}", "${ TOKEN }", "${1TOKEN}", "prefix ${unterminated"])
def test_malformed_reference_is_refused_when_the_file_is_read(tmp_path: Path, text: str) -> None:
    err = refused(tmp_path, {"remote": {"url": "https://h/mcp", "headers": {"Authorization": text}}})
    assert err.key == "mcpServers.remote.headers.Authorization"
    assert "expected ${NAME}" in str(err) and "$${" in str(err)


def test_references_outside_templated_fields_stay_as_written() -> None:
    server = one({"command": "x", "description_suffix": "Costs ${price}.", "group": "g"})
    assert resolve(server, {}).config.description_suffix == "Costs ${price}."


def test_literal_tokens_in_env_and_headers_are_masked_but_short_values_are_not() -> None:
    env = {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_literalToken123", "DEBUG": "1"}
    server = one({"command": "npx", "args": ["-y", "srv"], "env": env})
    resolved = resolve(server, {})
    assert "ghp_literalToken123" not in repr(resolved) and "ghp_literalToken123" not in repr(server)
    assert redact("bad credentials ghp_literalToken123 (attempt 1)", resolved) == "bad credentials *** (attempt 1)"
    assert redact({"e": ["ghp_literalToken123", 1]}, [resolved]) == {"e": ["***", 1]}


def test_redact_masks_a_longer_secret_whole_before_a_shorter_one_inside_it() -> None:
    server = one({"url": "https://h/mcp", "headers": {"A": "${OUTER}", "B": "${INNER}"}})
    resolved = resolve(server, {"OUTER": "abcdEFGH-1234", "INNER": "EFGH"})
    assert redact("x abcdEFGH-1234 y EFGH z", resolved) == "x *** y *** z"
    assert redact(("EFGH",), resolved) == ("***",)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("", 'mcpServers[""]'), ("   ", 'mcpServers["   "]')],
)
def test_empty_server_name_is_refused(tmp_path: Path, name: str, expected: str) -> None:
    err = refused(tmp_path, {name: {"command": "x"}})
    assert err.key == expected and "non-empty string as the server name" in str(err)


def test_server_entry_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    err = refused(tmp_path, {"git": ["uvx", "mcp-server-git"]})
    assert err.key == "mcpServers.git" and "found a list" in str(err)


def test_server_name_that_is_not_a_plain_word_is_quoted_in_keys(tmp_path: Path) -> None:
    err = refused(tmp_path, {"my server.v2": {"command": "x", "args": [1]}})
    assert err.key == 'mcpServers["my server.v2"].args[0]'


def test_file_problems_are_refused_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found") as info:
        load_mcp_config(tmp_path / "missing.json")
    assert info.value.source == str(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match=r"\.json, \.yaml or \.yml; found '\.toml'"):
        load_mcp_config(write(tmp_path, {}, "mcp.toml"))
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "mcpServers": {\n    "a": {"command": "x",}\n  }\n}')
    with pytest.raises(ConfigError, match="not valid JSON at line 3"):
        load_mcp_config(bad)
    commented = tmp_path / "commented.json"
    commented.write_text('{\n  // my servers\n  "mcpServers": {}\n}')
    with pytest.raises(ConfigError, match="JSON has no comments"):
        load_mcp_config(commented)
    dup = tmp_path / "dup.json"
    dup.write_text('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}')
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_mcp_config(dup)
    dup_yaml = tmp_path / "dup.yaml"
    dup_yaml.write_text("mcpServers:\n  a: {command: x}\n  a: {command: y}\n")
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        load_mcp_config(dup_yaml)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match="found an empty file"):
        load_mcp_config(empty)


def test_file_written_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_bytes("\ufeff".encode() + json.dumps({"mcpServers": {"time": README_CONFIGS["time"]}}).encode())
    assert load_mcp_config(path).servers["time"].command == "uvx"


def test_empty_server_map_is_a_valid_config() -> None:
    assert parse_mcp_config({"mcpServers": {}}).servers == {}


def test_enabled_servers_leaves_out_disabled_ones() -> None:
    config = parse_mcp_config({"mcpServers": {"a": {"command": "x"}, "b": {"command": "y", "enabled": False}}})
    assert list(config.enabled_servers()) == ["a"]
    assert list(resolve_all(config, {})) == ["a"]


# ---------------------------------------------------------------- tool names


def test_sanitized_name_is_server_prefix_and_tool_with_unsafe_characters_replaced() -> None:
    assert sanitize_tool_name("git", "git_status") == "git_git_status"
    assert sanitize_tool_name("my-server", "x.y") == "my-server_x_y"
    assert sanitize_tool_name("fs", "read file/v2:now") == "fs_read_file_v2_now"
    assert sanitize_tool_name("天气", "查询") == "_____"


def test_name_longer_than_64_characters_is_cut_with_a_stable_hash_of_the_original() -> None:
    long_tool = "t" * 100
    name = sanitize_tool_name("server", long_tool)
    assert len(name) == 64 and TOOL_NAME_RE.match(name)
    assert re.fullmatch(r"server_t{48}_[0-9a-f]{8}", name)
    assert sanitize_tool_name("server", long_tool) == name  # stable
    other = sanitize_tool_name("server", "t" * 99 + "u")  # same first 55 characters
    assert other != name and len(other) == 64
    assert sanitize_tool_name("server", "t" * 99 + ".") != sanitize_tool_name("server", "t" * 99 + "_")
    exactly = "s_" + "x" * 62
    assert sanitize_tool_name("s", "x" * 62) == exactly  # 64 characters: not cut


def test_collision_of_a_dot_and_an_underscore_is_resolved_in_favour_of_the_unchanged_name() -> None:
    names, log = merge_tool_names({"a": ["b.c", "b_c"]})
    assert names == {"a_b_c": ("a", "b_c"), "a_b_c_2": ("a", "b.c")}
    assert len(log) == 1
    assert "'b.c'" in log[0] and "'b_c'" in log[0] and "'a_b_c_2'" in log[0]


def test_dashed_server_with_dotted_tool_collides_with_its_underscored_twin() -> None:
    names, log = merge_tool_names({"my-server": ["x.y", "x_y", "z"]})
    assert names == {
        "my-server_x_y": ("my-server", "x_y"),
        "my-server_x_y_2": ("my-server", "x.y"),
        "my-server_z": ("my-server", "z"),
    }
    assert len(log) == 1


def test_collision_across_servers_goes_to_the_first_server_by_name() -> None:
    names, log = merge_tool_names({"a_b": ["c"], "a": ["b_c"], "a.b": ["c"]})
    assert names == {"a_b_c": ("a", "b_c"), "a_b_c_2": ("a_b", "c"), "a_b_c_3": ("a.b", "c")}
    assert len(log) == 2


def test_suffix_never_takes_a_name_another_tool_has_as_it_is() -> None:
    names, _ = merge_tool_names({"s": ["x.y", "x_y", "x_y_2"]})
    assert names["s_x_y"] == ("s", "x_y")
    assert names["s_x_y_2"] == ("s", "x_y_2")  # its own name, not the collision's suffix
    assert names["s_x_y_3"] == ("s", "x.y")


def test_hundred_character_names_stay_distinct_and_within_64_characters() -> None:
    server = "s" * 100
    tools = ["a" * 100, "a" * 99 + "b", "a" * 99 + ".", "a" * 99 + "_"]
    names, log = merge_tool_names({server: tools})
    assert len(names) == 4 and log == []
    assert all(len(n) == 64 and TOOL_NAME_RE.match(n) for n in names)


def test_collision_on_a_64_character_name_gets_a_suffix_that_still_fits() -> None:
    names, log = merge_tool_names({"s": ["a." + "b" * 60, "a_" + "b" * 60]})
    exact = "s_a_" + "b" * 60
    assert len(exact) == 64
    assert names[exact] == ("s", "a_" + "b" * 60)
    suffixed = [n for n in names if n != exact]
    assert suffixed == [exact[:62] + "_2"]
    assert len(log) == 1


def test_a_tool_listed_twice_is_offered_once_and_logged() -> None:
    names, log = merge_tool_names({"s": ["t", "t"]})
    assert names == {"s_t": ("s", "t")}
    assert len(log) == 1 and "more than once" in log[0]


def test_merge_of_nothing_is_empty() -> None:
    assert merge_tool_names({}) == ({}, [])
    assert merge_tool_names({"s": []}) == ({}, [])


_CHARS = "ab_-.:/ 天é"
_short_names = st.text(alphabet=_CHARS, max_size=4)
_any_names = st.one_of(_short_names, st.text(max_size=80), st.text(alphabet="ab._", min_size=55, max_size=70))


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_any_names, st.lists(_any_names, max_size=6), max_size=5))
def test_merged_names_are_valid_unique_and_map_back_to_every_tool_exactly_once(
    server_tools: dict[str, list[str]],
) -> None:
    names, log = merge_tool_names(server_tools)
    pairs = {(server, tool) for server, tools in server_tools.items() for tool in tools}
    assert all(TOOL_NAME_RE.match(name) for name in names)
    assert sorted(names.values()) == sorted(pairs)  # every pair once: the names are unique
    # A name that needed no change is kept unless another pair has exactly the same text.
    unchanged: dict[str, list[tuple[str, str]]] = {}
    for server, tool in pairs:
        if sanitize_tool_name(server, tool) == f"{server}_{tool}":
            unchanged.setdefault(f"{server}_{tool}", []).append((server, tool))
    for text, owners in unchanged.items():
        if len(owners) == 1:
            assert names[text] == owners[0]
    # Deterministic: the order of servers and tools does not matter.
    shuffled = {server: list(reversed(tools)) for server, tools in reversed(list(server_tools.items()))}
    assert merge_tool_names(shuffled) == (names, log)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=90), st.text(max_size=90))
def test_sanitized_name_is_always_a_valid_function_name(server: str, tool: str) -> None:
    name = sanitize_tool_name(server, tool)
    assert TOOL_NAME_RE.match(name)
    full = f"{server}_{tool}"
    if TOOL_NAME_RE.match(full):
        assert name == full
    else:
        assert name != full


# ------------------------------------------------------------ tool annotations


DELETE = ToolHints(read_only=False, destructive=True)
LOOK = ToolHints(read_only=True)
RETRY = ToolHints(read_only=False, destructive=False, idempotent=True)


@pytest.mark.parametrize(
    ("server_keys", "hints", "expected"),
    [
        # No operator key: the hints decide; no hints: the old defaults.
        ({}, None, ("read", "default", "none", "default")),
        ({}, DELETE, ("write", "annotation", "none", "default")),
        ({}, ToolHints(read_only=False), ("write", "annotation", "none", "default")),  # spec: destructive unless said
        ({}, ToolHints(destructive=False, read_only=False), ("read", "default", "none", "default")),
        ({}, LOOK, ("read", "annotation", "none", "default")),
        ({}, RETRY, ("read", "default", "idempotent", "annotation")),
        # The server's permission is a floor a destructive hint raises, a read-only one never lowers.
        ({"permission": "read"}, DELETE, ("write", "annotation", "none", "default")),
        ({"permission": "write"}, LOOK, ("write", "config", "none", "default")),
        ({"permission": "admin"}, DELETE, ("admin", "config", "none", "default")),
        # The server's idempotency decides over idempotentHint.
        ({"idempotency": "none"}, RETRY, ("read", "default", "none", "config")),
        # A tool's own entry decides outright, either way.
        ({"tools": {"t": {"permission": "read"}}}, DELETE, ("read", "config", "none", "default")),
        ({"tools": {"t": {"permission": "admin"}}}, LOOK, ("admin", "config", "none", "default")),
        ({"permission": "write", "tools": {"t": {"permission": "read"}}}, None, ("read", "config", "none", "default")),
        ({"idempotency": "idempotent", "tools": {"t": {"idempotency": "none"}}}, RETRY, ("read", "default", "none", "config")),
    ],
)
def test_a_tools_permission_and_idempotency_come_from_the_operators_keys_over_its_annotations(
    server_keys: dict[str, Any], hints: ToolHints | None, expected: tuple[str, str, str, str]
) -> None:
    policy = one({"command": "x", **server_keys}).policy("t", hints)
    assert (policy.permission, policy.permission_source, policy.idempotency, policy.idempotency_source) == expected


def test_hints_are_read_from_mcp_tool_annotations_and_non_booleans_are_ignored() -> None:
    from mcp_types import ToolAnnotations

    listed = ToolAnnotations.model_validate({"destructiveHint": True, "idempotentHint": True, "openWorldHint": False})
    assert ToolHints.of(listed) == ToolHints(destructive=True, idempotent=True)
    assert ToolHints.of(None) == ToolHints()
    assert ToolHints.of(type("Odd", (), {"read_only_hint": "yes"})()) == ToolHints()


_permissions = st.sampled_from(["read", "write", "admin"])
_flags = st.sampled_from([None, True, False])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), _permissions), st.one_of(st.none(), _permissions), _flags, _flags, _flags)
def test_no_annotation_makes_a_tool_less_guarded_than_the_operator_wrote(
    server_permission: str | None, tool_permission: str | None, read_only: bool | None, destructive: bool | None, idempotent: bool | None
) -> None:
    keys: dict[str, Any] = {"command": "x"}
    if server_permission:
        keys["permission"] = server_permission
    if tool_permission:
        keys["tools"] = {"t": {"permission": tool_permission}}
    server = one(keys)
    hinted = server.policy("t", ToolHints(read_only=read_only, destructive=destructive, idempotent=idempotent))
    bare = server.policy("t")
    assert PERMISSION_RANK[hinted.permission] >= PERMISSION_RANK[bare.permission]  # never less guarded
    if tool_permission:
        assert hinted.permission == tool_permission  # the tool's own entry decides outright
    elif destructive and not read_only:
        assert PERMISSION_RANK[hinted.permission] >= PERMISSION_RANK["write"]
