"""Write a random-init Qwen2.5-shaped Hugging Face checkpoint (safetensors + config.json + tokenizer).

    python bench/make_checkpoint.py OUT_DIR [--shape 7b|1.5b|0.5b|tiny] [--seed 0] [--shard-gb 2]

For benches that need a model of a real size and no model hub: bench/offload.py (1.5B) and
bench/grpo_7b.py (7B). Weights are bf16, normal(0, 0.02) (norms 1, biases 0), drawn on the GPU when
there is one (a 7B checkpoint in seconds) and written shard by shard, so host memory holds one
shard (`--shard-gb`) at a time. The tokenizer is a word-level one with one token per id of the
model's vocabulary (the built-in task's characters first, then placeholders), so every sampled id
decodes to text. config.json is the Qwen2 family's own (tandem/models/families/qwen2.py).
Prints the seconds it took and the bytes written; an OUT_DIR that already holds a complete
checkpoint of the same shape is kept.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from tandem.models.registry import hf_config_from_shape  # noqa: E402
from tandem.models.spec import ModelShape  # noqa: E402

SHAPES = {  # Qwen2.5 config.json values
    "7b": ModelShape(vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                     num_key_value_heads=4, intermediate_size=18944, max_position_embeddings=32768,
                     rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True, tie_word_embeddings=False),
    "0.5b": ModelShape(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=32768,
                       rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True, tie_word_embeddings=True),
    "1.5b": ModelShape(vocab_size=151936, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, intermediate_size=8960, max_position_embeddings=32768,
                       rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True, tie_word_embeddings=True),
    "tiny": ModelShape(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=512,
                       rope_theta=1e6, rms_norm_eps=1e-6, attention_bias=True, tie_word_embeddings=True),
}
DONE = "checkpoint_complete.json"


def hf_tensors(s: ModelShape):
    """(name, shape, init) of every tensor of a Qwen2ForCausalLM, layer by layer."""
    h, kv = s.hidden_size, s.num_key_value_heads * s.kv_channels
    yield "model.embed_tokens.weight", (s.vocab_size, h), "normal"
    for i in range(s.num_hidden_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,), "ones"
        for proj, rows in (("q_proj", h), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{proj}.weight", (rows, h), "normal"
            yield p + f"self_attn.{proj}.bias", (rows,), "zeros"
        yield p + "self_attn.o_proj.weight", (h, h), "normal"
        yield p + "post_attention_layernorm.weight", (h,), "ones"
        yield p + "mlp.gate_proj.weight", (s.intermediate_size, h), "normal"
        yield p + "mlp.up_proj.weight", (s.intermediate_size, h), "normal"
        yield p + "mlp.down_proj.weight", (h, s.intermediate_size), "normal"
    yield "model.norm.weight", (h,), "ones"
    if not s.tie_word_embeddings:
        yield "lm_head.weight", (s.vocab_size, h), "normal"


def write_tokenizer(out_dir: str, vocab_size: int) -> None:
    """As many tokens as the model has ids. Measured as loaded from `out_dir` (config.json already
    there): transformers may add a special token for the model type (Qwen2's <|endoftext|>), then
    one placeholder fewer."""
    from transformers import AutoTokenizer

    from tandem.tasks.arithmetic import CHARS, SPECIAL, build_tokenizer

    count = vocab_size - len(SPECIAL) - len(CHARS)
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(3):
            tok = build_tokenizer(os.path.join(tmp, f"tokenizer{attempt}"), chars=CHARS + [f"<t{i}>" for i in range(count)])
            for name in os.listdir(tok):
                shutil.copy(os.path.join(tok, name), out_dir)
            extra = len(AutoTokenizer.from_pretrained(out_dir)) - vocab_size
            if extra <= 0:
                return
            count -= extra
    raise RuntimeError(f"could not fit a tokenizer into {vocab_size} ids")


def write_weights(out_dir: str, s: ModelShape, seed: int, shard_bytes: int) -> int:
    from safetensors.torch import save_file

    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    gen = torch.Generator(device=dev).manual_seed(seed)
    shard, size, index, files, total = {}, 0, {}, [], 0

    def flush():
        nonlocal shard, size
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name), metadata={"format": "pt"})
        files.append(name)
        index.update({k: name for k in shard})
        shard, size = {}, 0

    for name, shape, init in hf_tensors(s):
        if init == "normal":
            t = torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).mul_(s.init_std)
        else:
            t = (torch.ones if init == "ones" else torch.zeros)(shape, device=dev)
        shard[name] = t.to(torch.bfloat16).cpu()
        size += shard[name].numel() * 2
        total += shard[name].numel() * 2
        if size >= shard_bytes:
            flush()
    if shard:
        flush()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": index}, f)
    return total


def make_checkpoint(out_dir: str, shape_name: str, seed: int = 0, shard_gb: float = 2.0) -> dict:
    """-> {"path", "bytes", "seconds", "kept"}; keeps a complete checkpoint of this shape."""
    marker = os.path.join(out_dir, DONE)
    if os.path.isfile(marker):
        with open(marker) as f:
            info = json.load(f)
        if info.get("shape") == shape_name and info.get("seed") == seed:
            return {"path": out_dir, "bytes": info["bytes"], "seconds": 0.0, "kept": True}
    t0 = time.perf_counter()
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    s = SHAPES[shape_name]
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config_from_shape(s, "Qwen2ForCausalLM", "bfloat16"), f, indent=2)
    write_tokenizer(out_dir, s.vocab_size)
    total = write_weights(out_dir, s, seed, int(shard_gb * 1024 ** 3))
    with open(marker, "w") as f:
        json.dump({"shape": shape_name, "seed": seed, "bytes": total}, f)
    return {"path": out_dir, "bytes": total, "seconds": time.perf_counter() - t0, "kept": False}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--shape", choices=sorted(SHAPES), default="7b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shard-gb", type=float, default=2.0)
    a = p.parse_args()
    info = make_checkpoint(a.out_dir, a.shape, a.seed, a.shard_gb)
    how = "kept (already complete)" if info["kept"] else f"written in {info['seconds']:.1f} s"
    print(f"{a.shape} checkpoint at {info['path']}: {info['bytes'] / 1e9:.2f} GB of bf16 weights, {how}")


if __name__ == "__main__":
    main()
