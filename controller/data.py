"""Prompt data in verl's schema (parquet or jsonl), tokenized, with a Stateful cursor.

Columns: `prompt` (chat messages; data.prompt_key), `data_source` (data.reward_fn_key),
`reward_model.ground_truth`, `extra_info`; one file or a list of files. A tokenizer with a chat template renders the messages with it; one
without (the built-in character tokenizer) takes the messages' contents as the text. With tools
configured (multi_turn.tool_config_path) the chat template is also given their schemas, as verl's
tool agent loop gives them: the model is shown what it may call.
Deliberately not here: writing the built-in task's files (tandem/tasks/), SFT targets
(controller/sft.py).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

import torch

from tandem.config.errors import ConfigError
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


def render_prompt(messages, tokenizer, chat_kwargs: dict | None = None, tools: list[dict] | None = None) -> str:
    if isinstance(messages, str):
        return messages
    if getattr(tokenizer, "chat_template", None):
        kwargs = {**(chat_kwargs or {}), **({"tools": tools} if tools else {})}  # no tools: the call as before
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    return "".join(m["content"] for m in messages)


def prompt_tools(mt) -> list[dict] | None:
    """The tool schemas the prompts show (rollout.multi_turn): those of the tool-config YAML, when
    multi-turn is on with tool services; None otherwise (the built-in calculator's format is taught
    by the warm start, not described in the prompt).

    From the YAML, as verl does, not from the services' ListTools: the data is rendered before any
    service starts and must render the same on a resume whatever a server answers then, and a server
    may serve more tools than the YAML routes to it (the model is shown only what it can reach)."""
    if not mt.enable or mt.tool_config_path is None:
        return None
    from tandem.tools.tool_config import ToolConfigError, load_tool_schemas

    try:
        return load_tool_schemas(mt.tool_config_path)
    except ToolConfigError as e:
        raise ConfigError(f"actor_rollout_ref.rollout.multi_turn.tool_config_path: {e}") from None


@dataclass(frozen=True)
class PromptSpec:
    """How rows become prompts: verl's data.* keys (tandem.config.DataConfig)."""
    max_prompt_length: int
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    filter_overlong_prompts: bool = True
    truncation: str = "error"  # error | left | right | middle (when not filtered)
    chat_kwargs: dict | None = None
    tools: list[dict] | None = None  # function schemas for the chat template (prompt_tools)

    @classmethod
    def of(cls, d, tools: list[dict] | None = None) -> PromptSpec:
        return cls(d.max_prompt_length, d.prompt_key, d.reward_fn_key, d.filter_overlong_prompts, d.truncation,
                   dict(d.apply_chat_template_kwargs), tools)


def _fit(ids: list[int], spec: PromptSpec, where: str) -> list[int] | None:
    """A prompt's ids within max_prompt_length: None (dropped), truncated, or an error."""
    n = spec.max_prompt_length
    if len(ids) <= n:
        return ids
    if spec.filter_overlong_prompts:
        return None
    if spec.truncation == "left":
        return ids[-n:]
    if spec.truncation == "right":
        return ids[:n]
    if spec.truncation == "middle":
        return ids[: n // 2] + ids[len(ids) - (n - n // 2):]
    raise ValueError(f"{where}: the prompt has {len(ids)} tokens > data.max_prompt_length={n} "
                     "(data.truncation=error; set data.filter_overlong_prompts=true to drop such rows)")


def load_examples(path, tokenizer, max_prompt_length: int | None = None, spec: PromptSpec | None = None,
                  max_samples: int = -1, skipped: dict | None = None) -> list[Example]:
    """Tokenize every row of a file or a list of files (first `max_samples` rows, -1: all);
    rows whose prompt exceeds max_prompt_length are dropped (logged) or truncated (`spec`); rows
    whose prompt tokenizes to nothing (no step could generate from it) are skipped (logged with
    their rows). Both are counted in `skipped` ({"overlong": n, "empty_prompt": n}) when given."""
    spec = spec or PromptSpec(max_prompt_length)
    out, dropped, empty, unshown = [], 0, [], 0
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    paths = [path] if isinstance(path, str) else list(path)
    rows = [(p, i, row) for p in paths for i, row in enumerate(read_rows(p))]
    for p, i, row in rows[:max_samples] if max_samples >= 0 else rows:
        for key in (spec.prompt_key, "reward_model"):
            if key not in row:
                raise ValueError(f"{p}: row {i} has no column {key!r}")
        text = render_prompt(row[spec.prompt_key], tokenizer, spec.chat_kwargs, spec.tools)
        if spec.tools:
            unshown += isinstance(row[spec.prompt_key], str) or not getattr(tokenizer, "chat_template", None)
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not tokens:
            empty.append(f"{p}: row {i}")
            continue
        ids = _fit(bos + tokens, spec, f"{p}: row {i}")
        if ids is None:
            dropped += 1
            continue
        out.append(Example(ids, text, str(row["reward_model"]["ground_truth"]),
                           row.get(spec.reward_fn_key) or "", row.get("extra_info") or {}))
    if dropped:
        _log.warning("data.overlong_prompts_dropped", path=paths, dropped=dropped,
                     max_prompt_length=spec.max_prompt_length)
    if empty:
        _log.warning("data.empty_prompts_skipped", path=paths, skipped=len(empty), rows=empty[:20])
    if unshown:  # a plain-text prompt, or a tokenizer without a chat template, has no place for them
        _log.warning("data.tool_schemas_not_shown", path=paths, rows=unshown,
                     why="the prompt is plain text or the tokenizer has no chat template")
    if skipped is not None:
        skipped.update({"overlong": dropped, "empty_prompt": len(empty)})
    if not out:
        raise ValueError(f"{paths}: no usable rows (dropped {dropped} overlong, {len(empty)} whose prompt "
                         "tokenizes to nothing)")
    return out


def load_split(d, which: str, tokenizer, skipped: dict | None = None, tools: list[dict] | None = None) -> list[Example]:
    """data.train_files (which="train") or data.val_files ("val") with data.*'s options ([] when
    unset), showing `tools` (prompt_tools) in chat prompts; `skipped`: see load_examples."""
    files = d.train_files if which == "train" else d.val_files
    if not files:
        return []
    max_samples = d.train_max_samples if which == "train" else d.val_max_samples
    return load_examples(files, tokenizer, spec=PromptSpec.of(d, tools), max_samples=max_samples, skipped=skipped)


def with_epoch_steps(cfg, train_rows: int):
    """cfg with trainer.total_training_steps = total_epochs x full batches of data.train_batch_size in
    one pass over the training rows (verl drops the last partial batch), when steps are unset."""
    t, batch = cfg.trainer, cfg.data.train_batch_size
    if t.total_training_steps is not None:
        return cfg
    if train_rows < batch:
        raise ValueError(f"data.train_files: {train_rows} usable rows < data.train_batch_size={batch}: "
                         "trainer.total_epochs gives no step")
    return replace(cfg, trainer=replace(t, total_training_steps=t.total_epochs * (train_rows // batch)))


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
