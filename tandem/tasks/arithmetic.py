"""The built-in task: character-level addition, `a+b=` -> the sum, a and b in 0..999.

Fixed width (the default, `data.builtin_fixed_width`): operands written with 3 digits and the sum
with 4, zero-padded (`012+345=` -> `0357`), so every digit sits at the same position in every
problem. Unpadded (`12+345=` -> `357`), a model this small first has to find which digits line
up; it learns that after a plateau whose length varies with the seed and the CPU's last bits,
and often only in part (the carry into the tens digit), which RL then cannot repair
(bench/results/learning.md).

It ships its own tokenizer (a Hugging Face fast tokenizer with one token per character,
saved to disk and loaded back with AutoTokenizer like any other) and writes its data as
parquet files in verl's schema, so the run goes through the same paths as user data.
"""
from __future__ import annotations

import os
import random

DATA_SOURCE = "tandem/arithmetic"
SPECIAL = ["<pad>", "<bos>", "<eos>"]
CHARS = list("0123456789+=")


def build_tokenizer(out_dir: str, chars: list[str] | None = None, chat_template: str | None = None) -> str:
    """Write a character tokenizer to out_dir (idempotent); return the directory.

    `chars` defaults to the built-in task's characters; `chat_template` (Jinja, as in
    any Hugging Face tokenizer) is saved with it when given."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if os.path.exists(os.path.join(out_dir, "tokenizer.json")):
        return out_dir
    vocab = {tok: i for i, tok in enumerate(SPECIAL + (chars or CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()  # characters join without spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>",
                                  eos_token="<eos>")
    if chat_template is not None:
        tok.chat_template = chat_template
    tmp = out_dir + ".tmp"
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir)
    return out_dir


def make_problems(count: int, seed: int, exclude: set[str] | None = None,
                  fixed_width: bool = False, digits: int = 3, op: str = "+") -> list[tuple[str, str]]:
    """`count` distinct (prompt, answer) pairs, e.g. ("123+45=", "168"), or with fixed_width
    ("123+045=", "0168"; a product: "012*345=", "004140"). The same seed draws the same operands
    either way."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out = []
    width = 2 * digits if op == "*" else digits + 1
    while len(out) < count:
        a, b = rng.randint(0, 10**digits - 1), rng.randint(0, 10**digits - 1)
        prompt = f"{a:0{digits}d}{op}{b:0{digits}d}=" if fixed_width else f"{a}{op}{b}="
        if prompt in seen:
            continue
        seen.add(prompt)
        value = a * b if op == "*" else a + b
        out.append((prompt, f"{value:0{width}d}" if fixed_width else str(value)))
    return out


def to_rows(problems: list[tuple[str, str]], split: str) -> list[dict]:
    """verl's RL dataset schema."""
    return [{
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": p}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": a},
        "extra_info": {"split": split, "index": i},
    } for i, (p, a) in enumerate(problems)]


def write_dataset(out_dir: str, train_size: int, val_size: int, seed: int,
                  fixed_width: bool = False, digits: int = 3, rows=to_rows, op: str = "+") -> tuple[str, str]:
    """Write train.parquet and val.parquet (disjoint prompts); return their paths. `rows`: the
    problems of a split -> its rows (the tool task's: tandem/tasks/calculator_tool.py)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    task = dict(fixed_width=fixed_width, digits=digits, op=op)
    val = make_problems(val_size, seed=seed + 10_000, **task)
    train = make_problems(train_size, seed=seed, exclude={p for p, _ in val}, **task)
    paths = []
    for name, probs in (("train", train), ("val", val)):
        path = os.path.join(out_dir, f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist(rows(probs, name)), path + ".tmp")
        os.replace(path + ".tmp", path)
        paths.append(path)
    return paths[0], paths[1]
