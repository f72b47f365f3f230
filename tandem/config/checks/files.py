"""Checks of the files a config names, before anything starts: model weights, tokenizer, data files.

- actor_rollout_ref.model.path holds safetensors weights (its config.json and architecture are
  model_file.check_model's);
- the tokenizer (model.tokenizer_path, else model.path) has tokenizer files, a non-empty vocabulary,
  an EOS token, and every id within the model's vocabulary (config.json's vocab_size);
- data.train_files / data.val_files exist, are parquet or jsonl, and have the prompt column
  (data.prompt_key) and verl's reward_model column.

Each error names the key and the file. Files are only opened when the config names them (the
built-in task writes its own). transformers and pyarrow are imported inside the checks: the config
package stays light for the controller.
"""
from __future__ import annotations

import glob
import json
import os

from tandem.config.errors import check
from tandem.config.schema import TandemConfig

# what a Hugging Face tokenizer directory holds (any one): fast tokenizer, sentencepiece, BPE vocab
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def check_model_files(cfg: TandemConfig) -> None:
    """model.path has safetensors weights; the tokenizer is usable with the model."""
    model = cfg.actor_rollout_ref.model
    if model.path is not None and os.path.isfile(os.path.join(model.path, "config.json")):
        check(bool(glob.glob(os.path.join(model.path, "*.safetensors"))), "actor_rollout_ref.model.path",
              f"{model.path!r} has config.json but no *.safetensors weights")
    if model.tokenizer_path is not None:
        verify_tokenizer(model.tokenizer_path, "actor_rollout_ref.model.tokenizer_path", _vocab_size(cfg))
    elif model.path is not None and os.path.isdir(model.path):
        verify_tokenizer(model.path, "actor_rollout_ref.model.path", _vocab_size(cfg),
                        " (the tokenizer comes from model.path unless actor_rollout_ref.model.tokenizer_path is set)")


def _vocab_size(cfg: TandemConfig) -> int | None:
    path = cfg.actor_rollout_ref.model.path
    if path is None or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    with open(os.path.join(path, "config.json")) as f:
        return json.load(f).get("vocab_size")


def verify_tokenizer(path: str, key: str, vocab_size: int | None, where: str = "") -> None:
    """A tokenizer directory Tandem can run with (see the module docstring)."""
    check(os.path.isdir(path), key, f"{path!r} is not a directory")
    found = [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(path, f))]
    check(bool(found), key, f"{path!r} has no tokenizer files (one of {list(TOKENIZER_FILES)}){where}")
    from tandem.tokenizer import load_tokenizer

    try:
        tok = load_tokenizer(path)
    except (OSError, ValueError, TypeError) as e:
        check(False, key, f"{path!r}: the tokenizer does not load: {str(e).splitlines()[0]}")
    check(len(tok) > 0, key, f"{path!r}: the tokenizer's vocabulary is empty")
    check(tok.eos_token_id is not None, key, f"{path!r}: the tokenizer has no EOS token (eos_token in "
          "tokenizer_config.json): generation could not stop")
    if vocab_size is not None:
        check(len(tok) <= vocab_size, key, f"{path!r}: the tokenizer has {len(tok)} tokens, more than the model's "
              f"vocab_size={vocab_size} (actor_rollout_ref.model.path config.json)")
        special = {n: i for n, i in (("bos", tok.bos_token_id), ("eos", tok.eos_token_id), ("pad", tok.pad_token_id))
                   if i is not None and not 0 <= i < vocab_size}
        check(not special, key, f"{path!r}: special token ids {special} are outside the model's vocabulary "
              f"(vocab_size={vocab_size})")


def data_files(value) -> list[str]:
    """data.train_files / val_files as a list (verl takes a file or a list of files)."""
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def columns_of(path: str) -> list[str]:
    """The columns of a parquet file (its schema) or of a jsonl file (its first row)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with open(path) as f:
        for line in f:
            if line.strip():
                return list(json.loads(line))
    return []


def check_data_files(cfg: TandemConfig) -> None:
    """data.train_files and data.val_files exist, are parquet/jsonl, with the prompt and reward columns."""
    d = cfg.data
    for key, value in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        for path in data_files(value):
            check(os.path.isfile(path), key, f"{path!r} does not exist")
            check(path.endswith(DATA_SUFFIXES), key, f"{path!r}: expected a .parquet or .jsonl file")
            try:
                columns = columns_of(path)
            except (OSError, ValueError) as e:
                check(False, key, f"{path!r} is not readable as {path.rpartition('.')[2]}: {str(e).splitlines()[0]}")
            for column, why in ((d.prompt_key, "data.prompt_key"), ("reward_model", "verl's ground truth column")):
                check(column in columns, key, f"{path!r} has no column {column!r} ({why}); its columns: {columns}")
