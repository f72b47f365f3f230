"""The built-in tool task: products of 3-digit numbers, with a calculator the model may call. An
in-process ToolCaller, the call format of the character tokenizer (tandem/tasks/arithmetic.py) and
the data.

The model writes `[123*456]` (`]` ends the call and pauses the row); the rollout appends `{056088}`,
the exact value at the task's answer width, or `{!}` when the call failed (the character vocabulary
cannot spell an error message). The answer then follows: `056088<eos>`. Without the calculator a
model this small multiplies in one pass, badly; with it the task is two copies.
"""
from __future__ import annotations

import re
from typing import Sequence

from tandem.tools.calls import ToolCall, ToolResult

CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE, FAILED = "[", "]", "{", "}", "!"
TOOL_CHARS = [CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE, FAILED, "*"]  # "+" is the base task's
TOOL_NAME = "calculator"
_EXPR = re.compile(r"^(\d+)([+*])(\d+)$")


def calculate(expression: str) -> ToolResult:
    """`a+b` or `a*b` (digits) -> the value, zero-padded to the width the task writes answers at
    (a sum: the longer operand's width plus one; a product: the operands' widths added)."""
    m = _EXPR.match(expression.strip())
    if m is None:
        return ToolResult(f"not a sum or product of two whole numbers: {expression!r}", ok=False)
    a, op, b = m.groups()
    if op == "*":
        return ToolResult(f"{int(a) * int(b):0{len(a) + len(b)}d}", ok=True)
    return ToolResult(f"{int(a) + int(b):0{max(len(a), len(b)) + 1}d}", ok=True)


class CalculatorCaller:
    """A ToolCaller answering `calculator` calls in process (tests, and the built-in task until a
    tool service is configured)."""

    async def call(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        return [calculate(str(c.arguments.get("expression", ""))) if c.name == TOOL_NAME
                else ToolResult(f"unknown tool {c.name!r}", ok=False) for c in calls]


class CalculatorFormat:
    """ToolFormat for the character tokenizer: `[a+b]` -> calculator(expression="a+b")."""

    def __init__(self, tokenizer):
        vocab = tokenizer.get_vocab()
        missing = [c for c in TOOL_CHARS + list("0123456789") if c not in vocab]
        if missing:
            raise ValueError(f"the tokenizer has no tokens for the calculator's characters {missing}: "
                             "build it with tandem.tasks.arithmetic.build_tokenizer(..., chars=CHARS + TOOL_CHARS)")
        self.ids = {c: vocab[c] for c in TOOL_CHARS + list("0123456789")}
        self.chars = {i: c for c, i in vocab.items() if len(c) == 1}
        self.end_id = self.ids[CALL_CLOSE]

    def parse(self, turn: list[int]) -> list[ToolCall]:
        text = "".join(self.chars.get(t, "\0") for t in turn)
        start = text.rfind(CALL_OPEN)
        if start < 0 or not text.endswith(CALL_CLOSE):
            return []
        return [ToolCall(TOOL_NAME, {"expression": text[start + 1:-1]})]

    def observation(self, results: Sequence[ToolResult]) -> list[int]:
        out = [self.ids[RESULT_OPEN]]
        for r in results:
            ok = r.ok and r.text.isdigit()
            out += [self.ids[c] for c in r.text] if ok else [self.ids[FAILED]]
        return out + [self.ids[RESULT_CLOSE]]


# ---- the built-in tool task (data.builtin_task=mul_tool) -------------------------------------------

DATA_SOURCE = "tandem/arithmetic_tool"  # reward: the answer after the last observation (rules/arithmetic.py)
DIGITS, OP = 3, "*"  # 3-digit products: beyond the small model in one pass, easy to copy into a call
DEMO_FRACTION = 0.25  # warm-start rows that show a calculator call; the rest answer directly


def transcript(prompt: str, answer: str) -> str:
    """What a row that uses the calculator writes: `[a*b]{value}value` (the rollout writes `{value}`)."""
    expression = prompt.rstrip("=")
    return f"{CALL_OPEN}{expression}{CALL_CLOSE}{RESULT_OPEN}{calculate(expression).text}{RESULT_CLOSE}{answer}"


def tool_task_rows(problems: list[tuple[str, str]], split: str, seed: int = 0) -> list[dict]:
    """verl's schema; DEMO_FRACTION of the training rows carry the calculator transcript as
    extra_info.answer, the warm start's target (controller/sft.py)."""
    import random

    from tandem.tasks.arithmetic import to_rows

    rng = random.Random(seed)
    rows = to_rows(problems, split)
    for row, (prompt, answer) in zip(rows, problems):
        row["data_source"] = DATA_SOURCE
        if split == "train" and rng.random() < DEMO_FRACTION:
            row["extra_info"]["answer"] = transcript(prompt, answer)
    return rows
