"""OpenAI-style function schemas (verl's tool_schema, ToolService.ListTools): their checks, and
arguments made from them. Used by the conformance kit and the tool-config loader.

A tool is {"type": "function", "function": {"name": ..., "description": ..., "parameters": <a JSON
Schema of type "object">}}. The JSON Schema itself is checked with `jsonschema` when it is installed
(it is not a requirement of Tandem); without it, only the shape above is.
"""
from __future__ import annotations

import json
import re

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_BY_TYPE = {"string": "1", "integer": 1, "number": 1, "boolean": True, "array": [], "object": {}, "null": None}


def function_problems(tool, where: str = "") -> list[str]:
    """What is wrong with a tool given as a parsed object (empty: nothing); each problem names its
    field, under `where` when given (e.g. "tools[2].tool_schema")."""
    def at(name: str) -> str:
        return f"{where}.{name}" if where else name

    if not isinstance(tool, dict):
        return [f"{where or 'the tool'}: must be an object, got {type(tool).__name__}"]
    if tool.get("type") != "function":
        return [f"{at('type')}: must be \"function\", got {tool.get('type')!r}"]
    fn = tool.get("function")
    if not isinstance(fn, dict):
        return [f"{at('function')}: must be an object, got {type(fn).__name__}"]
    problems = []
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        problems.append(f"{at('function.name')}: must be 1-64 letters, digits, _ or -, got {name!r}")
    if not isinstance(fn.get("description", ""), str):
        problems.append(f"{at('function.description')}: must be a string")
    params = fn.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        problems.append(f"{at('function.parameters')}: must be a JSON Schema of type \"object\", got {params!r:.80}")
        return problems
    props = params.get("properties", {})
    if not isinstance(props, dict):
        problems.append(f"{at('function.parameters.properties')}: must be an object")
        props = {}
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        problems.append(f"{at('function.parameters.required')}: must list names of its properties, got {required!r}")
    problems += [f"{at('function.parameters')}: {p}" for p in _json_schema_problems(params)]
    return problems


def schema_problems(text: str) -> tuple[list[str], dict | None]:
    """A tool as ListTools sends it (JSON text) -> (problems, its "function" object or None when it
    has no usable name)."""
    try:
        tool = json.loads(text)
    except ValueError as e:
        return [f"not valid JSON: {e}"], None
    problems = function_problems(tool)
    fn = tool.get("function") if isinstance(tool, dict) else None
    usable = isinstance(fn, dict) and isinstance(fn.get("name"), str)
    if usable and problems:
        problems = [f"{fn['name']!r}: {p}" for p in problems]
    return problems, fn if usable else None


def _json_schema_problems(schema: dict) -> list[str]:
    try:
        import jsonschema
    except ImportError:
        return []
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        return [f"not a valid JSON Schema: {e.message}"]
    return []


def example_arguments(parameters: dict) -> dict:
    """Arguments for a tool: each required property's first `examples` entry, its `default`, its
    first `enum` value, or else a plain value of its type ("1", 1, true, [], {})."""
    props = parameters.get("properties", {})
    return {name: _example(props.get(name, {})) for name in parameters.get("required", [])}


def _example(prop: dict):
    if prop.get("examples"):
        return prop["examples"][0]
    if "default" in prop:
        return prop["default"]
    if prop.get("enum"):
        return prop["enum"][0]
    kind = prop.get("type", "string")
    return _BY_TYPE.get(kind[0] if isinstance(kind, list) else kind, "1")
