"""Prompt data in verl's schema (parquet or jsonl), tokenized, with a Stateful cursor.

Columns: `prompt` (chat messages), `data_source`, `reward_model.ground_truth`,
`extra_info`. A tokenizer with a chat template renders the messages with it; one
without (the built-in character tokenizer) takes the messages' contents as the text.
Deliberately not here: writing the built-in task's files (tandem/tasks/), SFT targets
(controller/sft.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from tandem.data.batch import DataProto
from tandem.logging import get_logger

_log = get_logger("controller.data")


@dataclass
class Example:
    prompt_ids: list[int]
    prompt_text: str
    ground_truth: str
    data_source: str
    extra_info: dict


def read_rows(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if path.endswith((".jsonl", ".json")):
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    raise ValueError(f"data file {path!r}: expected .parquet or .jsonl")


def render_prompt(messages, tokenizer) -> str:
    if isinstance(messages, str):
        return messages
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return "".join(m["content"] for m in messages)


def load_examples(path: str, tokenizer, max_prompt_length: int) -> list[Example]:
    """Tokenize every row; rows whose prompt exceeds max_prompt_length are dropped (logged)."""
    out, dropped = [], 0
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    for i, row in enumerate(read_rows(path)):
        for key in ("prompt", "reward_model"):
            if key not in row:
                raise ValueError(f"{path}: row {i} has no column {key!r}")
        text = render_prompt(row["prompt"], tokenizer)
        ids = bos + tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > max_prompt_length:
            dropped += 1
            continue
        out.append(Example(ids, text, str(row["reward_model"]["ground_truth"]),
                           row.get("data_source") or "", row.get("extra_info") or {}))
    if dropped:
        _log.warning("data.overlong_prompts_dropped", path=path, dropped=dropped,
                     max_prompt_length=max_prompt_length)
    if not out:
        raise ValueError(f"{path}: no usable rows (dropped {dropped} overlong)")
    return out


def collate(examples: list[Example], pad_id: int) -> DataProto:
    """Left-padded prompts [B, Lp] plus the text columns the reward needs."""
    width = max(len(e.prompt_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, width - len(e.prompt_ids):] = torch.tensor(e.prompt_ids)
        mask[i, width - len(e.prompt_ids):] = 1
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask}, columns={
        "prompt_text": [e.prompt_text for e in examples],
        "ground_truth": [e.ground_truth for e in examples],
        "data_source": [e.data_source for e in examples],
        "extra_info": [e.extra_info for e in examples]})


class Cursor:
    """Deterministic shuffled epochs over `size` items; Stateful (state_dict/load_state_dict)."""

    def __init__(self, size: int, seed: int, shuffle: bool = True):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next(self, n: int) -> list[int]:
        out = []
        while len(out) < n:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            take = min(n - len(out), self.size - self.position)
            out.extend(self._order[self.position:self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]
        self._order = self._make_order()
