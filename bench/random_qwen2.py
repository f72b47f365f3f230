"""A Qwen2.5-shaped Hugging Face checkpoint with random weights, for runs at real sizes offline.

    python bench/random_qwen2.py 0.5b /tmp/qwen2.5-0.5b-random     # also 1.5b, 7b, 14b

Writes config.json + model.safetensors (bf16; transformers' own random init, nothing
downloaded) and the built-in task's character tokenizer beside them, so
`tandem run actor_rollout_ref.model.path=DIR` trains the built-in task on a model of that shape
(the vocabulary stays the shape's 151,936 rows; the tokenizer uses its first ones).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere


def main(shape: str, out: str) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
    from weight_sync_transports import SHAPES

    from tandem.tasks.arithmetic import build_tokenizer

    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(build_tokenizer(out + ".tokenizer")).save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    print(f"{out}: Qwen2 {shape} shape, {n / 1e9:.2f}B parameters, random bf16 weights, character tokenizer")


if __name__ == "__main__":
    main(*sys.argv[1:3])
