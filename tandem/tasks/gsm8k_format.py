"""The built-in addition task rendered in GSM8K's format, as verl's gsm8k preprocessing writes it.

    python -m tandem.tasks.gsm8k_format OUT_DIR [--train-size 400] [--val-size 64] [--seed 1]

writes OUT_DIR/train.parquet, OUT_DIR/val.parquet and OUT_DIR/tokenizer/. Rows follow
verl's `examples/data_preprocess/gsm8k.py`: `data_source` "openai/gsm8k" (so the reward
service scores them with the `#### answer` rule), `prompt` one user message (the
question; verl's 'Let's think step by step...' instruction is left out, the character
model cannot read words), `reward_model.ground_truth` the bare number,
`extra_info.answer` the solution in GSM8K's answer format, `#### N` (the SFT warm start
trains on it when present).

The tokenizer is the built-in character tokenizer extended with "#" and " ", with a
chat template, so prompts go through `apply_chat_template` as they would for a chat
model. Then:

    tandem run data.train_files=OUT/train.parquet data.val_files=OUT/val.parquet \\
        actor_rollout_ref.model.tokenizer_path=OUT/tokenizer data.max_response_length=10
"""
from __future__ import annotations

import argparse
import os

from tandem.tasks.arithmetic import CHARS, build_tokenizer, make_problems

DATA_SOURCE = "openai/gsm8k"
CHARS_GSM8K = CHARS + ["#", " "]
# A template in the usual Hugging Face form: each message's content, then nothing for the
# assistant turn (a real chat model would open its turn here).
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def to_rows(problems: list[tuple[str, str]], split: str) -> list[dict]:
    return [{
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": i, "question": question, "answer": f"#### {answer}"},
    } for i, (question, answer) in enumerate(problems)]


def write_gsm8k_format(out_dir: str, train_size: int = 400, val_size: int = 64, seed: int = 1) -> dict[str, str]:
    """Write the two parquet files and the tokenizer; return their paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    val = make_problems(val_size, seed=seed + 10_000)
    train = make_problems(train_size, seed=seed, exclude={q for q, _ in val})
    paths = {}
    for name, problems in (("train", train), ("val", val)):
        path = os.path.join(out_dir, f"{name}.parquet")
        pq.write_table(pa.Table.from_pylist(to_rows(problems, name)), path + ".tmp")
        os.replace(path + ".tmp", path)
        paths[name] = path
    paths["tokenizer"] = build_tokenizer(os.path.join(out_dir, "tokenizer"), CHARS_GSM8K, CHAT_TEMPLATE)
    return paths


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--train-size", type=int, default=400)
    p.add_argument("--val-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    for name, path in write_gsm8k_format(a.out_dir, a.train_size, a.val_size, a.seed).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
