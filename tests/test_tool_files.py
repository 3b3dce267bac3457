"""Tools described in files and implemented by an HTTP endpoint (hermes.tools.files / .http).

The endpoint is a real local HTTP server (stdlib ``ThreadingHTTPServer``) that records
every request; the end-to-end test runs a session through the real Temporal and Redis
fixtures with a scripted model.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes.errors import ConfigError, ToolArgumentsError, ToolFailure, ToolRegistrationError
from hermes.models import ToolResult, ToolResultCode
from hermes.infra.stack import free_port
from hermes.tools.builtin import register_builtins
from hermes.tools.files import load_tool_file, register_tool_file
from hermes.tools.http import EndpointUnavailableError, HttpTool
from hermes.tools.registry import CompositeTool, ToolContext, ToolRegistry
from tests.support import decoded_history

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tools" / "weather.yaml"
SECRET = "tok-7Hq2-very-secret-9Zx"
CONTEXT = ToolContext(session_id="session-1", user_id="alice", tool_call_id="call_1", turn=3, call_key="session-1:run:3:call_1")


# ---------------------------------------------------------------- a recording endpoint


class Endpoint:
    """A local HTTP server that records requests and answers by path:

    - ``/v1/current/<city>``, ``/v1/forecast``, ``/v1/alerts``: a small weather service
      (``current`` echoes the Authorization header it received, to prove redaction);
    - ``/status/<code>``: that status, with a body quoting the Authorization header;
    - ``/echo``: the request as JSON; ``/text``: a plain-text body;
    - ``/slow``: answers only when the test ends (a request that times out).
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def handle_any(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                record = {
                    "method": self.command,
                    "raw_path": parts.path,
                    "path": urllib.parse.unquote(parts.path),
                    "query": urllib.parse.parse_qs(parts.query),
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": json.loads(raw) if raw and "json" in self.headers.get("content-type", "") else raw.decode(),
                }
                endpoint.requests.append(record)
                status, body, headers = endpoint.answer(record)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def answer(self, r: dict[str, Any]) -> tuple[int, Any, dict[str, str]]:
        path, auth = r["path"], r["headers"].get("authorization", "")
        if path.startswith("/v1/current/"):
            city = path.removeprefix("/v1/current/")
            units = r["query"].get("units", ["metric"])[0]
            return 200, {
                "status": {"text": f"Sunny in {city}"},
                "current": {"city": city, "conditions": "sunny", "temperature": 21, "units": units, "seen_authorization": auth},
            }, {}
        if path == "/v1/forecast":
            days = int(r["query"]["days"][0])
            return 200, {"forecast": {"days": [{"day": i, "high": 20 + i} for i in range(days)]}}, {}
        if path == "/v1/alerts":
            return 201, {"subscription": {"subscription_id": "sub-1", **r["body"], "key": r["headers"].get("idempotency-key")}}, {}
        if path.startswith("/status/"):
            code = int(path.removeprefix("/status/"))
            headers = {"Retry-After": "7"} if code == 429 else {"Location": f"{self.url}/elsewhere"} if code == 302 else {}
            if code == 204:
                return 204, b"", headers
            return code, {"error": f"status {code}", "you_sent": auth}, headers
        if path == "/echo":
            return 200, r, {}
        if path == "/text":
            return 200, b"plain words", {"Content-Type": "text/plain"}
        if path == "/slow":
            self.release.wait(30)
            return 200, {}, {}
        return 404, {"error": f"no route {path}"}, {}

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[Endpoint]:
    with Endpoint() as server:
        monkeypatch.setenv("WEATHER_API_URL", server.url)
        monkeypatch.setenv("WEATHER_API_TOKEN", SECRET)
        yield server


def example_tools() -> dict[str, Any]:
    tools, _ = load_tool_file(EXAMPLE)
    return {t.name: t for t in tools}


def write(tmp_path: Path, data: Any, name: str = "tools.yaml") -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8")
    elif name.endswith(".json"):
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def one_tool(tmp_path: Path, **spec: Any) -> HttpTool:
    tools, _ = load_tool_file(write(tmp_path, {"tools": [{"name": "t", "description": "A test tool.", **spec}]}))
    assert isinstance(tools[0], HttpTool)
    return tools[0]


async def call(tool: Any, arguments: dict[str, Any]) -> ToolResult:
    """Validate and invoke like the tool activity; a ToolFailure becomes its result."""
    validated = tool.validate(arguments)
    try:
        return await tool.invoke(validated, CONTEXT)
    except ToolFailure as err:
        return ToolResult(code=err.code, message=str(err), data=err.data)


# ---------------------------------------------------------------- requests


async def test_get_fills_url_placeholders_encoded_sends_other_arguments_as_query_and_the_env_secret_header(endpoint):
    tool = example_tools()["get_weather"]
    result = await call(tool, {"city": "São Paulo/Centro", "units": "imperial"})

    request = endpoint.requests[-1]
    assert request["method"] == "GET"
    assert request["raw_path"] == "/v1/current/S%C3%A3o%20Paulo%2FCentro"
    assert request["query"] == {"units": ["imperial"]}
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    assert result.code == ToolResultCode.OK
    assert result.message == "Sunny in São Paulo/Centro"  # response.message path
    assert result.data["temperature"] == 21 and result.data["units"] == "imperial"  # response.data path


async def test_explicit_query_mapping_renames_arguments_and_a_response_path_can_index_lists(endpoint, tmp_path):
    result = await call(example_tools()["get_forecast"], {"city": "Paris", "days": 2, "units": "metric"})
    request = endpoint.requests[-1]
    assert request["path"] == "/v1/forecast"
    assert request["query"] == {"q": ["Paris"], "days": ["2"], "units": ["metric"]}
    assert result.code == 0 and result.data == [{"day": 0, "high": 20}, {"day": 1, "high": 21}]

    tool = one_tool(tmp_path, parameters={"type": "object", "properties": {"city": {"type": "string"}}},
                    http={"url": f"{endpoint.url}/v1/forecast", "query": {"q": "{city}", "days": 3},
                          "response": {"data": "forecast.days.2.high"}})
    assert (await call(tool, {"city": "Oslo"})).data == 22


async def test_post_sends_arguments_as_a_json_body_with_the_idempotency_key_header(endpoint):
    tool = example_tools()["subscribe_weather_alert"]
    assert (tool.idempotency, tool.permission, tool.tier) == ("keyed", "write", "external")
    result = await call(tool, {"city": "Paris", "kinds": ["storm", "flood"]})

    request = endpoint.requests[-1]
    assert request["method"] == "POST" and request["path"] == "/v1/alerts"
    assert request["headers"]["content-type"] == "application/json"
    assert request["body"] == {"city": "Paris", "kinds": ["storm", "flood"]}
    assert request["headers"]["idempotency-key"] == CONTEXT.idempotency_key
    assert result.code == 0 and result.message == "HTTP 201 Created"
    assert result.data == {"subscription_id": "sub-1", "city": "Paris", "kinds": ["storm", "flood"], "key": CONTEXT.idempotency_key}


async def test_a_body_template_keeps_argument_types_and_leaves_out_what_the_call_did_not_give(endpoint, tmp_path):
    tool = one_tool(
        tmp_path,
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}, "count": {"type": "integer"}, "note": {"type": "string"}},
            "required": ["city", "count"],
        },
        http={
            "method": "PUT",
            "url": f"{endpoint.url}/echo",
            "body": {"where": {"town": "{city}"}, "n": "{count}", "label": "city={city} n={count}", "note": "{note}", "fixed": True},
            "headers": {"X-City": "{city}"},
        },
    )
    assert tool.idempotency == "none"  # not GET/HEAD and not keyed
    result = await call(tool, {"city": "Lyon", "count": 4})
    assert result.data["body"] == {"where": {"town": "Lyon"}, "n": 4, "label": "city=Lyon n=4", "fixed": True}
    assert result.data["headers"]["x-city"] == "Lyon"
    assert result.data["query"] == {}


async def test_a_text_body_is_the_data_and_a_head_request_returns_the_headers(endpoint, tmp_path):
    text_tool = one_tool(tmp_path, http={"url": f"{endpoint.url}/text"})
    result = await call(text_tool, {})
    assert (result.code, result.data) == (0, "plain words")

    head_tool = one_tool(tmp_path, http={"method": "head", "url": f"{endpoint.url}/echo"})
    result = await call(head_tool, {})
    assert result.code == 0 and result.data["status"] == 200 and "content-type" in result.data["headers"]
    assert endpoint.requests[-1]["method"] == "HEAD"


async def test_a_response_path_the_answer_lacks_is_a_dependency_failure_naming_the_path(endpoint, tmp_path):
    tool = one_tool(tmp_path, http={"url": f"{endpoint.url}/echo", "response": {"data": "results.0"}})
    result = await call(tool, {})
    assert result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
    assert "'results.0'" in result.message and str(tmp_path / "tools.yaml") in result.message


# ---------------------------------------------------------------- outcomes


@pytest.mark.parametrize(
    ("status", "code"),
    [(200, 0), (201, 0), (204, 0), (400, 1), (404, 1), (409, 1), (422, 1), (401, 3), (403, 3), (302, 2), (405, 2)],
)
async def test_each_status_class_maps_to_its_result_code(endpoint, tmp_path, status, code):
    tool = one_tool(tmp_path, http={"url": f"{endpoint.url}/status/{status}"})
    result = await call(tool, {})
    assert result.code == code
    if code in (1, 3):
        assert f"HTTP {status}" in result.message and f"status {status}" in result.message  # status + body snippet
        assert result.data["status"] == status
    if status == 204:
        assert result.data is None
    if status == 302:
        assert "redirect" in result.message


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
async def test_retryable_statuses_raise_so_the_activity_retries_them(endpoint, tmp_path, status):
    tool = one_tool(tmp_path, http={"url": f"{endpoint.url}/status/{status}"})
    with pytest.raises(EndpointUnavailableError) as caught:
        await tool.invoke(tool.validate({}), CONTEXT)
    assert not isinstance(caught.value, ToolFailure)
    assert caught.value.status_code == status
    assert caught.value.retry_after_seconds == (7.0 if status == 429 else None)


async def test_a_connection_failure_raises_so_the_activity_retries_it(tmp_path):
    tool = one_tool(tmp_path, http={"method": "POST", "url": f"http://127.0.0.1:{free_port()}/nothing"})
    with pytest.raises(EndpointUnavailableError, match="could not connect"):
        await tool.invoke(tool.validate({}), CONTEXT)


async def test_a_read_timeout_is_code_4_outcome_unknown(endpoint, tmp_path):
    tool = one_tool(tmp_path, timeout_seconds=0.5, http={"method": "POST", "url": f"{endpoint.url}/slow"})
    result = await call(tool, {})
    assert result.code == ToolResultCode.OUTCOME_UNKNOWN
    assert "timed out" in result.message and "outcome unknown" in result.message


# ---------------------------------------------------------------- arguments


async def test_loose_model_arguments_are_coerced_through_a_file_tool(endpoint, tmp_path):
    tool = one_tool(
        tmp_path,
        parameters={
            "type": "object",
            "properties": {
                "count": {"type": "integer", "minimum": 1},
                "notify": {"type": "boolean"},
                "level": {"type": "string", "enum": ["low", "high"]},
            },
            "required": ["count", "notify", "level"],
        },
        http={"method": "POST", "url": f"{endpoint.url}/echo"},
    )
    result = await call(tool, {"count": "3", "notify": "TRUE", "level": "HIGH"})
    assert result.code == 0
    assert endpoint.requests[-1]["body"] == {"count": 3, "notify": True, "level": "high"}

    with pytest.raises(ToolArgumentsError) as caught:
        tool.validate({"count": "three", "notify": True, "level": "low"})
    assert [p["field"] for p in caught.value.problems] == ["count"]
    with pytest.raises(ToolArgumentsError):  # arguments the schema does not name are refused
        tool.validate({"count": 1, "notify": True, "level": "low", "extra": 1})


# ---------------------------------------------------------------- secrets


async def test_env_secrets_never_appear_in_spec_repr_results_or_errors(endpoint, tmp_path):
    tools = example_tools()
    tool = tools["get_weather"]
    spec = tool.spec(tier_seconds=lambda tier: 30.0, heartbeat_timeout_seconds=5.0)
    assert SECRET not in spec.model_dump_json() and SECRET not in repr(tool) and SECRET not in str(tools)
    assert "${WEATHER_API_TOKEN}" not in spec.model_dump_json()  # not even where it comes from

    ok = await call(tool, {"city": "Paris"})  # the endpoint echoes the Authorization header
    assert ok.data["seen_authorization"] == "Bearer ***"
    assert SECRET not in ok.model_dump_json()

    leaky = one_tool(tmp_path, http={"url": f"{endpoint.url}/status/401", "headers": {"Authorization": "Bearer ${WEATHER_API_TOKEN}"}})
    denied = await call(leaky, {})
    assert denied.code == 3 and "Bearer ***" in denied.message and SECRET not in denied.model_dump_json()

    failing = one_tool(tmp_path, http={"url": f"{endpoint.url}/status/503", "headers": {"Authorization": "${WEATHER_API_TOKEN}"}})
    with pytest.raises(EndpointUnavailableError) as caught:
        await failing.invoke(failing.validate({}), CONTEXT)
    assert "***" in str(caught.value) and SECRET not in str(caught.value)


def test_an_unset_environment_variable_is_refused_at_load_naming_it(tmp_path, monkeypatch):
    monkeypatch.delenv("HERMES_TEST_UNSET_TOKEN", raising=False)
    path = write(tmp_path, {"tools": [{"name": "t", "description": "d", "http": {
        "url": "http://127.0.0.1:9/x", "headers": {"Authorization": "Bearer ${HERMES_TEST_UNSET_TOKEN}"}}}]})
    with pytest.raises(ConfigError) as caught:
        load_tool_file(path)
    assert caught.value.key == "tools[0].http.headers.Authorization"
    assert "HERMES_TEST_UNSET_TOKEN" in str(caught.value)


async def test_a_doubled_dollar_escapes_an_env_reference(endpoint, tmp_path):
    tool = one_tool(tmp_path, http={"url": f"{endpoint.url}/echo", "headers": {"X-Literal": "$${NOT_ENV} and {{x}}"}})
    await call(tool, {})
    assert endpoint.requests[-1]["headers"]["x-literal"] == "${NOT_ENV} and {x}"


# ---------------------------------------------------------------- the file


def test_the_example_file_declares_groups_http_tools_and_a_composite(endpoint):
    registry = ToolRegistry()
    loaded = register_tool_file(registry, EXAMPLE)
    registry.check_references()
    assert [t.name for t in loaded] == ["get_weather", "get_forecast", "subscribe_weather_alert", "weather_brief"]
    group = next(g for g in registry.groups if g.name == "weather")
    assert "天气" in group.keywords
    weather = registry.get("get_weather")
    assert (weather.tier, weather.idempotency, weather.permission, weather.timeout_seconds) == ("external", "idempotent", "read", 10)
    assert "\nUse when: The user asks what the weather" in weather.description
    assert "\nDo not use when: The user asks about the coming days" in weather.description
    assert weather.parameters_schema["properties"]["city"]["examples"] == ["Paris", "上海", "New York"]
    brief = registry.get("weather_brief")
    assert isinstance(brief, CompositeTool)
    assert [(s.name, s.tool) for s in brief.steps] == [("now", "get_weather"), ("next_days", "get_forecast")]
    assert (brief.tier, brief.permission, brief.idempotency) == ("batch", "read", "idempotent")
    assert brief.spec(tier_seconds=lambda t: 60.0, heartbeat_timeout_seconds=5.0).composite is not None


def test_a_json_file_loads_like_a_yaml_one(tmp_path):
    data = {"tools": [{"name": "ping", "description": "Ping.", "http": {"method": "GET", "url": "https://example.com/ping"}}]}
    tools, groups = load_tool_file(write(tmp_path, data, "tools.json"))
    assert [t.name for t in tools] == ["ping"] and groups == []


def base_tool(**changes: Any) -> dict[str, Any]:
    tool: dict[str, Any] = {
        "name": "get_weather",
        "description": "Weather now.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "units": {"type": "string"}}, "required": ["city"]},
        "http": {"method": "GET", "url": "http://127.0.0.1:9/weather/{city}"},
    }
    for dotted, value in changes.items():
        target = tool
        *parents, last = dotted.split("__")
        for parent in parents:
            target = target[parent]
        if value is ...:
            target.pop(last)
        else:
            target[last] = value
    return tool


BAD_FILES = [
    # (id, file content, file name, key, fragments of the message)
    ("unknown top-level key", {"tool": [base_tool()]}, "t.yaml", "tool", ["unknown key 'tool'", "did you mean 'tools'", "expected one of: groups, tools"]),
    ("misspelt tool key", {"tools": [base_tool(descripton="x")]}, "t.yaml", "tools[0].descripton", ["unknown key 'descripton'", "expected one of"]),
    ("misspelt http key", {"tools": [base_tool(http__methdo="GET")]}, "t.json", "tools[0].http.methdo", ["did you mean 'method'", "url"]),
    ("misspelt response key", {"tools": [base_tool(http__response={"date": "x"})]}, "t.yaml", "tools[0].http.response.date", ["did you mean 'data'"]),
    ("bad method", {"tools": [base_tool(http__method="FETCH")]}, "t.yaml", "tools[0].http.method", ["'GET'", "'POST'", "found 'FETCH'"]),
    ("bad tier", {"tools": [base_tool(tier="slow")]}, "t.yaml", "tools[0].tier", ["'query', 'external' or 'batch'", "found 'slow'"]),
    ("bad permission", {"tools": [base_tool(permission="root")]}, "t.yaml", "tools[0].permission", ["'read', 'write' or 'admin'", "found 'root'"]),
    ("bad idempotency", {"tools": [base_tool(idempotency="maybe")]}, "t.yaml", "tools[0].idempotency", ["'idempotent', 'keyed' or 'none'"]),
    ("missing description", {"tools": [base_tool(description=...)]}, "t.yaml", "tools[0].description", ["required key 'description' is missing"]),
    ("empty description", {"tools": [base_tool(description="  ")]}, "t.yaml", "tools[0].description", ["expected a description"]),
    ("missing url", {"tools": [base_tool(http__url=...)]}, "t.yaml", "tools[0].http.url", ["required key 'url'"]),
    ("wrong type", {"tools": [base_tool(next_possible_tools="get_forecast")]}, "t.yaml", "tools[0].next_possible_tools", ["expected a valid list", "found 'get_forecast'"]),
    ("zero timeout", {"tools": [base_tool(timeout_seconds=0)]}, "t.yaml", "tools[0].timeout_seconds", ["expected greater than 0", "found 0"]),
    ("tools not a list", {"tools": {"name": "x"}}, "t.yaml", "tools", ["expected a valid list"]),
    ("parameters not an object schema", {"tools": [base_tool(parameters={"type": "string"})]}, "t.yaml", "tools[0].parameters", ["expected a JSON Schema", "object"]),
    ("parameters invalid schema", {"tools": [base_tool(parameters={"type": "object", "properties": {"city": {"type": "integr"}}})]}, "t.yaml", "tools[0].parameters", ["expected a JSON Schema", "integr"]),
    ("returns invalid schema", {"tools": [base_tool(returns={"type": 5})]}, "t.yaml", "tools[0].returns", ["expected a JSON Schema", "5"]),
    ("duplicate tool names", {"tools": [base_tool(), base_tool()]}, "t.yaml", "tools[1].name", ["'get_weather' is already used by tools[0]", "expected unique"]),
    ("duplicate group names", {"groups": [{"name": "w"}, {"name": "w"}], "tools": [base_tool()]}, "t.yaml", "groups[1].name", ["already declared", "expected unique"]),
    ("invalid tool name", {"tools": [base_tool(name="get weather")]}, "t.yaml", "tools[0].name", ["expected 1-64 letters", "found 'get weather'"]),
    ("url placeholder not a parameter", {"tools": [base_tool(http__url="http://h/weather/{town}")]}, "t.yaml", "tools[0].http.url", ["{town} is not a parameter", "expected one of the parameters (city, units)"]),
    ("optional url placeholder", {"tools": [base_tool(http__url="http://h/weather/{units}/{city}")]}, "t.yaml", "tools[0].http.url", ["{units}", "expected 'units' to be required or to have a default"]),
    ("query placeholder not a parameter", {"tools": [base_tool(http__query={"u": "{unit}"})]}, "t.yaml", "tools[0].http.query", ["{unit} is not a parameter"]),
    ("parameter never sent", {"tools": [base_tool(http__query={"fixed": "1"})]}, "t.yaml", "tools[0].http.query", ["'units' is never sent", "expected it in the url, query, body or headers"]),
    ("body on a GET", {"tools": [base_tool(http__body={"city": "{city}"})]}, "t.yaml", "tools[0].http.body", ["GET request has no body", "expected `query`"]),
    ("not an http url", {"tools": [base_tool(http__url="ftp://h/{city}")]}, "t.yaml", "tools[0].http.url", ["expected an absolute http:// or https:// url", "ftp://h/{city}"]),
    ("bad env syntax", {"tools": [base_tool(http__headers={"Authorization": "Bearer ${bad-name}"})]}, "t.yaml", "tools[0].http.headers.Authorization", ["expected ${NAME}"]),
    ("bad header name", {"tools": [base_tool(http__headers={"Bad Header": "x"})]}, "t.yaml", "tools[0].http.headers.Bad Header", ["expected a header name"]),
    ("bad response path", {"tools": [base_tool(http__response={"data": "a..b"})]}, "t.yaml", "tools[0].http.response.data", ["expected a dotted path", "found 'a..b'"]),
    ("keyed without a header", {"tools": [base_tool(idempotency="keyed")]}, "t.yaml", "tools[0].idempotency", ["needs http.keyed_header", "expected it to be set"]),
    ("keyed header on a non-keyed tool", {"tools": [base_tool(idempotency="none", http__keyed_header="Idempotency-Key")]}, "t.yaml", "tools[0].http.keyed_header", ["only for idempotency: keyed", "expected keyed", "found idempotency 'none'"]),
    ("neither http nor composite", {"tools": [base_tool(http=...)]}, "t.yaml", "tools[0]", ["expected exactly one of `http`", "found neither"]),
    ("both http and composite", {"tools": [base_tool(composite={"steps": [{"tool": "x"}]})]}, "t.yaml", "tools[0]", ["expected exactly one of `http`", "found both"]),
    ("composite without steps", {"tools": [base_tool(http=..., composite={"steps": []})]}, "t.yaml", "tools[0].composite.steps", ["expected at least one step"]),
    ("composite duplicate steps", {"tools": [base_tool(http=..., composite={"steps": [{"tool": "a"}, {"tool": "a"}]})]}, "t.yaml", "tools[0].composite.steps[1].tool", ["'a' is already used by steps[0]"]),
    ("composite unknown $args", {"tools": [base_tool(http=..., composite={"steps": [{"tool": "a", "arguments": {"c": "$args.town"}}]})]}, "t.yaml", "tools[0].composite.steps[0].arguments.c", ["'$args.town' names no parameter", "expected $args.<one of: city, units>"]),
    ("composite with idempotency", {"tools": [base_tool(http=..., idempotency="none", composite={"steps": [{"tool": "a"}]})]}, "t.yaml", "tools[0].idempotency", ["comes from its steps"]),
    ("top level a list", "- name: x\n", "t.yaml", None, ["expected a mapping with a `tools` list", "found a list"]),
    ("empty file", "", "t.yaml", None, ["expected a mapping", "found an empty file"]),
    ("yaml syntax error", "tools:\n  - name: x\n    description: [unclosed\n", "t.yaml", None, ["not valid YAML at line", "column"]),
    ("yaml duplicate key", "tools:\n  - name: x\n    name: y\n", "t.yaml", None, ["duplicate key 'name'", "line 3", "expected each key once"]),
    ("json syntax error", '{"tools": [\n  {"name": "x",}\n]}', "t.json", None, ["not valid JSON at line 2", "column"]),
    ("json duplicate key", '{"tools": [], "tools": []}', "t.json", None, ["duplicate key 'tools'", "expected each key once"]),
    ("wrong extension", "tools: []", "t.txt", None, ["expected a tool file ending in .json, .yaml or .yml", "'.txt'"]),
]


@pytest.mark.parametrize(("content", "name", "key", "fragments"), [case[1:] for case in BAD_FILES], ids=[case[0] for case in BAD_FILES])
def test_every_kind_of_bad_file_is_refused_with_the_file_the_key_and_what_was_expected(tmp_path, content, name, key, fragments):
    path = write(tmp_path, content, name)
    with pytest.raises(ConfigError) as caught:
        load_tool_file(path)
    err = caught.value
    assert err.source == str(path)
    assert err.key == key
    assert str(err).startswith(f"{path}: {key + ': ' if key else ''}")
    assert "expected" in str(err)
    for fragment in fragments:
        assert fragment in str(err)


def test_a_missing_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="tool file not found") as caught:
        load_tool_file(path)
    assert caught.value.source == str(path)


def test_a_file_tool_with_the_name_of_a_decorated_tool_is_refused_either_way(tmp_path):
    path = write(tmp_path, {"tools": [base_tool(name="current_time")]})

    registry = register_builtins(ToolRegistry())
    with pytest.raises(ToolRegistrationError) as caught:
        register_tool_file(registry, path)
    assert "'current_time' is already registered" in str(caught.value)
    assert str(caught.value).startswith(f"{path}: ")  # the file, and where the first one is from
    assert "hermes.tools.builtin.current_time" in str(caught.value)
    assert registry.get("current_time").source == "hermes.tools.builtin.current_time"  # not shadowed

    registry = ToolRegistry()
    register_tool_file(registry, path)
    with pytest.raises(ToolRegistrationError) as caught:
        register_builtins(registry)
    assert "'current_time' is already registered" in str(caught.value) and str(path) in str(caught.value)


# ---------------------------------------------------------------- end to end


async def test_a_session_calls_the_http_tool_and_its_secret_never_enters_workflow_history(
    endpoint, run_worker, session_id, temporal_client, tmp_path
):
    registry = register_builtins(ToolRegistry())
    register_tool_file(registry, EXAMPLE)
    register_tool_file(registry, write(tmp_path, {"tools": [{
        "name": "flaky_weather",
        "description": "Weather from a service that is down.",
        "http": {"url": "${WEATHER_API_URL}/status/503", "headers": {"Authorization": "Bearer ${WEATHER_API_TOKEN}"}},
    }]}))
    registry.check_references()
    script = {
        "turns": [
            {"match": "(?i)flaky", "steps": [
                {"tool_calls": [{"name": "flaky_weather", "arguments": {}}]},
                {"reply": "code {{ last_tool_result.code }}"},
            ]},
            {"match": "(?i)weather", "steps": [
                {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris", "units": "Metric"}}]},
                {"reply": "{{ last_tool_result.message }}, {{ last_tool_result.data.temperature }} degrees."},
            ]},
        ]
    }
    async with run_worker(script, registry=registry) as hermes:
        result = await hermes.send_message(session_id, "What's the weather in Paris?", user_id="alice")
        flaky = await hermes.send_message(session_id, "And from the flaky service?", user_id="alice")

    # A 503 is retried (the endpoint quotes the token back in every error body), then code 2.
    assert flaky.reply == "code 2" and flaky.tool_calls[0].result.code == ToolResultCode.DEPENDENCY_UNAVAILABLE
    assert len([r for r in endpoint.requests if r["path"] == "/status/503"]) >= 2
    assert "Bearer ***" in flaky.tool_calls[0].result.message

    assert result.reply == "Sunny in Paris, 21 degrees."
    [record] = result.tool_calls
    assert record.name == "get_weather" and record.result.code == ToolResultCode.OK
    assert record.result.data["seen_authorization"] == "Bearer ***"
    [request] = [r for r in endpoint.requests if r["path"].startswith("/v1/current/")]
    assert request["path"] == "/v1/current/Paris" and request["query"] == {"units": ["metric"]}  # enum case coerced
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"  # the endpoint did get it

    history = await temporal_client.get_workflow_handle(session_id).fetch_history()
    text = decoded_history(history.to_json())
    assert "Sunny in Paris" in text and "get_weather" in text  # the search sees payloads
    assert SECRET not in text


def test_a_yaml_file_with_exponentially_nested_aliases_is_refused_before_it_is_expanded(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 13):  # 9**12 strings if expanded
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    lines.append("tools: [{name: x, description: x, parameters: {type: object, examples: [*a12]}}]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_tool_file(bomb)
    assert str(bomb) in str(refused.value) and "aliases" in str(refused.value)


def test_a_tool_that_is_not_idempotent_cannot_name_a_fallback():
    registry = ToolRegistry()

    def pay(amount: int) -> str:
        """Pay.

        Args:
            amount: cents.
        """
        return "paid"

    def pay_other_way(amount: int) -> str:
        """Pay another way.

        Args:
            amount: cents.
        """
        return "paid"

    registry.register(pay, idempotency="none", fallback="pay_other_way")
    registry.register(pay_other_way)
    with pytest.raises(ToolRegistrationError) as refused:
        registry.check_references()
    assert "'pay'" in str(refused.value) and "not idempotent cannot have a fallback" in str(refused.value)
