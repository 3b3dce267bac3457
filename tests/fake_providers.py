"""Local chat-completions endpoints, one per provider profile, that answer the way each
provider is documented (or publicly reported) to answer and refuse what it refuses.

A :class:`FakeProvider` is a ``ThreadingHTTPServer`` on 127.0.0.1 in a thread. It answers
``POST /v1/chat/completions`` with JSON, or with server-sent events (``data: {...}`` lines
ending ``data: [DONE]``) when the request says ``"stream": true``, in its provider's
dialect (see :mod:`hermes.providers.profiles` for the sources):

| fake | reasoning field | tool-call ids | stream usage | refuses (status, error body as the provider sends it) |
|---|---|---|---|---|
| openai | none | ``call_...`` | only with ``stream_options.include_usage`` | unknown message fields (``reasoning_content``) |
| openai-reasoning | none (counted in ``reasoning_tokens``) | ``call_...`` | same | ``max_tokens`` |
| deepseek | ``reasoning_content`` | ``call_00_...`` | same | an assistant tool-call message without ``reasoning_content`` |
| qwen | ``reasoning_content`` | ``call_...`` | same | (one call per answer unless ``parallel_tool_calls: true``) |
| moonshot | ``reasoning_content`` | ``name:0`` | in the last chunk's choice, always | an assistant tool-call message without ``reasoning_content`` |
| ollama | ``reasoning`` | ``call_...``; a streamed call comes whole | only with ``include_usage`` | ``"content": null`` |
| vllm | ``reasoning`` | ``chatcmpl-tool-...`` | only with ``include_usage`` | (arguments streamed in small pieces) |
| llamacpp | ``reasoning_content`` | ``""`` (empty) | in the last chunk, always | |

Every fake also refuses, as OpenAI does, a tool message that answers no earlier tool call
and an assistant tool call left without a tool message.

A stream can be cut (``cut_streams``): the next streamed answers end cleanly after the
first N events, without the chunk that carries ``finish_reason`` and without
``data: [DONE]``, as a proxy's or server's timeout ends one; or reset
(``reset_streams``): the connection is dropped with a TCP RST after N events (:func:`cut_in_text`,
:func:`cut_in_arguments` choose N).

What it answers comes from ``answer(body) -> Step`` (default: :func:`conversation_step`,
the conformance conversation, chosen by how many assistant messages the request carries:
stateless, so a retried or replayed request gets the same answer).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hermes.models import Message, ToolSpec

PROFILES = ("openai", "openai-reasoning", "deepseek", "qwen", "moonshot", "ollama", "vllm", "llamacpp")

REASONING_FIELD = {
    "deepseek": "reasoning_content",
    "qwen": "reasoning_content",
    "moonshot": "reasoning_content",
    "llamacpp": "reasoning_content",
    "ollama": "reasoning",
    "vllm": "reasoning",
}


@dataclass
class Call:
    name: str
    arguments: str | dict[str, Any]
    """A JSON string, as the wire has it (or an object, as some servers send)."""


@dataclass
class Step:
    """One scripted answer, before it is put in a provider's dialect."""

    content: str | None = None
    reasoning: str | None = None
    calls: list[Call] = field(default_factory=list)


# ------------------------------------------------------------ the conversation

TOOLS = [
    ToolSpec(
        name="get_weather",
        description="Today's weather in a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
    ToolSpec(name="list_notes", description="The user's notes.", parameters={"type": "object", "properties": {}}),
]
USER_1 = "北京今天天气怎么样？顺便列出我的笔记。"
USER_2 = "谢谢！"
REPLY_1 = "北京今天晴，25°C；你还没有笔记。"
REPLY_2 = "不客气！🙂"
STEPS = [
    Step(reasoning="用户要北京的天气和笔记：两个工具一起调用。", calls=[Call("get_weather", '{"city": "北京"}'), Call("list_notes", "{}")]),
    Step(reasoning="天气晴 25°C，没有笔记。", content=REPLY_1),
    Step(reasoning="礼貌回应。", content=REPLY_2),
]
TOOL_RESULTS = {"get_weather": {"code": 0, "message": "ok", "data": {"city": "北京", "sky": "晴", "celsius": 25}},
                "list_notes": {"code": 0, "message": "ok", "data": []}}


def conversation_step(body: dict[str, Any]) -> Step:
    """The conformance conversation's answer to ``body``: step = assistant messages so far."""
    done = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
    return STEPS[min(done, len(STEPS) - 1)]


def opening_messages() -> list[Message]:
    return [Message(role="system", content="你是一个有用的助手。"), Message(role="user", content=USER_1)]


def tool_messages(assistant: Message) -> list[Message]:
    """The tool results for ``assistant``'s calls, as a session would add them."""
    return [
        Message(role="tool", tool_call_id=c.tool_call_id, name=c.name, content=json.dumps(TOOL_RESULTS[c.name], ensure_ascii=False))
        for c in assistant.tool_calls
    ]


# ------------------------------------------------------------ refusals


def _error(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _unanswered(messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any]] | None:
    """OpenAI's own pairing rules for tool calls and tool messages."""
    open_ids: list[str] = []
    for m in messages:
        if m.get("role") == "tool":
            if m.get("tool_call_id") not in open_ids:
                return 400, _error(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    param="messages.[].role",
                )
            open_ids.remove(m["tool_call_id"])
            continue
        if open_ids:
            return 400, _error(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(open_ids)}",
                param="messages",
            )
        if m.get("role") == "assistant":
            open_ids = [c.get("id") for c in m.get("tool_calls") or []]
    return None


_OPENAI_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio", "function_call"}


def refusal(profile: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """What ``profile``'s provider answers instead of a completion, if it refuses ``body``."""
    messages = body.get("messages") or []
    if profile in ("openai", "openai-reasoning"):
        if profile == "openai-reasoning" and "max_tokens" in body:
            return 400, _error(
                "Unsupported parameter: 'max_tokens' is not supported with this model. Use 'max_completion_tokens' instead.",
                param="max_tokens",
                code="unsupported_parameter",
            )
        for index, m in enumerate(messages):
            extra = sorted(set(m) - _OPENAI_MESSAGE_FIELDS)
            if extra:
                return 400, _error(f"Additional properties are not allowed ('{extra[0]}' was unexpected) - 'messages.{index}'")
    if profile in ("deepseek", "moonshot"):
        for index, m in enumerate(messages):
            if m.get("role") == "assistant" and m.get("tool_calls") and "reasoning_content" not in m:
                if profile == "deepseek":
                    return 400, _error(
                        f"Missing `reasoning_content` field in the assistant message at message index {index}. For more "
                        "information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls",
                        code="invalid_request_error",
                    )
                return 400, _error(
                    f"thinking is enabled but reasoning_content is missing in assistant tool call message at index {index}"
                )
    if profile == "ollama":
        for m in messages:
            if "content" in m and m["content"] is None:
                return 400, _error("invalid message content type: <nil>")
    return _unanswered(messages)


# ------------------------------------------------------------ answers


def _tool_call_id(profile: str, step: int, index: int, name: str) -> str:
    return {
        "deepseek": f"call_0{index}_s{step}dsk",
        "moonshot": f"{name}:{index}",
        "vllm": f"chatcmpl-tool-s{step}i{index}",
        "llamacpp": "",
    }.get(profile, f"call_s{step}i{index}")


def _usage(profile: str, body: dict[str, Any]) -> dict[str, Any]:
    prompt = 10 * len(body.get("messages") or [])
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": 7, "total_tokens": prompt + 7}
    if profile == "openai-reasoning":
        usage["completion_tokens_details"] = {"reasoning_tokens": 64}
    return usage


def _calls(profile: str, step: Step, body: dict[str, Any], step_index: int) -> list[Call]:
    if profile == "qwen" and body.get("parallel_tool_calls") is not True:
        return step.calls[:1]  # DashScope: parallel_tool_calls defaults to false
    return step.calls


def completion(profile: str, step: Step, body: dict[str, Any], step_index: int = 0) -> dict[str, Any]:
    """A non-streamed answer in ``profile``'s shape."""
    calls = _calls(profile, step, body, step_index)
    content = step.content
    if content is None and profile in ("ollama", "moonshot"):
        content = ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    field_name = REASONING_FIELD.get(profile)
    if field_name and step.reasoning:
        message[field_name] = step.reasoning
    if calls:
        message["tool_calls"] = [
            {"id": _tool_call_id(profile, step_index, i, c.name), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)
        ]
    return {
        "id": f"chatcmpl-{profile}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": body.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": _usage(profile, body),
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def chunks(profile: str, step: Step, body: dict[str, Any], step_index: int = 0) -> list[dict[str, Any]]:
    """The streamed answer in ``profile``'s shape (without the final ``[DONE]``)."""
    calls = _calls(profile, step, body, step_index)
    model = body.get("model", "fake-model")

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]
        return {"id": f"chatcmpl-{profile}", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model, "choices": choices}

    out = [chunk({"role": "assistant", "content": ""})]
    field_name = REASONING_FIELD.get(profile)
    if field_name and step.reasoning:
        out += [chunk({field_name: piece}) for piece in _pieces(step.reasoning, 4)]
    if step.content:
        out += [chunk({"content": piece}) for piece in _pieces(step.content, 3)]
    for i, c in enumerate(calls):
        tcid = _tool_call_id(profile, step_index, i, c.name)
        if profile == "ollama" or isinstance(c.arguments, dict):
            # Ollama sends each call whole, in one chunk.
            out.append(chunk({"tool_calls": [{"index": i, "id": tcid, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}]}))
            continue
        out.append(chunk({"tool_calls": [{"index": i, "id": tcid, "type": "function", "function": {"name": c.name, "arguments": ""}}]}))
        size = 2 if profile == "vllm" else 6
        for piece in _pieces(c.arguments, size):
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    finish = "tool_calls" if calls else "stop"
    usage = _usage(profile, body)
    if profile == "moonshot":
        out.append(chunk({}, finish, usage=usage))  # Kimi: usage in the last chunk's choice
    elif profile == "llamacpp":
        last = chunk({}, finish)
        last["usage"] = usage  # llama-server: usage in the last chunk, always
        out.append(last)
    else:
        out.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            last = chunk(None)
            last["usage"] = usage
            out.append(last)
    return out


def completion_to_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A completion (as :func:`tests.test_openai_provider.completion` makes) told as OpenAI streams it."""
    message = body["choices"][0]["message"] if body.get("choices") else {}
    step = Step(
        content=message.get("content"),
        calls=[Call(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []],
    )
    out = chunks("openai", step, {"model": body.get("model"), "stream_options": {"include_usage": True}})
    ids = [c["id"] for c in message.get("tool_calls") or []]
    for piece in out:
        for choice in piece["choices"]:
            for tc in choice["delta"].get("tool_calls") or []:
                if "id" in tc:
                    tc["id"] = ids[tc["index"]]
    if body.get("usage") is not None:
        out[-1]["usage"] = body["usage"]
    else:
        out.pop()
    return out


# ------------------------------------------------------------ cut streams

Cut = Callable[[list[dict[str, Any]]], int]
"""Chooses how many of a streamed answer's events are sent before the stream ends."""


def _delta_of(event: dict[str, Any]) -> dict[str, Any]:
    return event["choices"][0]["delta"] if event.get("choices") else {}


def cut_in_text(events: list[dict[str, Any]]) -> int:
    """Right after the first piece of reply text (a sentence cut mid-way)."""
    return next(i for i, e in enumerate(events) if _delta_of(e).get("content")) + 1


def cut_in_arguments(events: list[dict[str, Any]]) -> int:
    """Right after the first piece of a tool call's arguments (a call whose arguments
    arrive whole, as Ollama sends them, is cut after that call, before its finish)."""
    for i, e in enumerate(events):
        for tc in _delta_of(e).get("tool_calls") or ():
            if (tc.get("function") or {}).get("arguments"):
                return i + 1
    raise ValueError("no tool-call arguments in this stream")


def cut_before_arguments(events: list[dict[str, Any]]) -> int:
    """Right after the chunk naming the first tool call, before any of its arguments."""
    return next(i for i, e in enumerate(events) if _delta_of(e).get("tool_calls")) + 1


# ------------------------------------------------------------ the server


def _dumps(value: Any) -> bytes:
    """UTF-8 JSON as providers send it; escaped where a lone surrogate could not be encoded
    (a test of what Hermes does with one, as some servers send)."""
    try:
        return json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(value).encode()


class FakeProvider:
    """One provider's endpoint (see the module docstring), recording every request.

    Args:
        profile: a name from :data:`PROFILES`.
        answer: what to answer a request that is not refused (default: the conversation).
    """

    def __init__(self, profile: str = "openai", answer: Callable[[dict[str, Any]], Step] | None = None) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile: expected one of {PROFILES}, got {profile!r}")
        self.profile = profile
        self.answer = answer or conversation_step
        self.requests: list[dict[str, Any]] = []
        self.refused: list[tuple[int, dict[str, Any]]] = []
        self.scripted: list[tuple[int, dict[str, str], dict[str, Any]]] = []
        """Raw answers played first, in order: ``(status, headers, body)``."""
        self.default: dict[str, Any] | None = None
        """When set, the raw completion answered once ``scripted`` is used up."""
        self.chunk_delay_seconds = 0.0
        self.cut_streams: list[Cut] = []
        """The next streamed answers, in order, are cut where these say (see the module
        docstring); answers after them stream whole."""
        self.reset_streams: list[Cut] = []
        """The next streamed answers, in order, stop where these say with the connection
        reset (TCP RST, no final chunk): a dropped connection mid-answer. Used after
        ``cut_streams`` runs out."""
        self.ignores_stream = False
        """Answer JSON even when asked to stream, as some gateways in front of
        OpenAI-compatible servers do."""
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # no 40 ms Nagle / delayed-ACK stall between headers and body

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.requests.append(
                        {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body, "at": time.monotonic()}
                    )
                    raw = fake.scripted.pop(0) if fake.scripted else None
                if raw is None and fake.default is not None:
                    raw = (200, {}, fake.default)
                if raw is not None:
                    status, headers, answer = raw
                    if status == 200 and body.get("stream") and "choices" in answer and not fake.ignores_stream:
                        return self._stream(completion_to_chunks(answer))
                    return self._json(status, answer, headers)
                refused = refusal(fake.profile, body)
                if refused is not None:
                    with fake._lock:
                        fake.refused.append(refused)
                    return self._json(*refused)
                step_index = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
                step = fake.answer(body)
                if body.get("stream") and not fake.ignores_stream:
                    return self._stream(chunks(fake.profile, step, body, step_index))
                return self._json(200, completion(fake.profile, step, body, step_index))

            def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = _dumps(body)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, events: list[dict[str, Any]]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                with fake._lock:
                    cut = fake.cut_streams.pop(0) if fake.cut_streams else None
                    reset = fake.reset_streams.pop(0) if cut is None and fake.reset_streams else None
                for event in events[: (cut or reset)(events)] if cut or reset else events:
                    self._write_chunk(b"data: " + _dumps(event) + b"\n\n")
                    if fake.chunk_delay_seconds:
                        time.sleep(fake.chunk_delay_seconds)
                if reset is not None:
                    # Let the client read what was sent first: an RST drops unread data.
                    time.sleep(1.0)
                    # SO_LINGER 0: close() sends RST, as a crashed server or a proxy does.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if cut is None:
                    self._write_chunk(b"data: [DONE]\n\n")
                self._write_chunk(b"")

            def _write_chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-{profile}", daemon=True
        )

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
