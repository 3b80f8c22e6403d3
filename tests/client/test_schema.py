"""Schemas from type hints + Google docstrings, and the client-side argument validator."""

from __future__ import annotations

import enum
from typing import Literal, Optional, Union

import pytest

from sandboxd_client import ToolDefinitionError, function_tool_schema
from sandboxd_client.schema import ArgumentError, validate


class Color(enum.Enum):
    red = "red"
    blue = "blue"


def get_current_temperature(location: str, unit: str, days: int = 1,
                            tags: Optional[list[str]] = None,  # noqa: UP045 - tested on purpose
                            extra: dict[str, float] | None = None,
                            mode: Literal["fast", "slow"] = "fast",
                            color: Color = Color.red,
                            flag: bool = False,
                            ratio: Union[int, float] = 1) -> float:  # noqa: UP007
    """
    Get the current temperature at a location.

    Args:
        location: The location to get the temperature for, in the format
            "City, Country"
        unit: The unit to return the temperature in. (choices: ["celsius", "fahrenheit"])
        days (int): How many days.
        tags: Labels.
        extra: Numbers by name.
        mode: Speed.
        color: A color.
        flag: A flag.
        ratio: A ratio.

    Returns:
        The temperature.
    """
    return 22.0


def test_transformers_style_docstring() -> None:
    schema = function_tool_schema(get_current_temperature)
    fn = schema["function"]
    assert schema["type"] == "function"
    assert fn["name"] == "get_current_temperature"
    assert fn["description"] == "Get the current temperature at a location."
    p = fn["parameters"]
    assert p["type"] == "object" and p["additionalProperties"] is False
    assert p["required"] == ["location", "unit"]
    props = p["properties"]
    assert props["location"] == {
        "type": "string",
        "description": 'The location to get the temperature for, in the format "City, Country"'}
    assert props["unit"] == {"type": "string", "enum": ["celsius", "fahrenheit"],
                             "description": "The unit to return the temperature in."}
    assert props["days"] == {"type": "integer", "description": "How many days.", "default": 1}
    assert props["tags"]["type"] == ["array", "null"]
    assert props["tags"]["items"] == {"type": "string"}
    assert props["extra"] == {"anyOf": [{"type": "object",
                                         "additionalProperties": {"type": "number"}},
                                        {"type": "null"}],
                              "description": "Numbers by name.", "default": None}
    assert props["mode"]["enum"] == ["fast", "slow"] and props["mode"]["default"] == "fast"
    assert props["color"]["enum"] == ["red", "blue"] and props["color"]["default"] == "red"
    assert props["flag"]["type"] == "boolean"
    assert props["ratio"]["type"] == ["integer", "number"]


def test_lm_studio_style_function_without_args_section() -> None:
    def multiply(a: float, b: float) -> float:
        """Given two numbers a and b. Returns the product of them."""
        return a * b

    fn = function_tool_schema(multiply)["function"]
    assert fn["parameters"]["properties"] == {"a": {"type": "number"}, "b": {"type": "number"}}
    assert fn["parameters"]["required"] == ["a", "b"]


def _no_hint(x, y: int) -> int:  # type: ignore[no-untyped-def]
    """Doc."""
    return y


def _varargs(*values: int) -> int:
    """Doc."""
    return 0


def _no_doc(x: int) -> int:
    return x


def _bad_type(x: object) -> int:
    """Doc."""
    return 0


def _int_keys(x: dict[int, str]) -> int:
    """Doc."""
    return 0


def _doc_mismatch(x: int) -> int:
    """Doc.

    Args:
        y: Not a parameter.
    """
    return x


def _bad_choices(x: str) -> str:
    """Doc.

    Args:
        x: Thing. (choices: [not json])
    """
    return x


@pytest.mark.parametrize(("fn", "message"), [
    (_no_hint, "no type annotation"),
    (_varargs, r"\*args"),
    (_no_doc, "no description"),
    (_bad_type, "cannot describe type"),
    (_int_keys, r"dict\[str, X\]"),
    (_doc_mismatch, "unknown parameter"),
    (_bad_choices, "choices"),
])
def test_undescribable_functions_raise(fn: object, message: str) -> None:
    with pytest.raises(ToolDefinitionError, match=message):
        function_tool_schema(fn)  # type: ignore[arg-type]


def test_validator() -> None:
    schema = function_tool_schema(get_current_temperature)["function"]["parameters"]
    validate(schema, {"location": "Paris", "unit": "celsius"})
    validate(schema, {"location": "Paris", "unit": "celsius", "tags": None, "days": 3.0})
    cases = [
        ({"unit": "celsius"}, "location", "is required"),
        ({"location": 1, "unit": "celsius"}, "location", "type string"),
        ({"location": "P", "unit": "kelvin"}, "unit", "must be one of"),
        ({"location": "P", "unit": "celsius", "days": True}, "days", "type integer"),
        ({"location": "P", "unit": "celsius", "tags": [1]}, "tags[0]", "type string"),
        ({"location": "P", "unit": "celsius", "extra": {"k": "v"}}, "extra", "any allowed"),
        ({"location": "P", "unit": "celsius", "zzz": 1}, "zzz", "not a parameter"),
    ]
    for args, field, text in cases:
        with pytest.raises(ArgumentError) as info:
            validate(schema, args)
        assert info.value.field == field, args
        assert text in str(info.value), (args, str(info.value))
    with pytest.raises(ArgumentError, match="at least 1"):
        validate({"type": "object", "properties": {"code": {"type": "string", "minLength": 1}}},
                 {"code": ""})
    with pytest.raises(ArgumentError) as nested:
        validate({"type": "object", "properties": {"xs": {"type": "array", "items": {
            "type": "integer", "minimum": 0}}}}, {"xs": [1, -1]})
    assert nested.value.field == "xs[1]"
