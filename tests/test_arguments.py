"""Tool-call arguments: loose model output coerced, checked, and reported precisely.

Pure unit tests (no servers). The property tests run arbitrary JSON through the pipeline for
two realistic schemas: one from a decorated Python tool (pydantic), one hand-written for an
HTTP tool (draft 2020-12 with ``oneOf``, ``const``, ``format``, ``type`` lists, defaults).
"""

from __future__ import annotations

import copy
import enum
import json
from datetime import date, datetime
from typing import Annotated, Any, Literal, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hermes.errors import ToolArgumentsError, ToolRegistrationError
from hermes.tools.arguments import (
    ARGUMENTS_FIELD,
    RECEIVED_MAX_CHARS,
    check,
    check_schema,
    coerce,
    missing_fields,
    problems_from_pydantic,
    validate_arguments,
)
from hermes.tools.registry import ToolRegistry

# --------------------------------------------------------------------------- schemas


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")

    street: str
    city: str
    zip_code: Optional[str] = None


def book_visit(
    count: Annotated[int, Field(ge=1, le=10)],
    color: Color,
    day: date,
    address: Address,
    order: Literal["asc", "desc"] = "asc",
    tags: list[int] = [],  # noqa: B006 - pydantic copies defaults
    note: Optional[str] = None,
    at: Optional[datetime] = None,
    urgent: bool = False,
) -> dict:
    """Book a visit.

    Args:
        count: how many people, 1 to 10.
        color: badge colour.
        day: the day of the visit.
        address: where.
        order: sort order of the confirmation list.
        tags: numeric labels.
        note: free text for the host.
        at: exact start, if known.
        urgent: whether to page the host.
    """
    return {}


_registry = ToolRegistry()
BOOK = _registry.register(book_visit)
PY_SCHEMA: dict[str, Any] = BOOK.parameters_schema
PY_MODEL = BOOK.arguments_model

FILE_SCHEMA: dict[str, Any] = json.loads(
    """
{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "properties": {
    "amount": {"type": "number", "exclusiveMinimum": 0, "description": "amount to pay"},
    "currency": {"type": "string", "enum": ["CNY", "USD", "EUR"], "default": "CNY"},
    "method": {
      "oneOf": [
        {"type": "object",
         "properties": {"kind": {"const": "card"}, "number": {"type": "string", "pattern": "^[0-9]{12,19}$"}},
         "required": ["kind", "number"], "additionalProperties": false},
        {"type": "object",
         "properties": {"kind": {"const": "bank"}, "iban": {"type": "string", "minLength": 15, "maxLength": 34}},
         "required": ["kind", "iban"], "additionalProperties": false}
      ]
    },
    "due": {"type": ["string", "null"], "format": "date"},
    "notify": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 5, "uniqueItems": true},
    "reference": {"type": "string", "format": "uuid"},
    "callback": {"type": "string", "format": "uri"},
    "at": {"type": "string", "format": "date-time"},
    "priority": {"type": "integer", "minimum": 1, "maximum": 5, "default": 3},
    "urgent": {"type": "boolean", "default": false},
    "meta": {"$ref": "#/definitions/meta"}
  },
  "required": ["amount", "method"],
  "additionalProperties": false,
  "definitions": {"meta": {"type": "object", "additionalProperties": {"type": "string"}}}
}
"""
)

VALID_BOOKING = {
    "count": 3,
    "color": "red",
    "day": "2024-03-05",
    "address": {"street": "1 Main St", "city": "Springfield"},
}
VALID_PAYMENT = {"amount": 12.5, "method": {"kind": "card", "number": "4111111111111111"}}


def only(schema_type: str, **extra: Any) -> dict[str, Any]:
    return {"type": schema_type, **extra}


def wrap(prop: dict[str, Any], *, required: bool = True, **root_extra: Any) -> dict[str, Any]:
    """A one-argument tool schema around ``prop``."""
    return {
        "type": "object",
        "properties": {"x": prop},
        **({"required": ["x"]} if required else {}),
        "additionalProperties": False,
        **root_extra,
    }


def problem_for(problems: list[dict], field: str) -> dict:
    found = [p for p in problems if p["field"] == field]
    assert len(found) == 1, problems
    return found[0]


# --------------------------------------------------------------------------- coerce: scalars


@pytest.mark.parametrize(
    ("sent", "expected"),
    [("42", 42), (" 42 ", 42), ("42.0", 42), (42.0, 42), ("1e3", 1000), ("+7", 7), ("-3", -3), ("４２", 42), (5, 5)],
)
def test_integer_arguments_are_read_from_text_and_integral_floats(sent, expected):
    result = coerce(only("integer"), sent)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize("sent", ["42.5", 42.5, True, "abc", "", "1,234", "NaN", "inf", "0x10", None, [1], {"a": 1}])
def test_integer_coercion_leaves_fractions_booleans_and_words_alone(sent):
    assert coerce(only("integer"), sent) == sent
    assert check(only("integer"), coerce(only("integer"), sent))


@pytest.mark.parametrize(("sent", "expected"), [("3.5", 3.5), ("1e3", 1000.0), ("-0.25", -0.25), (".5", 0.5), ("7", 7), (2, 2)])
def test_number_arguments_are_read_from_plain_decimal_and_scientific_text(sent, expected):
    assert coerce(only("number"), sent) == expected


@pytest.mark.parametrize("sent", ["NaN", "nan", "inf", "-Infinity", "1,234.5", "1e999", "3.5 kg", True, "0x1p3"])
def test_number_coercion_refuses_nan_infinity_units_and_thousands_separators(sent):
    assert coerce(only("number"), sent) == sent


@pytest.mark.parametrize(
    ("sent", "expected"),
    [("true", True), ("False", False), ("YES", True), ("no", False), ("1", True), ("0", False),
     (" On ", True), ("OFF", False), (1, True), (0, False), (True, True)],
)  # fmt: skip
def test_boolean_arguments_are_read_from_words_and_one_or_zero(sent, expected):
    assert coerce(only("boolean"), sent) is expected


@pytest.mark.parametrize("sent", ["maybe", 2, "2", None, "", "t"])
def test_boolean_coercion_leaves_other_values_alone(sent):
    assert coerce(only("boolean"), sent) == sent


@pytest.mark.parametrize(
    ("sent", "expected"), [(42, "42"), (True, "true"), (False, "false"), (3.5, "3.5"), (42.0, "42"), (-7, "-7")]
)
def test_string_arguments_are_made_from_numbers_and_booleans(sent, expected):
    assert coerce(only("string"), sent) == expected


@pytest.mark.parametrize("sent", [None, [1], {"a": 1}])
def test_string_coercion_does_not_stringify_null_lists_or_objects(sent):
    assert coerce(only("string"), sent) == sent


@pytest.mark.parametrize("sent", ["北京市朝阳区", "東京都 渋谷区", "🙂 party 🎉", "  padded  ", "42", "true", "", "a\nb"])
def test_text_for_a_plain_string_is_untouched(sent):
    assert coerce(only("string"), sent) == sent
    assert coerce(PY_SCHEMA, {**VALID_BOOKING, "note": sent})["note"] == sent


def test_numbers_and_booleans_are_not_made_into_strings_unless_the_schema_wants_one():
    assert coerce(only("integer"), True) is True
    assert coerce({"type": ["integer", "string"]}, 5) == 5
    assert coerce({"type": ["integer", "string"]}, "5") == "5"


# --------------------------------------------------------------------------- coerce: enum, const


def test_enum_values_match_case_insensitively_and_trimmed():
    schema = {"type": "string", "enum": ["red", "green", "in_progress"]}
    assert coerce(schema, "RED") == "red"
    assert coerce(schema, "  Green ") == "green"
    assert coerce(schema, "In Progress") == "in_progress"
    assert coerce(schema, "purple") == "purple"


def test_enum_numbers_sent_as_text_match_numeric_members():
    assert coerce({"enum": [1, 2, 3]}, "2") == 2
    assert coerce({"enum": [1, 2, 3]}, " 3.0 ") == 3
    assert coerce({"enum": [0.5, 1.5]}, "1.5") == 1.5
    assert coerce({"enum": ["1", "2"]}, 2) == "2"
    assert coerce({"enum": [True, None]}, "yes") is True
    assert coerce({"enum": [True, None]}, "null") is None


def test_enum_text_that_fits_several_members_is_left_alone():
    assert coerce({"enum": ["Red", "red"]}, "RED") == "RED"
    assert coerce({"enum": ["Red", "red"]}, "red") == "red"


def test_enum_members_reached_through_a_ref_match_loosely():
    assert coerce(PY_SCHEMA, {**VALID_BOOKING, "color": " Blue"})["color"] == "blue"


def test_const_values_match_loosely():
    assert coerce({"const": "card"}, "CARD ") == "card"
    assert coerce({"const": 7}, "7") == 7
    assert coerce({"const": "card"}, "bank") == "bank"
    [problem] = check({"enum": ["only"]}, "other")
    assert problem["expected"] == "exactly 'only'"


# --------------------------------------------------------------------------- coerce: dates and times

DATE = {"type": "string", "format": "date"}
DATE_TIME = {"type": "string", "format": "date-time"}
TIME = {"type": "string", "format": "time"}


@pytest.mark.parametrize(
    "sent",
    [
        "2024-03-05", "2024-3-5", "2024/03/05", "2024.03.05", "20240305", "5 March 2024", "5th March 2024",
        "5 Mar 2024", "March 5, 2024", "Mar. 5 2024", "Tuesday, March 5, 2024", "2024年3月5日", "2024年03月05日",
        "２０２４年３月５日", "2024년 3월 5일", "05.03.2024", "5.3.2024", "05-03-2024", "03/05/2024", "2024 Mar 5",
        "2024-03-05T00:00:00", "2024-03-05T00:00:00Z", " 2024-03-05 ",
    ],
)  # fmt: skip
def test_dates_in_common_formats_become_iso(sent):
    assert coerce(DATE, sent) == "2024-03-05"


def test_slashed_dates_are_month_first_and_dotted_ones_day_first_unless_that_is_impossible():
    assert coerce(DATE, "03/05/2024") == "2024-03-05"  # US: March 5
    assert coerce(DATE, "03.05.2024") == "2024-05-03"  # Europe: 3 May
    assert coerce(DATE, "25/03/2024") == "2024-03-25"  # no month 25: day first
    assert coerce(DATE, "03.25.2024") == "2024-03-25"  # no month 25: month first


@pytest.mark.parametrize(
    "sent", ["tomorrow", "24/3/5", "05/03/24", "2024-02-30", "13/13/2024", "March 2024", "1709596800", "2024-03-05T10:00:00"]
)
def test_ambiguous_relative_or_impossible_dates_are_left_for_the_check(sent):
    assert coerce(DATE, sent) == sent
    assert check(DATE, sent)[0]["expected"] == "a date YYYY-MM-DD"


def test_a_unix_timestamp_is_not_taken_for_a_date():
    assert coerce(DATE, 1709596800) == "1709596800"
    assert check(DATE, "1709596800")


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ("2024-03-05 10:00", "2024-03-05T10:00:00"),
        ("2024-03-05T10:00", "2024-03-05T10:00:00"),
        ("2024/03/05 10:00:00+0800", "2024-03-05T10:00:00+08:00"),
        ("2024-03-05T10:00:00+08", "2024-03-05T10:00:00+08:00"),
        ("2024-03-05 10:00:00.250-05:30", "2024-03-05T10:00:00.250-05:30"),
        ("2024年3月5日 10:00", "2024-03-05T10:00:00"),
        ("2024年3月5日10:00", "2024-03-05T10:00:00"),
        ("05.03.2024 22:15 UTC", "2024-03-05T22:15:00Z"),
        ("March 5, 2024 10:30 PM", "2024-03-05T22:30:00"),
        ("March 5, 2024 at 9am", "2024-03-05T09:00:00"),
        ("5 March 2024, 12:05 a.m.", "2024-03-05T00:05:00"),
        ("2024-03-05T10:00:00Z", "2024-03-05T10:00:00Z"),
        ("2024-03-05T10:00:00", "2024-03-05T10:00:00"),
    ],
)
def test_date_times_become_iso_keeping_a_given_offset_and_leaving_naive_ones_naive(sent, expected):
    assert coerce(DATE_TIME, sent) == expected
    assert check(DATE_TIME, expected) == []


@pytest.mark.parametrize("sent", ["2024-03-05", "next Monday 10am", "2024-03-05 25:00", "2024-03-05T10:00:00+24:00"])
def test_a_date_alone_or_an_impossible_time_is_not_made_into_a_date_time(sent):
    assert coerce(DATE_TIME, sent) == sent
    assert check(DATE_TIME, sent)[0]["expected"].startswith("a date-time YYYY-MM-DDTHH:MM:SS")


@pytest.mark.parametrize(
    ("sent", "expected"),
    [("9:30", "09:30:00"), ("09:30:15", "09:30:15"), ("9:30 pm", "21:30:00"), ("12 AM", "00:00:00"),
     ("10:00+08:00", "10:00:00+08:00"), ("10:00:00.5Z", "10:00:00.5Z")],
)  # fmt: skip
def test_times_become_hh_mm_ss(sent, expected):
    assert coerce(TIME, sent) == expected
    assert check(TIME, expected) == []


@pytest.mark.parametrize("sent", ["25:00", "9", "13 pm", "noon"])
def test_impossible_or_vague_times_are_left_alone(sent):
    assert coerce(TIME, sent) == sent


def test_uuids_are_normalised_to_the_canonical_form():
    schema = {"type": "string", "format": "uuid"}
    canonical = "123e4567-e89b-12d3-a456-426614174000"
    assert coerce(schema, "123E4567E89B12D3A456426614174000") == canonical
    assert coerce(schema, "{123e4567-e89b-12d3-a456-426614174000}") == canonical
    assert coerce(schema, "urn:uuid:123e4567-e89b-12d3-a456-426614174000") == canonical
    assert coerce(schema, "123E4567-E89B-12D3-A456-426614174000") == "123E4567-E89B-12D3-A456-426614174000"
    assert coerce(schema, "not-a-uuid") == "not-a-uuid"


def test_emails_lose_surrounding_space_and_a_mailto_prefix():
    schema = {"type": "string", "format": "email"}
    assert coerce(schema, " mailto:li@example.com ") == "li@example.com"


# --------------------------------------------------------------------------- coerce: arrays, objects


def test_arrays_are_read_from_json_text_and_single_values_are_wrapped():
    schema = {"type": "array", "items": {"type": "integer"}}
    assert coerce(schema, "[1, 2]") == [1, 2]
    assert coerce(schema, '["1", "2"]') == [1, 2]
    assert coerce(schema, 5) == [5]
    assert coerce(schema, "5") == [5]
    assert coerce({"type": "array", "items": {"type": "string"}}, "北京") == ["北京"]


def test_a_single_value_that_does_not_fit_the_items_is_not_wrapped():
    schema = {"type": "array", "items": {"type": "integer"}}
    assert coerce(schema, "five") == "five"
    assert coerce(schema, None) is None
    assert coerce({"type": "array"}, 5) == 5  # no items schema: nothing to say what fits


def test_objects_are_read_from_json_text():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert coerce(schema, '{"a": "1"}') == {"a": 1}
    assert coerce(schema, " {} ") == {}
    assert coerce(schema, '{"a": NaN}') == '{"a": NaN}'
    assert coerce(schema, "{broken") == "{broken"


def test_nested_objects_and_arrays_are_coerced_recursively():
    sent = {
        "count": "4",
        "color": "GREEN",
        "day": "March 5, 2024",
        "address": '{"street": "1 Main St", "city": "Springfield", "zip_code": 12345}',
        "tags": '["1", 2, "3.0"]',
        "urgent": "yes",
        "at": "2024-03-05 09:00",
    }
    result = coerce(PY_SCHEMA, sent)
    assert result == {
        "count": 4,
        "color": "green",
        "day": "2024-03-05",
        "address": {"street": "1 Main St", "city": "Springfield", "zip_code": "12345"},
        "tags": [1, 2, 3],
        "urgent": True,
        "at": "2024-03-05T09:00:00",
    }
    assert PY_MODEL.model_validate(result).address.zip_code == "12345"


def test_refs_into_defs_and_definitions_are_followed():
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/definitions/B"}},
        "$defs": {"A": {"type": "integer"}},
        "definitions": {"B": {"$ref": "#/$defs/A"}},
    }
    assert coerce(schema, {"a": "1", "b": "2"}) == {"a": 1, "b": 2}
    sub = schema["properties"]["b"]
    assert coerce(sub, "3", root=schema) == 3


def test_recursive_refs_are_followed_as_deep_as_the_value_and_ref_cycles_terminate():
    tree = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            }
        },
    }
    sent = {"node": {"value": "1", "children": [{"value": "2", "children": [{"value": "3"}]}]}}
    assert coerce(tree, sent) == {"node": {"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}]}}
    cycle = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}},
    }
    assert coerce(cycle, {"x": "1"}) == {"x": "1"}
    assert coerce({"$ref": "#"}, "1") == "1"


def test_anyof_keeps_the_first_non_null_branch_whose_coerced_value_fits():
    schema = {"anyOf": [{"type": "integer"}, {"type": "boolean"}, {"type": "null"}]}
    assert coerce(schema, "7") == 7
    assert coerce(schema, "yes") is True
    assert coerce(schema, "null") is None
    assert coerce(schema, "purple") == "purple"


def test_a_value_already_valid_for_a_branch_is_kept_as_it_is():
    assert coerce({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "42") == "42"
    assert coerce({"anyOf": [{"type": "integer"}, {"type": "null"}]}, None) is None


def test_oneof_prefers_a_coerced_value_that_fits_exactly_one_branch():
    schema = {"oneOf": [{"type": "integer", "maximum": 5}, {"type": "number", "minimum": 3}]}
    # "4" as 4 fits both branches (invalid for oneOf); no candidate fits exactly one, so the
    # first that fits its branch is kept and the check reports the ambiguity.
    assert coerce(schema, "4") == 4
    assert coerce(schema, "10") == 10
    assert check(schema, 10) == []
    discriminated = FILE_SCHEMA["properties"]["method"]
    assert coerce(discriminated, '{"kind": "BANK", "iban": "DE89370400440532013000"}', root=FILE_SCHEMA) == {
        "kind": "bank",
        "iban": "DE89370400440532013000",
    }


def test_type_lists_are_tried_in_order():
    assert coerce({"type": ["integer", "boolean"]}, "1") == 1
    assert coerce({"type": ["boolean", "integer"]}, "1") is True
    assert coerce({"type": ["string", "null"], "format": "date"}, "5 March 2024") == "2024-03-05"
    assert coerce({"type": ["string", "null"], "format": "date"}, None) is None


def test_null_stays_null_where_the_schema_allows_it():
    assert coerce(PY_SCHEMA, {**VALID_BOOKING, "note": None})["note"] is None
    assert coerce(FILE_SCHEMA, {**VALID_PAYMENT, "due": None})["due"] is None


def test_an_optional_argument_sent_as_null_where_null_is_not_allowed_is_dropped():
    result = coerce(PY_SCHEMA, {**VALID_BOOKING, "order": None, "tags": None, "urgent": None})
    assert result == VALID_BOOKING
    assert validate_arguments("book", PY_SCHEMA, {**VALID_BOOKING, "urgent": None})["urgent"] is False


def test_a_required_argument_sent_as_null_is_kept_for_the_check():
    assert coerce(PY_SCHEMA, {**VALID_BOOKING, "count": None})["count"] is None


def test_keys_in_another_case_or_style_are_renamed_to_the_declared_argument():
    result = coerce(PY_SCHEMA, {**VALID_BOOKING, "Urgent": "yes", "address": {"Street": "1 Main", "city": "X", "zipCode": "1"}})
    assert result["urgent"] is True
    assert result["address"] == {"street": "1 Main", "city": "X", "zip_code": "1"}


def test_keys_are_not_renamed_when_ambiguous_or_when_other_keys_are_allowed():
    both = coerce(PY_SCHEMA, {**VALID_BOOKING, "Note": "a", "NOTE": "b"})
    assert "note" not in both and both["Note"] == "a"
    taken = coerce(PY_SCHEMA, {**VALID_BOOKING, "note": "a", "Note": "b"})
    assert taken["note"] == "a" and taken["Note"] == "b"
    open_schema = {"type": "object", "properties": {"start_date": {"type": "string"}}}
    assert coerce(open_schema, {"startDate": "x"}) == {"startDate": "x"}


def test_coerce_does_not_fill_defaults():
    assert coerce(FILE_SCHEMA, VALID_PAYMENT) == VALID_PAYMENT


def test_coerce_returns_a_copy_and_never_mutates_its_input():
    sent = {"count": "3", "color": "RED", "day": "2024/03/05", "address": {"street": "a", "city": "b"}, "tags": ["1"]}
    before = copy.deepcopy(sent)
    result = coerce(PY_SCHEMA, sent)
    assert sent == before
    result["address"]["street"] = "changed"
    result["tags"].append(9)
    assert sent == before
    valid = copy.deepcopy(VALID_BOOKING)
    same = coerce(PY_SCHEMA, valid)
    assert same == valid and same is not valid and same["address"] is not valid["address"]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "pattern": "("},
        {"type": "object", "patternProperties": {"(": {"type": "integer"}}},
        {"type": "array", "items": [1, 2]},
        {"type": 5},
        {"enum": "not a list"},
        {"$ref": "https://example.com/remote.json"},
        {"$ref": "#/$defs/missing"},
        {"anyOf": "nope"},
        {"type": "string", "format": "date", "enum": []},
        True,
        False,
    ],
)
def test_coerce_never_raises_even_on_odd_schemas(schema):
    for value in ["1", 1, None, [1, "2"], {"(": "1"}, "2024/03/05"]:
        coerce(schema, value)


# --------------------------------------------------------------------------- check


def test_check_returns_no_problems_for_valid_arguments():
    assert check(PY_SCHEMA, VALID_BOOKING) == []
    assert check(FILE_SCHEMA, VALID_PAYMENT) == []


def test_an_integer_out_of_range_is_reported_with_its_bounds():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "count": 11})
    assert problem == {"field": "count", "expected": "an integer between 1 and 10", "received": "11", "missing": False}


def test_a_wrong_type_is_reported_with_the_whole_expectation():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "count": "many"})
    assert problem["expected"] == "an integer between 1 and 10"
    assert problem["received"] == "'many'"


def test_enum_problems_list_the_members():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "color": "purple"})
    assert problem["expected"] == "one of 'red', 'green', 'blue'"
    [literal] = check(PY_SCHEMA, {**VALID_BOOKING, "order": "up"})
    assert literal["field"] == "order" and literal["expected"] == "one of 'asc', 'desc'"


@pytest.mark.parametrize(
    ("day", "valid"),
    [("2024-02-29", True), ("2023-02-29", False), ("2024-13-45", False), ("2024-3-5", False), ("٢٠٢٤-٠٣-٠٥", False)],
)
def test_the_date_format_is_really_checked(day, valid):
    problems = check(PY_SCHEMA, {**VALID_BOOKING, "day": day})
    assert (problems == []) is valid
    if not valid:
        assert problems[0]["expected"] == "a date YYYY-MM-DD"


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("date-time", "2024-03-05T10:00:00+08:00", "2024-03-05T25:00:00"),
        ("date-time", "2024-03-05t10:00:00.123z", "2024-03-05 10:00:00"),
        ("time", "10:00:00", "10:60:00"),
        ("email", "li.wei@example.cn", "li.wei at example.cn"),
        ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000"),
        ("uri", "https://example.com/a?b=c", "example.com/a b"),
        ("ipv4", "192.0.2.1", "192.0.2.256"),
    ],
)
def test_string_formats_are_checked(fmt, good, bad):
    schema = {"type": "string", "format": fmt}
    assert check(schema, good) == []
    [problem] = check(schema, bad)
    assert problem["field"] == ARGUMENTS_FIELD


def test_a_missing_required_argument_is_marked_missing():
    problems = check(PY_SCHEMA, {"count": 3})
    assert [p["field"] for p in problems] == ["address", "color", "day"]
    for problem in problems:
        assert problem == {
            "field": problem["field"],
            "expected": "a value (required)",
            "received": "nothing (missing)",
            "missing": True,
        }


def test_a_required_argument_given_as_null_counts_as_missing():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "day": None})
    assert problem == {"field": "day", "expected": "a date YYYY-MM-DD (required)", "received": "null", "missing": True}
    [nested] = check(PY_SCHEMA, {**VALID_BOOKING, "address": {"street": None, "city": "x"}})
    assert nested["field"] == "address.street" and nested["missing"] is True


def test_null_for_a_required_argument_that_allows_null_is_fine():
    schema = wrap({"anyOf": [{"type": "integer"}, {"type": "null"}]})
    assert check(schema, {"x": None}) == []


def test_an_unexpected_argument_lists_the_declared_arguments():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "colour": "red"})
    assert problem["field"] == "colour"
    assert problem["expected"] == (
        "no such argument; the arguments are: count, color, day, address, order, tags, note, at, urgent"
    )
    assert problem["received"] == "'red'" and problem["missing"] is False
    [nested] = check(PY_SCHEMA, {**VALID_BOOKING, "address": {"street": "a", "city": "b", "country": "c"}})
    assert nested["field"] == "address.country"
    assert nested["expected"] == "no such key; the keys are: street, city, zip_code"


def test_problems_in_nested_objects_and_lists_have_dotted_paths():
    problems = check(PY_SCHEMA, {**VALID_BOOKING, "address": {"street": 5, "city": "b"}, "tags": [1, "x", 3]})
    assert [(p["field"], p["expected"]) for p in problems] == [
        ("address.street", "a string"),
        ("tags.1", "an integer"),
    ]


def test_a_bad_optional_value_is_reported_inside_its_non_null_branch():
    schema = wrap({"anyOf": [{"type": "integer", "minimum": 1, "maximum": 10}, {"type": "null"}]})
    [problem] = check(schema, {"x": 11})
    assert problem["expected"] == "an integer between 1 and 10"
    [wrong_type] = check(schema, {"x": "abc"})
    assert wrong_type["expected"] == "an integer between 1 and 10 or null"
    [nested] = check(PY_SCHEMA, {**VALID_BOOKING, "at": "soon"})
    # A string was sent, so the string branch is the one meant: no "or null" in the text.
    assert nested["expected"] == "a date-time YYYY-MM-DDTHH:MM:SS, optionally with a UTC offset such as +08:00 or Z"


def test_oneof_problems_are_reported_inside_the_branch_its_const_selects():
    problems = check(FILE_SCHEMA, {**VALID_PAYMENT, "method": {"kind": "bank", "iban": "short"}})
    assert problems == [
        {"field": "method.iban", "expected": "a string of 15 to 34 characters", "received": "'short'", "missing": False}
    ]
    [missing] = check(FILE_SCHEMA, {**VALID_PAYMENT, "method": {"kind": "card"}})
    assert (missing["field"], missing["missing"]) == ("method.number", True)
    [neither] = check(FILE_SCHEMA, {**VALID_PAYMENT, "method": {"kind": "cash"}})
    assert neither["field"] == "method"
    assert "an object with keys kind (required), number (required)" in neither["expected"]
    assert "an object with keys kind (required), iban (required)" in neither["expected"]


def test_top_level_that_is_not_an_object_is_a_problem_with_the_arguments():
    [problem] = check(PY_SCHEMA, [1, 2])
    assert problem == {"field": ARGUMENTS_FIELD, "expected": "a JSON object", "received": "[1, 2]", "missing": False}


def test_a_schema_for_a_single_value_describes_that_value_at_the_top():
    [problem] = check(only("integer", minimum=0), "x")
    assert problem == {"field": ARGUMENTS_FIELD, "expected": "an integer at least 0", "received": "'x'", "missing": False}


def test_received_is_cut_to_200_characters():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "count": "9" * 1000})
    assert len(problem["received"]) == RECEIVED_MAX_CHARS
    assert problem["received"].endswith("…")


def test_received_keeps_cjk_and_emoji_readable():
    [problem] = check(PY_SCHEMA, {**VALID_BOOKING, "color": "红色🙂"})
    assert problem["received"] == "'红色🙂'"


def test_keys_that_are_empty_or_have_dots_are_quoted_in_the_field():
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    problems = check(schema, {"": "a", "a.b": "b", "plain": "c"})
    assert [p["field"] for p in problems] == ['""', '"a.b"', "plain"]


def test_problems_are_sorted_by_field_with_list_indices_in_numeric_order():
    schema = wrap({"type": "array", "items": {"type": "integer"}})
    value = {"x": ["a"] * 12}
    fields = [p["field"] for p in check(schema, value)]
    assert fields == [f"x.{i}" for i in range(12)]
    mixed = check(PY_SCHEMA, {"count": 0, "zzz": 1, "color": "x"})
    assert [p["field"] for p in mixed] == sorted(p["field"] for p in mixed)
    assert check(PY_SCHEMA, {"count": 0, "zzz": 1, "color": "x"}) == mixed


def test_other_keywords_are_described_with_the_validator_message():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependentRequired": {"a": ["b"]},
    }
    [problem] = check(schema, {"a": 1})
    assert problem == {
        "field": "b",
        "expected": "a value (required when a is given)",
        "received": "nothing (missing)",
        "missing": True,
    }
    [problem] = check({"type": "object", "minProperties": 1}, {})
    assert problem["expected"] == "an object ({} should be non-empty)"


# --------------------------------------------------------------------------- validate_arguments


@pytest.mark.parametrize("sent", [None, "", "  ", "null", "{}", {}])
def test_validate_arguments_reads_no_arguments_as_an_empty_object(sent):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "default": 5}}}
    assert validate_arguments("t", schema, sent) == {"n": 5}


def test_validate_arguments_reads_a_json_object_given_as_text():
    assert validate_arguments("pay", FILE_SCHEMA, json.dumps(VALID_PAYMENT))["amount"] == 12.5


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ([1], "a JSON object"),
        (42, "a JSON object"),
        ("[1]", "a JSON object"),
        ('"text"', "a JSON object"),
        ("not json", "a JSON object (the text is not valid JSON)"),
        ("NaN", "a JSON object (the text is not valid JSON)"),
    ],
)
def test_validate_arguments_refuses_anything_but_an_object_at_the_top(sent, expected):
    with pytest.raises(ToolArgumentsError) as caught:
        validate_arguments("pay", FILE_SCHEMA, sent)
    assert caught.value.tool_name == "pay"
    assert [(p["field"], p["expected"]) for p in caught.value.problems] == [(ARGUMENTS_FIELD, expected)]


def test_validate_arguments_fills_defaults_of_absent_optional_top_level_arguments_only():
    result = validate_arguments("pay", FILE_SCHEMA, {**VALID_PAYMENT, "priority": "2"})
    assert result == {**VALID_PAYMENT, "priority": 2, "currency": "CNY", "urgent": False}
    booking = validate_arguments("book", PY_SCHEMA, VALID_BOOKING)
    assert booking["address"] == VALID_BOOKING["address"]  # nested zip_code default not filled
    assert booking["tags"] == [] and booking["note"] is None and booking["order"] == "asc"


def test_validate_arguments_returns_repaired_arguments_a_pydantic_model_accepts():
    sent = '{"count": "2", "color": "Red", "day": "5 March 2024", "address": {"street": "x", "city": "y"}, "tags": "7"}'
    result = validate_arguments("book", PY_SCHEMA, sent)
    model = PY_MODEL.model_validate(result)
    assert (model.count, model.color, model.day, model.tags) == (2, Color.RED, date(2024, 3, 5), [7])


def test_validate_arguments_raises_with_every_remaining_problem():
    with pytest.raises(ToolArgumentsError) as caught:
        validate_arguments("pay", FILE_SCHEMA, {"amount": "-5", "method": None, "currency": "yen", "extra": 1})
    problems = caught.value.problems
    assert [(p["field"], p["missing"]) for p in problems] == [
        ("amount", False),
        ("currency", False),
        ("extra", False),
        ("method", True),
    ]
    assert problem_for(problems, "amount")["expected"] == "a number greater than 0"
    assert problem_for(problems, "amount")["received"] == "-5"
    assert missing_fields(problems) == ["method"]
    assert "amount: expected a number greater than 0, received -5" in str(caught.value)


def test_validate_arguments_does_not_mutate_its_input():
    sent = {"amount": "5", "method": '{"kind": "card", "number": "4111111111111111"}'}
    before = copy.deepcopy(sent)
    validate_arguments("pay", FILE_SCHEMA, sent)
    assert sent == before


def test_arguments_nested_too_deep_are_refused_as_a_problem():
    deep: Any = 1
    for _ in range(200):
        deep = [deep]
    with pytest.raises(ToolArgumentsError) as caught:
        validate_arguments("pay", FILE_SCHEMA, {**VALID_PAYMENT, "meta": {"x": deep}})
    assert caught.value.problems[0]["field"] == ARGUMENTS_FIELD


# --------------------------------------------------------------------------- check_schema


def test_check_schema_accepts_pydantic_and_hand_written_schemas():
    check_schema(PY_SCHEMA)
    check_schema(FILE_SCHEMA)
    check_schema(
        {
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/Node"}},
            "$defs": {"Node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}},
        }
    )


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ([], "must be a JSON object"),
        ({"type": "array"}, '"type": "object"'),
        ({"properties": {}}, '"type": "object"'),
        ({"type": "object", "properties": {"a": {"type": "integr"}}}, "invalid JSON Schema at #/properties/a/type"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "("}}}, "invalid JSON Schema"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}, "is not local"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}, "does not resolve"),
        (
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/A"}},
                "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}]}, "B": {"$ref": "#/$defs/A"}},
            },
            "refers back to itself",
        ),
    ],
)
def test_check_schema_refuses_unusable_schemas_saying_what_is_wrong(schema, words):
    with pytest.raises(ToolRegistrationError) as caught:
        check_schema(schema)
    assert words in str(caught.value)


# --------------------------------------------------------------------------- pydantic problems


def pydantic_problems(arguments: dict) -> list[dict]:
    with pytest.raises(ValidationError) as caught:
        PY_MODEL.model_validate(arguments)
    return problems_from_pydantic(caught.value)


def test_pydantic_missing_fields_are_marked_missing():
    problems = pydantic_problems({"count": 3})
    assert [p["field"] for p in problems] == ["address", "color", "day"]
    assert all(p["missing"] and p["received"] == "nothing (missing)" and p["expected"] == "a value (required)" for p in problems)


def test_pydantic_null_for_a_non_optional_field_is_marked_missing():
    [problem] = pydantic_problems({**VALID_BOOKING, "count": None})
    assert problem == {"field": "count", "expected": "a valid integer (required)", "received": "null", "missing": True}


def test_pydantic_null_list_item_is_a_wrong_value_not_a_missing_field():
    [problem] = pydantic_problems({**VALID_BOOKING, "tags": [1, None]})
    assert problem == {"field": "tags.1", "expected": "a valid integer", "received": "null", "missing": False}


def test_pydantic_problems_carry_the_expectation_and_what_came():
    address = {"street": "a", "city": "b", "planet": "Mars"}
    problems = pydantic_problems({**VALID_BOOKING, "count": 11, "color": "purple", "tags": [1, "x"], "address": address})
    assert [(p["field"], p["expected"], p["received"], p["missing"]) for p in problems] == [
        ("address.planet", "no such key", "'Mars'", False),
        ("color", "'red', 'green' or 'blue'", "'purple'", False),
        ("count", "less than or equal to 10", "11", False),
        ("tags.1", "a valid integer, unable to parse string as an integer", "'x'", False),
    ]


def test_pydantic_union_member_errors_fold_into_one_problem_for_the_field():
    class Pick(BaseModel):
        value: int | bool

    with pytest.raises(ValidationError) as caught:
        Pick.model_validate({"value": [1]})
    [problem] = problems_from_pydantic(caught.value)
    assert problem["field"] == "value"
    assert problem["expected"] == "a valid integer or a valid boolean"


def test_pydantic_received_is_cut_to_200_characters():
    [problem] = pydantic_problems({**VALID_BOOKING, "count": "x" * 500})
    assert len(problem["received"]) == RECEIVED_MAX_CHARS


def test_pydantic_and_jsonschema_problems_name_the_same_fields():
    bad = {"count": 0, "color": "purple", "address": {"street": "a"}, "tags": [1, "x"], "surprise": True}
    from_schema = {p["field"] for p in check(PY_SCHEMA, bad)}
    from_pydantic = {p["field"] for p in pydantic_problems(bad)}
    assert from_schema == from_pydantic == {"count", "color", "day", "address.city", "tags.1", "surprise"}


def test_missing_fields_lists_each_missing_field_once_in_order():
    problems = [
        {"field": "b", "expected": "", "received": "", "missing": True},
        {"field": "a", "expected": "", "received": "", "missing": False},
        {"field": "b", "expected": "", "received": "", "missing": True},
        {"field": "c", "expected": "", "received": "", "missing": True},
    ]
    assert missing_fields(problems) == ["b", "c"]
    assert missing_fields([]) == []


# --------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

SCHEMAS = {"pydantic": PY_SCHEMA, "file": FILE_SCHEMA}


def argument_dicts(schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects using the schema's own argument names (and some others) with arbitrary values."""
    names = list(schema["properties"]) + ["unknown", "Count", "COLOR"]
    return st.dictionaries(st.sampled_from(names), json_values, max_size=len(names))


def any_arguments(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return json_values | argument_dicts(schema) | argument_dicts(schema).map(json.dumps)


def assert_well_formed(problems: list[dict]) -> None:
    assert problems
    for problem in problems:
        assert set(problem) == {"field", "expected", "received", "missing"}
        assert isinstance(problem["field"], str) and problem["field"]
        assert isinstance(problem["expected"], str) and problem["expected"]
        assert isinstance(problem["received"], str) and len(problem["received"]) <= RECEIVED_MAX_CHARS
        assert isinstance(problem["missing"], bool)


# No example database: runs are reproducible from the seed alone and leave no state behind.
PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.parametrize("name", list(SCHEMAS))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_any_json_gives_valid_arguments_or_well_formed_problems(name, data):
    schema = SCHEMAS[name]
    sent = data.draw(any_arguments(schema))
    before = copy.deepcopy(sent)
    try:
        result = validate_arguments("tool", schema, sent)
    except ToolArgumentsError as err:
        assert_well_formed(err.problems)
    else:
        assert isinstance(result, dict)
        assert check(schema, result) == []
        if schema is PY_SCHEMA:
            PY_MODEL.model_validate(result)
    assert sent == before


@pytest.mark.parametrize("name", list(SCHEMAS))
@PROPERTY_SETTINGS
@given(data=st.data())
def test_coercion_is_idempotent(name, data):
    schema = SCHEMAS[name]
    sent = data.draw(any_arguments(schema))
    once = coerce(schema, sent)
    assert coerce(schema, once) == once
    prop = schema["properties"][data.draw(st.sampled_from(sorted(schema["properties"])))]
    single = coerce(prop, data.draw(json_values), root=schema)
    assert coerce(prop, single, root=schema) == single


valid_bookings = st.fixed_dictionaries(
    {
        "count": st.integers(1, 10),
        "color": st.sampled_from([c.value for c in Color]),
        "day": st.dates().map(date.isoformat),
        "address": st.fixed_dictionaries(
            {"street": st.text(), "city": st.text()}, optional={"zip_code": st.none() | st.text()}
        ),
    },
    optional={
        "order": st.sampled_from(["asc", "desc"]),
        "tags": st.lists(st.integers()),
        "note": st.none() | st.text(),
        "at": st.none() | st.datetimes().map(lambda d: d.isoformat(timespec="seconds")),
        "urgent": st.booleans(),
    },
)
valid_payments = st.fixed_dictionaries(
    {
        "amount": st.floats(min_value=0.01, max_value=1e9) | st.integers(1, 10**12),
        "method": st.one_of(
            st.fixed_dictionaries({"kind": st.just("card"), "number": st.from_regex(r"\A[0-9]{12,19}\Z")}),
            st.fixed_dictionaries({"kind": st.just("bank"), "iban": st.text(min_size=15, max_size=34)}),
        ),
    },
    optional={
        "currency": st.sampled_from(["CNY", "USD", "EUR"]),
        "due": st.none() | st.dates().map(date.isoformat),
        "notify": st.lists(st.emails(), max_size=5, unique=True),
        "reference": st.uuids().map(str),
        "priority": st.integers(1, 5),
        "urgent": st.booleans(),
        "meta": st.dictionaries(st.text(), st.text(), max_size=3),
    },
)


@PROPERTY_SETTINGS
@given(sent=valid_bookings)
def test_valid_pydantic_tool_arguments_come_back_unchanged(sent):
    assert check(PY_SCHEMA, sent) == []
    assert coerce(PY_SCHEMA, sent) == sent
    result = validate_arguments("book", PY_SCHEMA, sent)
    assert {k: v for k, v in result.items() if k in sent} == sent
    PY_MODEL.model_validate(result)


@PROPERTY_SETTINGS
@given(sent=valid_payments)
def test_valid_file_tool_arguments_come_back_unchanged(sent):
    assert check(FILE_SCHEMA, sent) == []
    assert coerce(FILE_SCHEMA, sent) == sent


DATE_STYLES = [
    lambda d: d.isoformat(),
    lambda d: d.strftime("%Y/%m/%d"),
    lambda d: d.strftime("%Y.%m.%d"),
    lambda d: d.strftime("%d.%m.%Y"),
    lambda d: d.strftime("%m/%d/%Y"),
    lambda d: f"{d.day} {d.strftime('%B')} {d.year}",
    lambda d: f"{d.strftime('%B')} {d.day}, {d.year}",
    lambda d: f"{d.year}年{d.month}月{d.day}日",
]


@st.composite
def loose_bookings(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """Arguments as a model might loosely send them, and what they mean."""
    count = draw(st.integers(1, 10))
    color = draw(st.sampled_from(list(Color)))
    day = draw(st.dates(min_value=date(1000, 1, 1)))
    tags = draw(st.lists(st.integers(-1000, 1000), max_size=3))
    sent = {
        "count": draw(st.sampled_from([count, str(count), f" {count} ", f"{count}.0", float(count)])),
        "color": draw(st.sampled_from([color.value.upper(), f" {color.value.title()} ", color.value])),
        "day": draw(st.sampled_from(DATE_STYLES))(day),
        "address": draw(
            st.sampled_from(
                [
                    {"street": "1 Main", "city": "北京"},
                    '{"street": "1 Main", "city": "北京"}',
                    {"Street": "1 Main", "CITY": "北京", "zip_code": None},
                ]
            )
        ),
        "tags": draw(st.sampled_from([tags, json.dumps(tags), [str(t) for t in tags]])),
    }
    if len(tags) == 1:
        sent["tags"] = draw(st.sampled_from([tags[0], str(tags[0]), sent["tags"]]))
    if draw(st.booleans()):
        sent["urgent"] = draw(st.sampled_from(["yes", "TRUE", 1, "on"]))
    if draw(st.booleans()):
        sent["note"] = None
    meaning = {"count": count, "color": color, "day": day, "tags": tags, "city": "北京"}
    arguments: Any = draw(st.sampled_from([sent, json.dumps(sent, ensure_ascii=False)]))
    return arguments, meaning


@PROPERTY_SETTINGS
@given(case=loose_bookings())
def test_loosely_written_arguments_are_repaired_to_what_they_mean(case):
    sent, meaning = case
    model = PY_MODEL.model_validate(validate_arguments("book", PY_SCHEMA, sent))
    assert (model.count, model.color, model.day, model.tags, model.address.city) == (
        meaning["count"],
        meaning["color"],
        meaning["day"],
        meaning["tags"],
        meaning["city"],
    )


@settings(max_examples=100, deadline=None, database=None)
@given(value=json_values)
def test_check_of_any_json_against_any_subschema_never_raises(value):
    for schema in SCHEMAS.values():
        for prop in schema["properties"].values():
            problems = check({**prop, "$defs": schema.get("$defs", {}), "definitions": schema.get("definitions", {})}, value)
            if problems:
                assert_well_formed(problems)


@PROPERTY_SETTINGS
@given(sent=json_values)
def test_the_tool_activity_turns_any_json_into_a_call_or_a_code_1_result_never_an_exception(sent):
    """Through the layer the worker runs (tool lookup, normalisation, coercion,
    validation, checks) for a Python tool, a schema-only tool and a composite: whatever
    JSON a model sends as the arguments object, the outcome is runnable arguments or a
    ``{code: 1}`` result naming the problems."""
    import asyncio

    from activities.tools import ToolActivities
    from hermes.models import RunToolInput, ToolCall, ToolResult, ToolResultCode
    from hermes.tools.registry import Tool

    registry = ToolRegistry()
    registry.register(book_visit)
    registry.add(Tool(name="pay", description="Pay.", parameters_schema=FILE_SCHEMA))
    registry.composite("visit_and_pay", description="Both.", parameters=FILE_SCHEMA, steps=[{"tool": "pay"}])
    layer = ToolActivities(registry, None, tier_seconds=lambda tier: 15.0)

    async def prepare_all() -> None:
        for name in ("book_visit", "pay", "visit_and_pay"):
            call = ToolCall(tool_call_id="c1", name=name, arguments={"value": sent})
            call.arguments = sent  # what a provider may hand over, unvalidated
            outcome = await layer._prepare(RunToolInput(session_id="s", user_id="u", turn=1, tool_call=call))
            if isinstance(outcome, ToolResult):
                assert outcome.code == ToolResultCode.BAD_ARGUMENTS
                assert_well_formed(outcome.data["problems"])
            else:
                tool, arguments, _ = outcome
                assert tool.name == name
                json.dumps(tool.dump_arguments(arguments))

    asyncio.run(prepare_all())
