"""The Hermes tool-call format of Qwen2.5-style chat templates, as a multi-turn ToolFormat.

The model writes `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (`</tool_call>` must
be one token: the row stops on it). The observation closes the assistant turn, gives the answers in
a user turn as `<tool_response>` blocks (the template's rendering of role "tool") and opens the
next assistant turn, so the model reads what the chat template would have shown it. An environment's
turn (verl's interaction) is a plain user turn after the model's own end of turn.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from tandem.tools.calls import ToolCall, ToolResult

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


class HermesFormat:
    def __init__(self, tokenizer, max_parallel_calls: int = 1):
        self.tokenizer, self.max_parallel_calls = tokenizer, max_parallel_calls
        ids = tokenizer.convert_tokens_to_ids(["<tool_call>", "</tool_call>"])
        if tokenizer.unk_token_id in ids or None in ids:
            raise ValueError("multi_turn.format=hermes: the tokenizer has no <tool_call> / </tool_call> tokens "
                             "(a Qwen2.5-style chat template has them)")
        self.end_id = ids[1]
        # after a turn ended on EOS: a chat model's EOS is <|im_end|> itself, a base model's is not
        self.turn_close = "\n" if tokenizer.eos_token == "<|im_end|>" else "<|im_end|>\n"

    def parse(self, turn: list[int]) -> list[ToolCall]:
        calls = []
        for body in _CALL.findall(self.tokenizer.decode(turn, skip_special_tokens=False)):
            try:
                call = json.loads(body)
                name, args = call["name"], call.get("arguments", {})
            except (ValueError, KeyError, TypeError):
                continue  # a malformed call: none parsed -> the row is told so
            if isinstance(name, str) and isinstance(args, dict):
                calls.append(ToolCall(name, args))
        return calls[:self.max_parallel_calls]

    def observation(self, results: Sequence[ToolResult]) -> list[int]:
        answers = "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in results)
        text = f"<|im_end|>\n<|im_start|>user\n{answers}<|im_end|>\n<|im_start|>assistant\n"
        return self.tokenizer.encode(text, add_special_tokens=False)

    def turn_text(self, turn: list[int]) -> str:
        return self.tokenizer.decode(turn, skip_special_tokens=True)

    def user_turn(self, text: str) -> list[int]:
        return self.tokenizer.encode(f"{self.turn_close}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n",
                                     add_special_tokens=False)
