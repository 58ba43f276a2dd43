"""`tool_choice` "required" / named function: a JSON schema that forces parseable tool calls.

As in SGLang, the reply is constrained to a JSON array of `{"name", "parameters"}` objects
(one item for a named function or with parallel_tool_calls false); `JsonArrayParser` turns it
back into tool calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from radixserve.errors import InvalidRequestError

logger = logging.getLogger(__name__)

TOOL_CHOICE_MODES = ("none", "auto", "required")


class ToolChoiceError(InvalidRequestError):
    """Bad `tools` / `tool_choice`; `param` names the request field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message, param)


def _function(tool: Any, k: int) -> Mapping[str, Any]:
    fn = tool.get("function") if isinstance(tool, Mapping) else None
    if (
        not isinstance(tool, Mapping)
        or tool.get("type", "function") != "function"
        or not isinstance(fn, Mapping)
        or not isinstance(fn.get("name"), str)
        or not fn["name"]
    ):
        raise ToolChoiceError(
            f"tools[{k}] must be {{'type': 'function', 'function': {{'name': ...}}}}", "tools"
        )
    params = fn.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise ToolChoiceError(f"tools[{k}].function.parameters must be an object", "tools")
    return fn


def validate_tools(tools: Sequence[Any] | None) -> list[Mapping[str, Any]]:
    """The `function` objects of `tools`; ToolChoiceError on a malformed entry."""
    if tools is None:
        return []
    return [_function(tool, k) for k, tool in enumerate(tools)]


def resolve_tool_choice(tool_choice: Any, tools: Sequence[Any] | None) -> str | None:
    """The mode ("none", "auto", "required") or, for a named function, its name.

    Defaults as OpenAI: "auto" with tools, "none" without.
    """
    functions = validate_tools(tools)
    if tool_choice is None:
        return "auto" if functions else "none"
    if isinstance(tool_choice, str):
        if tool_choice not in TOOL_CHOICE_MODES:
            raise ToolChoiceError(
                f"tool_choice must be one of {', '.join(TOOL_CHOICE_MODES)} or a named function,"
                f" got {tool_choice!r}",
                "tool_choice",
            )
        if tool_choice == "required" and not functions:
            raise ToolChoiceError("tool_choice 'required' needs a non-empty tools list", "tools")
        return tool_choice
    fn = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise ToolChoiceError(
            "tool_choice must be {'type': 'function', 'function': {'name': ...}}", "tool_choice"
        )
    if name not in {f["name"] for f in functions}:
        raise ToolChoiceError(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
    return name


def _item_schema(fn: Mapping[str, Any]) -> dict[str, Any]:
    params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": [fn["name"]]}, "parameters": params},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


def forced_tool_schema(tools: Sequence[Any], choice: str, parallel: bool = True) -> dict[str, Any]:
    """The JSON schema for a forced choice: `choice` is "required" or a function name."""
    functions = validate_tools(tools)
    if choice != "required":
        functions = [f for f in functions if f["name"] == choice]
        if not functions:
            raise ToolChoiceError(
                f"tool_choice names {choice!r}, which is not in tools", "tool_choice"
            )
    items = [_item_schema(f) for f in functions]
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": items[0] if len(items) == 1 else {"anyOf": items},
    }
    if choice != "required" or not parallel:
        schema["maxItems"] = 1
    return schema
