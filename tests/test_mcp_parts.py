"""The MCP manager's plain parts, without a server (issue 29).

:class:`hermes.mcp.manager.McpManager` is a facade over parts with one concern each; the
decisions in them that need no connection (the backoff schedule, what a request does in
a backoff window, how a failure is described, paging, the list cache, deadline
arithmetic) are driven here with plain values. The manager's own tests
(test_mcp_manager, test_mcp_failures, test_mcp_outputs) run them against real servers.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from hermes.mcp import calls, discovery, supervision
from hermes.mcp.config import parse_mcp_config, resolve_all
from hermes.mcp.manager import BACKOFF_FIRST_SECONDS, BACKOFF_MAX_SECONDS, STABLE_SECONDS, McpUnavailableError
from hermes.mcp.stdio import StartError

pytestmark = pytest.mark.timeout(30)


def test_backoff_doubles_from_one_second_to_thirty():
    delays = [supervision.backoff_delay(failures) for failures in range(1, 9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert delays[0] == BACKOFF_FIRST_SECONDS and delays[-1] == BACKOFF_MAX_SECONDS


def test_a_failure_after_a_stable_connection_restarts_the_doubling():
    assert supervision.failures_after(4, lived_seconds=STABLE_SECONDS) == 1
    assert supervision.failures_after(4, lived_seconds=STABLE_SECONDS - 0.1) == 5
    assert supervision.failures_after(0, lived_seconds=0.0) == 1


def test_a_call_waits_for_a_relaunch_that_comes_before_its_deadline():
    assert supervision.backoff_step(10.0, retry_at=12.0, deadline=15.0, wait_backoff=True) == "wait"


def test_a_call_is_refused_when_the_relaunch_comes_after_its_deadline():
    assert supervision.backoff_step(10.0, retry_at=16.0, deadline=15.0, wait_backoff=True) == "refuse"


def test_a_list_never_waits_out_a_backoff():
    assert supervision.backoff_step(10.0, retry_at=11.0, deadline=15.0, wait_backoff=False) == "refuse"


def test_a_request_starts_the_server_when_no_backoff_is_running():
    assert supervision.backoff_step(10.0, retry_at=None, deadline=15.0, wait_backoff=False) == "start"
    assert supervision.backoff_step(10.0, retry_at=10.0, deadline=15.0, wait_backoff=False) == "start"


def test_a_start_failure_is_described_by_what_broke():
    def described(err: Exception, opened: bool = False) -> str:
        return supervision.start_failure(err, opened=opened, startup_timeout_seconds=7.5)

    assert described(StartError("command 'nope' not found on PATH")) == "command 'nope' not found on PATH"
    assert described(TimeoutError()) == "no answer to initialize within 7.5 s"
    assert described(MCPError(-32600, "bad version")) == "handshake failed: bad version"
    assert described(MCPError(-32600, "bad version"), opened=True) == "bad version"
    assert described(ExceptionGroup("in a task group", [RuntimeError("first line\nsecond line")])) == "RuntimeError: first line"


def test_only_an_http_5xx_to_a_tool_call_may_have_run():
    assert calls.http_maybe_ran(502, maybe_ran=True)
    assert not calls.http_maybe_ran(403, maybe_ran=True)
    assert not calls.http_maybe_ran(503, maybe_ran=False)


def test_the_time_left_before_a_deadline_is_never_negative():
    assert calls.remaining_seconds(10.0, now=7.5) == 2.5
    assert calls.remaining_seconds(10.0, now=12.0) == 0.0


def test_a_cached_list_is_served_only_while_younger_than_its_ttl():
    cached = (100.0, ["a", "b"])
    served = discovery.cached_items(cached, 30.0, 129.9, refresh=False)
    assert served == ["a", "b"] and served is not cached[1]  # a copy: callers may change it
    assert discovery.cached_items(cached, 30.0, 130.0, refresh=False) is None
    assert discovery.cached_items(cached, 30.0, 110.0, refresh=True) is None
    assert discovery.cached_items(cached, 0.0, 100.0, refresh=False) is None
    assert discovery.cached_items(None, 30.0, 100.0, refresh=False) is None


def _pages(pages: dict[str | None, tuple[list[str], str | None]]) -> Any:
    """A fake ``list_tools``: the page for each cursor, and the cursors it was asked for."""
    asked: list[str | None] = []

    async def fetch(params: Any = None) -> Any:
        cursor = None if params is None else params.cursor
        asked.append(cursor)
        names, next_cursor = pages[cursor]
        return SimpleNamespace(tools=[SimpleNamespace(name=name) for name in names], next_cursor=next_cursor)

    fetch.asked = asked  # type: ignore[attr-defined]
    return fetch


async def test_a_list_follows_next_cursor_over_every_page_and_drops_repeats():
    fetch = _pages({None: (["a", "b"], "p2"), "p2": (["b", "c"], "p3"), "p3": (["d"], None)})
    items = await discovery.all_pages(fetch, "tools", "srv")
    assert [item.name for item in items] == ["a", "b", "c", "d"]
    assert fetch.asked == [None, "p2", "p3"]


async def test_a_list_whose_cursor_brings_nothing_new_stops_with_what_it_read(caplog: pytest.LogCaptureFixture):
    fetch = _pages({None: (["a"], "same"), "same": (["a"], "same")})
    with caplog.at_level(logging.WARNING, logger="hermes.mcp"):
        items = await discovery.all_pages(fetch, "tools", "srv")
    assert [item.name for item in items] == ["a"]
    assert fetch.asked == [None, "same"]
    assert "brought nothing new" in caplog.text


async def test_a_list_that_never_ends_is_cut_off_after_max_list_pages(caplog: pytest.LogCaptureFixture):
    pages: dict[str | None, tuple[list[str], str | None]] = {None: (["t0"], "c1")}
    for n in range(1, discovery.MAX_LIST_PAGES + 5):
        pages[f"c{n}"] = ([f"t{n}"], f"c{n + 1}")
    fetch = _pages(pages)
    with caplog.at_level(logging.WARNING, logger="hermes.mcp"):
        items = await discovery.all_pages(fetch, "tools", "srv")
    assert len(items) == len(fetch.asked) == discovery.MAX_LIST_PAGES
    assert "still had a next cursor" in caplog.text


def _supervisor() -> supervision.Supervisor:
    config = parse_mcp_config({"mcpServers": {"one": {"command": "true"}, "two": {"url": "http://127.0.0.1:9/mcp"}}})
    return supervision.Supervisor(resolve_all(config, {}))


def test_servers_that_were_never_used_are_stopped():
    statuses = _supervisor().status()
    assert [(s.name, s.transport, s.state, s.pid, s.restarts) for s in statuses] == [
        ("one", "stdio", "stopped", None, 0),
        ("two", "streamable-http", "stopped", None, 0),
    ]


async def test_an_unknown_server_and_a_closed_supervisor_are_refused_by_name():
    sup = _supervisor()
    with pytest.raises(McpUnavailableError, match="configured: one, two") as unknown:
        sup.server("three")
    assert unknown.value.reason == "unknown_server"
    await sup.aclose()
    with pytest.raises(McpUnavailableError) as closed:
        sup.server("one")
    assert closed.value.reason == "closed"
