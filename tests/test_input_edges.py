"""Edge cases of input: text that is not valid UTF-8 or shows nothing, a ``hermes send``
cut off by a server outage or Ctrl-C, and arithmetic that is too deep or too large.

Messages are checked by the client before anything is sent, so the tests also check
that no session was created. The CLI runs as a subprocess, as in ``test_cli.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from hermes.cli.conversation import _resend_command, _uncertain_send_message
from hermes.cli.errors import EXIT_UNAVAILABLE
from hermes.client import HermesClient, check_message_text
from hermes.errors import MessageRejectedError
from hermes.models import ToolResultCode, TurnResult
from hermes.providers.scripted import ScriptedModel
from hermes.settings import Settings
from hermes.tools.builtin import calculate
from tests.test_cli import CLI_TIMEOUT_SECONDS, Run, clean_env

SEND_TIMEOUT_SECONDS = 5.0
"""Bound on a send that should be refused at once: no worker serves these task queues,
so a message that got through would wait forever."""
INVISIBLE_ONLY = ["\u200b", "\ufeff", "\u200d", " \u200b\t\n\u200d ", "\u2028\u2029", "\u00a0\u3000", "\x00\x1b"]


async def run_cli(*args: str, env: dict[str, str], cwd: Path, stdin: bytes | None = None) -> Run:
    """Run ``hermes ARGS`` with raw bytes on stdin (``str`` arguments holding
    surrogate escapes reach the process as the original bytes, like a shell's ``$'\\xff'``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes.cli", *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=cwd,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), CLI_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"hermes {args[0]} did not finish within {CLI_TIMEOUT_SECONDS:.0f} s") from None
    return Run(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


def error_lines(run: Run) -> list[str]:
    return [line for line in run.stderr.splitlines() if line.startswith("error: ")]


async def assert_no_session(temporal_client: Client, session_id: str) -> None:
    with pytest.raises(RPCError) as raised:
        await temporal_client.get_workflow_handle(session_id).describe()
    assert raised.value.status == RPCStatusCode.NOT_FOUND


@pytest.fixture
def cli_env(temporal_client: Client, redis_url: str, task_queue: str) -> dict[str, str]:
    return clean_env(
        TEMPORAL_ADDRESS=temporal_client.service_client.config.target_host,
        REDIS_URL=redis_url,
        HERMES_TASK_QUEUE=task_queue,
    )


async def wait_for_session(temporal_client: Client, session_id: str, timeout_seconds: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_seconds
    while True:
        try:
            await temporal_client.get_workflow_handle(session_id).describe()
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- client


async def test_a_lone_surrogate_is_rejected_as_invalid_text_and_nothing_is_sent(temporal_client, session_id):
    hermes = HermesClient(temporal_client, task_queue=f"tq-{uuid.uuid4()}")
    with pytest.raises(MessageRejectedError, match=r"not valid UTF-8 text: .*lone surrogate \(U\+D800\) at position 1"):
        await asyncio.wait_for(hermes.send_message(session_id, "x\ud800y"), SEND_TIMEOUT_SECONDS)
    # An undecodable byte kept by surrogateescape (argv, a terminal) is named as the byte.
    with pytest.raises(MessageRejectedError, match=r"U\+DCFF, the undecodable byte 0xFF\) at position 4"):
        text = b"bad \xff byte".decode("utf-8", "surrogateescape")
        await asyncio.wait_for(hermes.send_message(session_id, text), SEND_TIMEOUT_SECONDS)
    await assert_no_session(temporal_client, session_id)


@pytest.mark.parametrize("text", INVISIBLE_ONLY)
async def test_a_message_of_only_whitespace_and_invisible_characters_is_empty(temporal_client, session_id, text):
    hermes = HermesClient(temporal_client, task_queue=f"tq-{uuid.uuid4()}")
    with pytest.raises(MessageRejectedError, match="^the message is empty$"):
        await asyncio.wait_for(hermes.send_message(session_id, text), SEND_TIMEOUT_SECONDS)
    await assert_no_session(temporal_client, session_id)


@pytest.mark.parametrize("text", ["a\u200b", "\u200d👍", "é", "\ufeff你好", "0"])
def test_a_message_with_one_visible_character_is_valid(text):
    check_message_text(text, max_message_bytes=1024)


# --------------------------------------------------------------------------- cli: bad text


async def test_send_with_an_undecodable_byte_exits_1_with_one_line_error_and_sends_nothing(
    cli_env, session_id, temporal_client, tmp_path
):
    run = await run_cli("send", session_id, b"bad \xff byte".decode("utf-8", "surrogateescape"), env=cli_env, cwd=tmp_path)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines() == error_lines(run)
    [line] = error_lines(run)
    assert "not valid UTF-8 text" in line and "0xFF" in line and "position 4" in line
    assert run.stdout == ""
    await assert_no_session(temporal_client, session_id)


async def test_chat_reports_undecodable_and_invisible_lines_in_one_line_each_and_goes_on(
    run_worker, cli_env, session_id, tmp_path
):
    # A strict stdin (as under a UTF-8 locale other than C.UTF-8) would raise UnicodeDecodeError.
    env = dict(cli_env, PYTHONIOENCODING="utf-8:strict")
    stdin = b"bad \xff byte\n\xe2\x80\x8b\xef\xbb\xbf\nWhat is (17 + 25) * 3?\n/quit\n"
    async with run_worker(ScriptedModel.demo()) as hermes:
        run = await run_cli("chat", "--session", session_id, env=env, cwd=tmp_path, stdin=stdin)
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr + run.stdout
        invalid, empty = error_lines(run)
        assert "not valid UTF-8 text" in invalid and "0xFF" in invalid
        assert empty == "error: the message is empty"
        assert "(17 + 25) * 3 = 126." in run.stdout
        transcript = await hermes.get_transcript(session_id)
        assert [m.content for m in transcript if m.role == "user"] == ["What is (17 + 25) * 3?"]


# --------------------------------------------------------------------------- cli: cut-off sends


def test_the_uncertain_send_message_gives_the_resend_command_with_the_same_message_id():
    settings = Settings(temporal_address="127.0.0.1:7233", task_queue="tq")
    resend = _resend_command("s 1", "it's 3 o'clock?", "msg-1", user="alice", as_json=True)
    assert shlex.split(resend) == [
        "hermes", "send", "s 1", "it's 3 o'clock?", "--message-id", "msg-1", "--user", "alice", "--json"
    ]
    message, code = _uncertain_send_message(
        RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""), settings, resend
    )
    assert code == EXIT_UNAVAILABLE
    assert message.startswith("Temporal at 127.0.0.1:7233 did not answer (UNAVAILABLE): tcp connect error.")
    assert "may have been taken" in message and message.endswith(resend)
    # A message that does not fit on one line is not repeated in the one-line error.
    multiline = _resend_command("s", "line 1\nline 2", "msg-2", user="bob", as_json=False)
    assert multiline == "hermes send s <the same message> --message-id msg-2 --user bob"


class TcpProxy:
    """Forwards TCP connections to ``target_port``; :meth:`cut` drops them all and stops
    listening, as a server outage looks to a client."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers |= {writer, upstream_writer}

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def cut(self) -> None:
        self.server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self.server.wait_closed()


@contextlib.asynccontextmanager
async def proxy_to(temporal_client: Client) -> AsyncIterator[TcpProxy]:
    port = int(temporal_client.service_client.config.target_host.rsplit(":", 1)[1])
    proxy = TcpProxy(port)
    proxy.port = await proxy.start()
    try:
        yield proxy
    finally:
        with contextlib.suppress(Exception):
            await proxy.cut()


async def test_send_cut_off_by_an_outage_prints_a_resend_command_that_returns_the_same_reply(
    run_worker, cli_env, session_id, temporal_client, tmp_path
):
    text = "What is (17 + 25) * 3?"
    async with proxy_to(temporal_client) as proxy:
        # The client rides out outages up to HERMES_CLIENT_RETRY_SECONDS (120 s by
        # default); this one lasts longer than the 3 s given here.
        env = dict(cli_env, TEMPORAL_ADDRESS=f"127.0.0.1:{proxy.port}", HERMES_CLIENT_RETRY_SECONDS="3")
        # No worker yet: the message waits in the session until the connection is lost.
        send = asyncio.ensure_future(run_cli("send", session_id, text, "--user", "alice", env=env, cwd=tmp_path))
        await wait_for_session(temporal_client, session_id)
        await proxy.cut()
        run = await send
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr and "WARN" not in run.stderr  # the core's retry lines are quiet
    [line] = error_lines(run)
    assert run.stderr.strip().splitlines()[-1] == line
    assert "UNAVAILABLE" in line and "may have been taken" in line
    resend = line.split("rerun with the same message id: ", 1)[1]
    args = shlex.split(resend)
    assert args[:4] == ["hermes", "send", session_id, text] and args[4] == "--message-id"
    assert args[5].startswith("msg-")

    async with run_worker(ScriptedModel.demo()) as hermes:
        again = await run_cli(*args[1:], "--json", env=cli_env, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        result = TurnResult.model_validate_json(again.stdout)
        assert (result.client_message_id, result.reply) == (args[5], "(17 + 25) * 3 = 126.")
        state = await hermes.get_state(session_id)
        assert (state.user_id, state.turn_count) == ("alice", 1)


async def test_send_interrupted_after_sending_prints_the_resend_command_and_exits_130(
    cli_env, session_id, temporal_client, tmp_path
):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes.cli", "send", session_id, "hello", "--message-id", "m-ctrl-c", "--user", "carol",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=cli_env, cwd=tmp_path,
    )
    try:
        await wait_for_session(temporal_client, session_id)  # no worker: the message waits
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130
    stderr = err.decode()
    assert "Traceback" not in stderr
    [line] = [x for x in stderr.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: interrupted. The message may have been taken")
    assert line.endswith(f"rerun with the same message id: hermes send {session_id} hello --message-id m-ctrl-c --user carol")


# --------------------------------------------------------------------------- calculate


@pytest.mark.parametrize(
    "expression, fragment",
    [
        ("(" * 5000 + "1" + ")" * 5000, "at most 1000 characters, received 10001"),
        ("-" * 5000 + "1", "at most 1000 characters, received 5001"),
        ("10.0 ** 1000", "too large"),
        ("1e308 * 10", "too large"),
        ("1 / (1e308 * 10)", "too large"),
        ("999999 ** 1000", "too large"),
        ("10 ** 999 * 10", "too large"),
        ("1.5 * 10 ** 400", "too large"),
    ],
)
def test_calculate_refuses_too_long_or_too_large_with_code_1(expression, fragment):
    result = calculate(expression)
    assert result.code == ToolResultCode.BAD_ARGUMENTS
    assert result.data is None
    assert result.message.startswith("expression: ") and fragment in result.message


@pytest.mark.parametrize(
    "expression, value",
    [("-" * 999 + "1", -1), ("-" * 998 + "1", 1), ("1" + "+1" * 499, 500), ("(" * 150 + "2" + ")" * 150, 2)],
)
def test_calculate_evaluates_deep_expressions_up_to_the_length_limit(expression, value):
    result = calculate(expression)
    assert result.code == ToolResultCode.OK, result.message
    assert result.data == {"expression": expression, "value": value}


def test_calculate_near_the_recursion_limit_returns_a_result_instead_of_raising():
    expression = "-" * 999 + "1"

    def at_depth(depth: int):
        return calculate(expression) if depth == 0 else at_depth(depth - 1)

    result = at_depth(sys.getrecursionlimit() - 150)
    if result.code == ToolResultCode.OK:  # a parser that does not count Python frames
        assert result.data["value"] == -1
    else:
        assert result.code == ToolResultCode.BAD_ARGUMENTS
        assert result.message.startswith("expression: nested too deeply")


async def test_calculate_overflow_in_a_session_is_code_1_after_one_attempt(run_worker, session_id, temporal_client):
    script = {
        "turns": [
            {
                "steps": [
                    {"tool_calls": [{"name": "calculate", "arguments": {"expression": "10.0 ** 1000"}}]},
                    {"reply": "code {{ last_tool_result.code }}"},
                ]
            }
        ]
    }
    async with run_worker(script) as hermes:
        result = await hermes.send_message(session_id, "What is 10.0 ** 1000?")
    [call] = result.tool_calls
    assert call.result.code == ToolResultCode.BAD_ARGUMENTS and "too large" in call.result.message
    assert result.reply == "code 1"
    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.HasField("activity_task_started_event_attributes")
    ]
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.count("run_tool") == 1
    assert set(attempts) == {1}  # no activity was retried


@pytest.mark.parametrize(
    ("pattern", "valid"),
    [
        ("hermes.tools.registry:TOOL_NAME_RE", "search_docs"),
        ("hermes.tools.builtin:STORED_REF_RE", "b:" + "0" * 32),
        ("hermes.tools.files:_HEADER_NAME_RE", "X-Api-Key"),
        ("hermes.mcp.config:_PLAIN_KEY_RE", "github"),
    ],
)
def test_name_patterns_refuse_a_trailing_newline(pattern: str, valid: str) -> None:
    # ``$`` also matches before a final newline: "_\n" passed as a tool name, and a header
    # name ending in a newline would have passed as valid.
    import importlib

    module, name = pattern.split(":")
    regex = getattr(importlib.import_module(module), name)
    assert regex.match(valid)
    assert not regex.match(valid + "\n")
