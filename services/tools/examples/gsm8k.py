"""The example answer checker: verl's gsm8k tool (`calc_gsm8k_reward`) as a stateless tool that reads
the rollout row's ground truth from the call's kwargs (verl's extra_info.tools_kwargs entry, sent as
CallToolRequest.instance_kwargs_json), so verl's gsm8k multi-turn data works against the example
server as it is. Plain Python; server.py serves it.

- `calc_gsm8k_reward` {"answer": "72"}: the last number in the answer (commas and `$` dropped, so
  "#### 1,234" reads 1234) compared with the row's `create_kwargs.ground_truth` -> the score as text,
  "answer '72': correct, score 1.0" (or "not correct, score 0.0").

A row without a ground truth is the tool failing on valid arguments (ToolFailed: the model is shown
why); kwargs not shaped as verl's (create_kwargs not an object) are BadArguments naming the field.
Deliberately not here: verl's per-instance state (its penalty for an answer that does not improve):
each call stands alone; an answer written as a JSON number (verl's tool reads it, its schema says a
string): INVALID_ARGUMENT, as the schema says.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from tandem.services.tools.examples.calculator import BadArguments, ToolFailed, check_arguments, function_schema

KWARGS = "instance_kwargs_json"  # the request field the kwargs came in, named in errors
TOOLS = [function_schema("calc_gsm8k_reward", "Check the final answer to the question; returns its score.",
                         {"answer": {"type": "string", "description": "the final answer, e.g. \"72\""}})]
_BY_NAME = {t["function"]["name"]: t["function"] for t in TOOLS}
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


def last_number(text: str) -> Decimal | None:
    """The last number written in `text` (thousands commas and `$` ignored), or None."""
    found = _NUMBER.findall(text.replace("$", ""))
    if not found:
        return None
    try:
        return Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None


def ground_truth(name: str, kwargs: dict) -> Decimal:
    """The row's answer from verl's create_kwargs; BadArguments for kwargs of the wrong shape, ToolFailed
    for a row that gave none (the data's fault, shown to the model as the tool's error)."""
    create = kwargs.get("create_kwargs", {})
    if not isinstance(create, dict):
        raise BadArguments(f"{KWARGS}: create_kwargs must be a JSON object, got {type(create).__name__}")
    truth = create.get("ground_truth")
    if truth is None:
        raise ToolFailed(f"this row gave no ground truth (tools_kwargs.{name}.create_kwargs.ground_truth)")
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        raise BadArguments(f"{KWARGS}: create_kwargs.ground_truth must be a string or a number, "
                           f"got {type(truth).__name__}")
    number = last_number(str(truth))
    if number is None:
        raise ToolFailed(f"the row's ground truth {str(truth)[:40]!r} holds no number")
    return number


def call_tool(name: str, arguments_json: str, kwargs: dict) -> str:
    """Score the model's answer against the row's ground truth -> the observation; UnknownTool,
    BadArguments or ToolFailed otherwise."""
    args = check_arguments(name, arguments_json, _BY_NAME)
    truth = ground_truth(name, kwargs)
    answer = last_number(args["answer"])
    if answer is None:
        return "answer: no number found, score 0.0"
    right = answer == truth  # Decimal: "72" and "72.0" are the same answer
    return f"answer {format(answer, 'f')!r}: {'correct, score 1.0' if right else 'not correct, score 0.0'}"
