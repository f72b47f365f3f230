"""The example calculator tools: exact integer arithmetic, whatever the size (a model that adds
40-digit numbers needs the exact answer, not a float). Plain Python; server.py serves it.

Tools (OpenAI-style schemas in TOOLS):
- `calculator` {"expression": "12+34*5"}: decimal integers joined by + - * (* binds tighter, a
  leading - negates a number; spaces allowed) -> the exact value as text;
- `add` / `multiply` {"a": "123", "b": "-45"}: two integers written as strings of digits (JSON
  numbers lose digits past 2**53 in most languages) -> the exact sum / product.

Arguments that break the schema raise BadArguments naming the property (INVALID_ARGUMENT on the
wire); an expression that does not parse is the tool failing on valid arguments: ToolFailed (an
error observation the model sees). Deliberately not here: division, parentheses, floats.
"""
from __future__ import annotations

import json
import re

MAX_EXPRESSION_CHARS = 4000  # keeps every result under Python's 4300-digit int<->str limit
_INTEGER = "^-?[0-9]+$"
_TOKENS = re.compile(r"\d+|[-+*]|\S")


class BadArguments(ValueError):
    """Arguments that break the tool's schema."""


class UnknownTool(KeyError):
    """No tool of that name."""


class ToolFailed(ValueError):
    """The tool ran on valid arguments and failed; the message is the observation."""


def function_schema(name: str, description: str, properties: dict) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": sorted(properties),
                       "additionalProperties": False}}}


_NUMBER = {"type": "string", "pattern": _INTEGER, "description": "an integer in decimal digits, e.g. \"-123\""}
TOOLS = [
    function_schema("calculator", "Evaluate integers joined by + - * exactly (e.g. \"12+34*5\"); returns the integer.",
                    {"expression": {"type": "string", "description": "decimal integers joined by +, - and *"}}),
    function_schema("add", "Add two integers exactly.", {"a": _NUMBER, "b": _NUMBER}),
    function_schema("multiply", "Multiply two integers exactly.", {"a": _NUMBER, "b": _NUMBER}),
]
_BY_NAME = {t["function"]["name"]: t["function"] for t in TOOLS}


def json_object(text: str, what: str) -> dict:
    """`text` as a JSON object; BadArguments naming `what` otherwise."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise BadArguments(f"{what}: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise BadArguments(f"{what}: must be a JSON object, got {type(value).__name__}")
    return value


def check_arguments(name: str, arguments_json: str, tools: dict | None = None) -> dict:
    """The arguments of tool `name` (of `tools`, name -> function object: these tools by default) as a
    dict; UnknownTool or BadArguments naming what is wrong. Properties are strings, as here."""
    tools = _BY_NAME if tools is None else tools
    if name not in tools:
        raise UnknownTool(f"no tool named {name!r} (tools: {', '.join(tools)})")
    args = json_object(arguments_json, f"{name}: arguments")
    params = tools[name]["parameters"]
    for key in args:
        if key not in params["properties"]:
            raise BadArguments(f"{name}: unknown property '{key}' (properties: {', '.join(params['properties'])})")
    for key in params["required"]:
        if key not in args:
            raise BadArguments(f"{name}: missing required property '{key}'")
    for key, value in args.items():
        prop = params["properties"][key]
        if not isinstance(value, str):
            raise BadArguments(f"{name}: property '{key}' must be a string, got {type(value).__name__}")
        if "pattern" in prop and not re.search(prop["pattern"], value):  # anchored, as JSON Schema reads it
            raise BadArguments(f"{name}: property '{key}' must be an integer in decimal digits, got {value[:40]!r}")
    return args


def evaluate(expression: str) -> int:
    """The exact value of `expression` (integers joined by + - *); ToolFailed saying where it breaks."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolFailed(f"expression too long: {len(expression)} characters (at most {MAX_EXPRESSION_CHARS})")
    tokens = _TOKENS.findall(expression)
    pos = 0

    def take_number() -> int:
        nonlocal pos
        sign = 1
        while pos < len(tokens) and tokens[pos] == "-":
            sign, pos = -sign, pos + 1
        if pos >= len(tokens) or not tokens[pos].isdigit():
            got = repr(tokens[pos]) if pos < len(tokens) else "the end"
            raise ToolFailed(f"expected a number, got {got} in {expression[:80]!r}")
        pos += 1
        return sign * int(tokens[pos - 1])

    if not tokens:
        raise ToolFailed("empty expression")
    total, product = 0, take_number()
    while pos < len(tokens):
        op = tokens[pos]
        if op not in ("+", "-", "*"):
            raise ToolFailed(f"expected + - or *, got {op!r} in {expression[:80]!r}")
        pos += 1
        if op == "*":
            product *= take_number()
        else:
            total, product = total + product, take_number() * (1 if op == "+" else -1)
    return total + product


def call_tool(name: str, arguments_json: str) -> str:
    """Run tool `name` -> its observation; UnknownTool, BadArguments or ToolFailed otherwise."""
    args = check_arguments(name, arguments_json)
    if name == "calculator":
        return str(evaluate(args["expression"]))
    a, b = int(args["a"]), int(args["b"])
    return str(a + b if name == "add" else a * b)
