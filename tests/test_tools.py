"""Unit tests of the tool registry, the built-in tools and the scripted model.

No server is needed: these exercise the pure parts that the activities are built on.
"""

from __future__ import annotations

import asyncio
import json
import typing
from pathlib import Path

import pytest
from pydantic import Field

from hermes.errors import ConfigError, ScriptExhaustedError, ToolArgumentsError, ToolRegistrationError
from hermes.models import CallModelInput, Message, ToolResult, ToolResultCode
from hermes.providers.scripted import ScriptedModel
from hermes.tools.builtin import calculate, current_time, register_builtins
from hermes.tools.registry import ToolContext, ToolRegistry


def _registry_with_book_flight() -> ToolRegistry:
    registry = ToolRegistry()

    def book_flight(
        origin: str,
        destination: str,
        context: ToolContext,
        passengers: int = 1,
        refundable: bool = False,
    ) -> dict:
        """Book a flight between two airports.

        Use it only after the user confirmed the dates.

        Args:
            origin: IATA code of the departure airport, e.g. "PEK".
            destination: IATA code of the arrival airport,
                e.g. "CDG"; never the same as origin.
            passengers: how many seats, 1 to 9.
            refundable: whether to buy a refundable fare.

        Returns:
            The booking reference.
        """
        return {"origin": origin, "destination": destination, "passengers": passengers, "refundable": refundable}

    registry.register(book_flight, tier="external", idempotent=False, permission="write")
    return registry


# ---------------------------------------------------------------- schema


def test_schema_comes_from_the_signature_and_the_google_docstring():
    tool = _registry_with_book_flight().get("book_flight")
    assert tool is not None
    schema = tool.parameters_schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert set(props) == {"origin", "destination", "passengers", "refundable"}
    assert schema["required"] == ["origin", "destination"]
    assert props["origin"] == {"type": "string", "description": 'IATA code of the departure airport, e.g. "PEK".'}
    # A continuation line belongs to the parameter it continues.
    assert props["destination"]["description"] == (
        'IATA code of the arrival airport, e.g. "CDG"; never the same as origin.'
    )
    assert props["passengers"] == {"type": "integer", "default": 1, "description": "how many seats, 1 to 9."}
    assert props["refundable"] == {"type": "boolean", "default": False, "description": "whether to buy a refundable fare."}
    # The summary is the description; Args/Returns sections are not.
    assert tool.description == "Book a flight between two airports.\n\nUse it only after the user confirmed the dates."
    assert "Returns" not in tool.description and "IATA" not in tool.description


def test_tool_context_parameter_is_excluded_from_the_schema_and_passed_at_call_time():
    registry = ToolRegistry()
    seen: list[ToolContext] = []

    async def whoami(ctx: ToolContext, shout: bool = False) -> str:
        """Say which user is asking.

        Args:
            shout: upper-case the answer.
        """
        seen.append(ctx)
        return ctx.user_id.upper() if shout else ctx.user_id

    tool = registry.register(whoami)
    assert set(tool.parameters_schema["properties"]) == {"shout"}
    assert "ctx" not in json.dumps(tool.parameters_schema)
    assert "required" not in tool.parameters_schema
    context = ToolContext(session_id="s-1", user_id="alice", tool_call_id="call_1", turn=3)
    assert asyncio.run(tool.invoke(tool.validate({"shout": "true"}), context)) == "ALICE"
    assert seen == [context]
    assert context.idempotency_key == "s-1:3:call_1"  # no chain id outside a session run
    with pytest.raises(ToolArgumentsError) as info:
        tool.validate({"ctx": "forged"})
    assert info.value.problems[0]["field"] == "ctx"


def test_spec_carries_tier_timeout_idempotency_and_permission():
    tool = _registry_with_book_flight().get("book_flight")
    assert tool is not None
    spec = tool.spec(tier_seconds={"query": 15.0, "external": 30.0, "batch": 60.0}.__getitem__, heartbeat_timeout_seconds=4.0)
    assert (spec.tier, spec.timeout_seconds, spec.heartbeat_timeout_seconds) == ("external", 30.0, 4.0)
    assert (spec.idempotent, spec.permission) == (False, "write")
    assert spec.to_openai()["function"]["parameters"] == tool.parameters_schema


# ----------------------------------------------------------- validation


def test_arguments_are_coerced_by_pydantic():
    tool = _registry_with_book_flight().get("book_flight")
    assert tool is not None
    args = tool.validate({"origin": "PEK", "destination": "CDG", "passengers": "5", "refundable": "true"})
    assert args.passengers == 5 and isinstance(args.passengers, int)
    assert args.refundable is True
    defaults = tool.validate({"origin": "PEK", "destination": "CDG"})
    assert (defaults.passengers, defaults.refundable) == (1, False)


def _plan_with_a_date(
    count: int, kind: typing.Literal["fast", "slow"], when: typing.Annotated[str, Field(json_schema_extra={"format": "date"})],
    ratio: float = 1.0, flag: bool = False, note: str | None = None, any: typing.Any = None,  # noqa: A002
) -> dict:
    """Plan something."""
    return {}


def _plan_with_a_text(
    count: int, kind: typing.Literal["fast", "slow"], when: str,
    ratio: float = 1.0, flag: bool = False, note: str | None = None, any: typing.Any = None,  # noqa: A002
) -> dict:
    """Plan something."""
    return {}


def _repaired_the_long_way(tool, arguments):
    """What ``tool.validate`` returned before its fast path: :func:`coerce`, then pydantic."""
    from pydantic import ValidationError

    from hermes.tools import arguments as args_layer

    try:
        coerced = args_layer.coerce(tool.parameters_schema, args_layer.normalize_arguments(tool.name, arguments))
        return _typed(tool.arguments_model.model_validate(coerced))
    except (ToolArgumentsError, ValidationError):
        return "refused"


def _typed(model) -> list:
    """A validated model's values with their types (``3.0 == 3``: a float is not an int)."""
    return [(name, type(value).__name__, value) for name, value in model.model_dump().items()]


def _amount(amount: int | float) -> dict:  # noqa: PYI041 - the union is the case
    """Pay."""
    return {}


def _colour(colour: typing.Annotated[str, Field(json_schema_extra={"enum": ["Red", "Blue"]})], count: int | None = None) -> dict:
    """Paint."""
    return {}


def _typed_by_extra(count: typing.Annotated[str, Field(json_schema_extra={"type": "integer"})]) -> dict:
    """Count."""
    return {}


@pytest.mark.parametrize(
    "fn, arguments",
    [
        (_amount, {"amount": 3.0}), (_amount, {"amount": 1e20}), (_amount, {"amount": 3}), (_amount, {"amount": -0.0}),
        (_colour, {"colour": "red"}), (_colour, {"colour": "Red", "count": 2}), (_colour, {"colour": "Blue", "count": 2.0}),
        (_typed_by_extra, {"count": "3"}), (_typed_by_extra, {"count": 3}),
    ],
)
def test_arguments_whose_schema_says_more_than_their_type_take_the_repair_walk(fn, arguments):
    # Found by a break-it review of the fast path: a union repaired to its integer branch,
    # an enum or a type that json_schema_extra put in the schema (pydantic never checks them).
    registry = ToolRegistry()
    registry.register(fn, name="t")
    tool = registry.get("t")
    assert tool is not None
    try:
        fast = _typed(tool.validate(arguments))
    except ToolArgumentsError:
        fast = "refused"
    assert fast == _repaired_the_long_way(tool, arguments)


@pytest.mark.parametrize(
    "arguments",
    [
        {"count": 3, "ratio": 0.5, "flag": True, "kind": "fast", "note": None, "when": "2024-03-05", "any": "x"},
        {"count": 3, "ratio": 2, "flag": False, "kind": "fast", "when": "5 March 2024"},
        {"count": "3", "ratio": "0.5", "flag": "yes", "kind": "FAST", "when": "2024/03/05"},
        {"count": 3.0, "ratio": True, "flag": 1, "kind": "fast", "when": "2024-03-05"},
        {"count": True, "kind": "fast", "when": "2024-03-05"},
        {"Count": 3, "kind": "fast", "when": "2024-03-05"},
        {"count": 3, "kind": "fast", "when": "2024-03-05", "note": "null"},
        {"count": 3, "kind": "slow", "when": "2024-03-05", "any": 7},
        {"count": None, "kind": "fast", "when": "2024-03-05"},
        {"count": 3, "kind": "fast", "when": "2024-03-05", "extra": 1},
        '{"count": 3, "kind": "fast", "when": "2024-03-05"}',
    ],
)
@pytest.mark.parametrize("with_format", [True, False])
def test_arguments_that_already_fit_skip_the_repair_walk_and_validate_to_the_same_values(arguments, with_format):
    # The fast path (strict validation of scalars, issue 31) must give what the repair
    # walk gives, and refuse what it refuses, for every kind of scalar a model sends.
    registry = ToolRegistry()
    plan = _plan_with_a_date if with_format else _plan_with_a_text
    registry.register(plan, name="plan")
    tool = registry.get("plan")
    assert tool is not None and ("when" in tool._plain_fields) is not with_format  # a format: the walk rewrites dates
    try:
        fast = _typed(tool.validate(arguments))
    except ToolArgumentsError:
        fast = "refused"
    assert fast == _repaired_the_long_way(tool, arguments)


def test_invalid_arguments_name_each_field_what_was_expected_and_what_was_received():
    tool = _registry_with_book_flight().get("book_flight")
    assert tool is not None
    with pytest.raises(ToolArgumentsError) as info:
        tool.validate({"origin": "PEK", "passengers": "many", "seats": 2})
    err = info.value
    assert err.tool_name == "book_flight"
    by_field = {p["field"]: p for p in err.problems}
    assert set(by_field) == {"destination", "passengers", "seats"}
    assert by_field["destination"]["received"] == "nothing (missing)"
    assert "required" in by_field["destination"]["expected"].lower()
    assert by_field["passengers"]["received"] == "'many'"
    assert "integer" in by_field["passengers"]["expected"]
    assert by_field["seats"]["received"] == "2"
    assert "no such argument" in by_field["seats"]["expected"]
    text = str(err)
    assert "book_flight" in text and "passengers: expected" in text and "received 'many'" in text


def test_a_duplicate_tool_name_is_refused():
    registry = register_builtins(ToolRegistry())

    def calculate(expression: str) -> int:
        """Another calculator."""
        return 0

    with pytest.raises(ToolRegistrationError, match="already registered"):
        registry.register(calculate)
    with pytest.raises(ToolRegistrationError, match="already registered"):
        registry.register(current_time, name="current_time")
    assert registry.get("calculate").fn is not calculate  # the first one stays


@pytest.mark.parametrize("bad_name", ["", "has space", "dots.not.allowed", "x" * 65, "emoji_🙂"])
def test_an_invalid_tool_name_is_refused(bad_name):
    def fn() -> None:
        """Does nothing."""

    registry = ToolRegistry()
    with pytest.raises(ToolRegistrationError, match="must be 1-64 characters"):
        registry.register(fn, name=bad_name)
    assert len(registry) == 0


def test_unusable_definitions_are_refused():
    registry = ToolRegistry()

    def undocumented(x: int) -> int:
        return x

    def variadic(*values: int) -> int:
        """Sum of values."""
        return sum(values)

    with pytest.raises(ToolRegistrationError, match="needs a description"):
        registry.register(undocumented)
    with pytest.raises(ToolRegistrationError, match=r"\*args"):
        registry.register(variadic)
    with pytest.raises(ToolRegistrationError, match="permission"):
        registry.register(undocumented, description="x", permission="root")  # type: ignore[arg-type]
    with pytest.raises(ToolRegistrationError, match="tier"):
        registry.register(undocumented, description="x", tier="slow")  # type: ignore[arg-type]


def test_the_decorator_registers_bare_or_with_options():
    registry = ToolRegistry()

    @registry.tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    @registry.tool(name="wipe", permission="admin", idempotent=False)
    def wipe_everything() -> None:
        """Delete everything."""

    assert registry.names() == ["ping", "wipe"]
    assert ping() == "pong"  # the function itself is returned unchanged
    wipe = registry.get("wipe")
    assert wipe is not None and (wipe.permission, wipe.idempotent) == ("admin", False)


# ------------------------------------------------------------ built-ins


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(17 + 25) * 3", 126),
        ("2 ** 10", 1024),
        ("7 / 2", 3.5),
        ("6 / 3", 2),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("0.1 + 0.2", 0.1 + 0.2),
        ("3 × 4 ÷ 2", 6),
    ],
)
def test_calculate_evaluates_arithmetic(expression, value):
    result = calculate(expression)
    assert result.code == ToolResultCode.OK
    assert result.data == {"expression": expression, "value": value}
    assert type(result.data["value"]) is type(value)


@pytest.mark.parametrize(
    "expression",
    ["__import__('os')", "().__class__", "open('/etc/passwd')", "x + 1", "[1, 2]", "'a' * 3", "True + 1", "1 +", "9 ** 9 ** 9", "1 / 0"],
)
def test_calculate_rejects_anything_but_arithmetic_with_code_1(expression):
    result = calculate(expression)
    assert result.code == ToolResultCode.BAD_ARGUMENTS
    assert result.data is None
    assert result.message.startswith("expression:")


def test_current_time_answers_for_a_valid_zone_and_rejects_a_bad_one_with_code_1():
    ok = current_time("Asia/Shanghai")
    assert ok.code == ToolResultCode.OK
    assert ok.data["iso"].endswith("+08:00")
    assert ok.data["timezone"] == "Asia/Shanghai"
    for bad in ("Mars/Olympus_Mons", "../../etc/passwd", ""):
        result = current_time(bad)
        assert result.code == ToolResultCode.BAD_ARGUMENTS, bad
        assert "IANA time zone" in result.message and repr(bad) in result.message


# -------------------------------------------------------- scripted model


def _request(*messages: Message, turn: int = 1) -> CallModelInput:
    return CallModelInput(session_id="s", turn=turn, messages=list(messages))


def user(text: str) -> Message:
    return Message(role="user", content=text)


def assistant(text: str) -> Message:
    return Message(role="assistant", content=text)


MATCH_AND_ORDER = {
    "turns": [
        {"steps": [{"reply": "first in order"}]},
        {"match": "(?i)weather|天气", "steps": [{"reply": "sunny"}]},
        {"steps": [{"reply": "second in order"}]},
    ]
}


def test_scripted_turns_are_chosen_by_match_first_then_in_order():
    model = ScriptedModel.from_dict(MATCH_AND_ORDER)
    # A matching message takes the matched turn wherever it is in the script...
    assert model.next_message(_request(user("What's the WEATHER like?"))).content == "sunny"
    # ...and does not use up an ordered turn.
    convo = [user("hello"), assistant("first in order"), user("今天天气怎么样"), assistant("sunny")]
    assert model.next_message(_request(*convo, user("and then?"))).content == "second in order"
    assert model.next_message(_request(user("hello"))).content == "first in order"


def test_the_step_is_the_number_of_assistant_messages_since_the_user_message():
    model = ScriptedModel.from_dict(
        {
            "turns": [
                {
                    "steps": [
                        {"tool_calls": [{"name": "calculate", "arguments": {"expression": "1+1"}}]},
                        {"tool_calls": [{"name": "calculate", "arguments": "{not json"}]},
                        {"reply": "done"},
                    ]
                }
            ]
        }
    )
    first = model.next_message(_request(user("go"), turn=1))
    assert [c.tool_call_id for c in first.tool_calls] == ["call_1_0_0"]
    assert first.tool_calls[0].arguments == {"expression": "1+1"}
    tool_msg = Message(role="tool", content=ToolResult(data={"value": 2}).model_dump_json(), tool_call_id="call_1_0_0")
    second = model.next_message(_request(user("go"), first, tool_msg, turn=1))
    assert second.tool_calls[0].tool_call_id == "call_1_1_0"
    assert second.tool_calls[0].arguments_error is not None and "JSON object" in second.tool_calls[0].arguments_error
    third = model.next_message(_request(user("go"), first, tool_msg, second, tool_msg, turn=1))
    assert third.content == "done" and third.tool_calls == []


def test_ordered_turns_count_user_messages_older_than_the_context_window():
    model = ScriptedModel.from_dict({"turns": [{"steps": [{"reply": f"turn {i}"}]} for i in range(1, 31)]})
    # Turn 25 of a session whose model is sent only the last 20 turns: 24 earlier user
    # messages, of which 19 are visible.
    earlier = [user(f"m{i}") for i in range(6, 25)]
    reply = model.next_message(_request(*earlier, user("m25"), turn=25))
    assert reply.content == "turn 25"


def test_templates_render_tool_results_and_the_user_text_with_cjk_and_emoji_intact():
    model = ScriptedModel.from_dict(
        {
            "turns": [
                {
                    "steps": [
                        {"tool_calls": [{"name": "lookup", "arguments": {}}]},
                        {
                            "reply": "你说「{{ user }}」🎉 城市：{{ last_tool_result.data.city }}；"
                            "全部：{{ tool_results[-1].data }}；{{ last_tool_result.data.nope }}"
                        },
                    ]
                }
            ]
        }
    )
    result = ToolResult(data={"city": "上海 🌆", "temp": 21})
    messages = [
        user("天气如何？☔"),
        Message(role="assistant", tool_calls=[{"tool_call_id": "c1", "name": "lookup"}]),
        Message(role="tool", content=result.model_dump_json(), tool_call_id="c1"),
    ]
    reply = model.next_message(_request(*messages)).content
    assert reply == (
        '你说「天气如何？☔」🎉 城市：上海 🌆；全部：{"city": "上海 🌆", "temp": 21}；'
        "<last_tool_result.data.nope: not available>"
    )


def test_an_unscripted_point_raises_script_exhausted_unless_there_is_a_fallback():
    script = {"turns": [{"match": "hi", "steps": [{"reply": "hello"}]}]}
    strict = ScriptedModel.from_dict(script, source="strict.yaml")
    with pytest.raises(ScriptExhaustedError, match="strict.yaml: no scripted turn"):
        strict.next_message(_request(user("what now?")))
    with pytest.raises(ScriptExhaustedError, match="no step 2"):
        strict.next_message(_request(user("hi"), assistant("hello")))
    lenient = ScriptedModel.from_dict({**script, "fallback": "I have no line for that."})
    assert lenient.next_message(_request(user("what now?"))).content == "I have no line for that."


def test_scripted_complete_reports_usage_and_provider():
    model = ScriptedModel.from_dict({"turns": [{"steps": [{"reply": "hello there"}]}]})
    result = asyncio.run(model.complete(_request(user("hi"))))
    assert result.provider == "scripted"
    assert result.message.content == "hello there"
    assert result.usage.prompt_tokens > 0 and result.usage.completion_tokens == 2


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("turns:\n  - steps:\n      - {}\n", "turns.0.steps.0", "reply"),
        ("turns:\n  - match: '(unclosed'\n    steps: [{reply: x}]\n", "turns.0.match", "regular expression"),
        ("fallback: x\n", "turns", "required"),
    ],
)
def test_an_invalid_script_file_is_a_config_error_naming_the_file_and_key(tmp_path: Path, text, key, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        ScriptedModel.from_file(path)
    assert info.value.source == str(path)
    assert info.value.key == key
    assert expected in str(info.value) and str(path) in str(info.value)


def test_a_missing_or_malformed_script_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found") as missing:
        ScriptedModel.from_file(tmp_path / "absent.yaml")
    assert missing.value.source == str(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("turns: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        ScriptedModel.from_file(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- reply: hi\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="mapping"):
        ScriptedModel.from_file(listing)


async def test_a_tool_listing_reuses_each_unchanged_tools_spec_and_sees_a_changed_one():
    from activities.tools import ToolActivities
    from hermes.models import ListToolsInput

    registry = register_builtins(ToolRegistry())
    activities = ToolActivities(registry, None, tier_seconds=lambda tier: 60.0)
    first = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
    second = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
    assert second == first and second.ref == first.ref
    assert all(a is b for a, b in zip(first.tools, second.tools)), "an unchanged tool's spec was built again"
    assert all(s.tokens for s in first.tools)

    registry.get("calculate").description = "Evaluates arithmetic, exactly."  # a field set anew
    changed = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
    spec = next(s for s in changed.tools if s.name == "calculate")
    assert spec.description.startswith("Evaluates arithmetic, exactly.") and changed.ref != first.ref
    others = [s for s in changed.tools if s.name != "calculate"]
    assert all(any(s is t for t in first.tools) for s in others)

    uncounted = await activities.list_tools(ListToolsInput())
    assert all(s.tokens is None for s in uncounted.tools) and uncounted.ref != changed.ref

    recounted = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
    assert all(a is b for a, b in zip(recounted.tools, changed.tools)), "each encoding's specs are kept apart"


async def test_a_listings_reference_is_kept_only_while_its_specs_and_groups_are_the_same(monkeypatch: pytest.MonkeyPatch):
    from activities import tools as tools_module
    from activities.tools import ToolActivities
    from hermes.content.blobs import value_ref
    from hermes.models import ListToolsInput

    def made_again(activities: ToolActivities, encoding: str) -> str:
        """The reference hashed from scratch (what the kept one must equal)."""
        held = [activities._spec_of(t, encoding) for t in activities.registry]
        return value_ref([[j for _, j in held], [g.model_dump(mode="json") for g in activities.registry.groups]])

    registry = register_builtins(ToolRegistry())
    activities = ToolActivities(registry, None, tier_seconds=lambda tier: 60.0)
    first = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
    again = await activities.list_tools(ListToolsInput(encoding="cl100k_base", known_ref=first.ref))
    assert first.ref == again.ref == made_again(activities, "cl100k_base") and again.unchanged

    registry.add_group("files", description="Reads and writes files")  # same specs, a new group
    grouped = await activities.list_tools(ListToolsInput(encoding="cl100k_base", known_ref=first.ref))
    assert not grouped.unchanged and grouped.ref != first.ref and grouped.ref == made_again(activities, "cl100k_base")

    registry.get("calculate").description = "Evaluates arithmetic."  # a spec made anew
    changed = await activities.list_tools(ListToolsInput(encoding="cl100k_base", known_ref=grouped.ref))
    assert not changed.unchanged and changed.ref == made_again(activities, "cl100k_base")

    @registry.tool
    def shout(text: str) -> dict:
        """Says it louder."""
        return {"text": text.upper()}

    added = await activities.list_tools(ListToolsInput(encoding="cl100k_base", known_ref=changed.ref))
    assert not added.unchanged and added.ref == made_again(activities, "cl100k_base"), "a tool added keeps no old reference"
    hashed: list[object] = []
    real = tools_module.value_ref
    monkeypatch.setattr(tools_module, "value_ref", lambda value: hashed.append(value) or real(value))
    same = await activities.list_tools(ListToolsInput(encoding="cl100k_base", known_ref=added.ref))
    assert same.unchanged and not hashed, "an unchanged listing was hashed again"
    monkeypatch.undo()

    # Another worker (its own specs, equal to these) lists the same reference.
    tools_module._LISTING_REFS._known.clear()
    other = register_builtins(ToolRegistry())
    other.add_group("files", description="Reads and writes files")
    other.get("calculate").description = "Evaluates arithmetic."
    elsewhere = await ToolActivities(other, None, tier_seconds=lambda tier: 60.0).list_tools(ListToolsInput(encoding="cl100k_base"))
    assert elsewhere.ref == changed.ref


async def test_a_listing_holds_no_spec_of_an_mcp_tool_listed_anew_each_time():
    from activities.tools import ToolActivities
    from hermes.models import ListToolsInput

    class Listed:
        groups: list = []
        unavailable: dict = {}

        async def discover(self) -> list:
            return [t for t in register_builtins(ToolRegistry()) if t.name == "calculate"]  # new objects each time

    activities = ToolActivities(register_builtins(ToolRegistry()), None, tier_seconds=lambda tier: 60.0, mcp=Listed())
    first = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
    held = len(activities._specs)
    for _ in range(5):
        again = await activities.list_tools(ListToolsInput(encoding="cl100k_base"))
        assert again.ref == first.ref
    assert len(activities._specs) == held == len(list(activities.registry))
