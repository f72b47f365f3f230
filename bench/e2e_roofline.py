"""The roofline of one GRPO step for bench/e2e_step.py: rates measured here, FLOPs and bytes counted.

    rates(shape, dtype)   the matmul rate at the model's own GEMM shapes (8192 tokens through the
                          QKV, output, MLP and LM-head projections, forward GEMMs, median of 5)
                          and the device copy rate of a tensor the size of the weights
                          ((read + write) bytes / s), both in this process, before the run
    step_work(shape, m)   a step's training FLOPs, log-prob FLOPs per pass, and generation's
                          bytes (weights and KV cache read per decode step), decode GEMM FLOPs
                          and prefill FLOPs, from the step's logged means (prompt_length/mean,
                          response_length/mean)
    roofline(work, r)     seconds at those rates: training + log-prob passes at the matmul rate;
                          generation: the KV cache at the copy rate, the decode GEMMs at the
                          slower of reading their weights and their FLOPs, prefill at the matmul rate

FLOPs per token: 2 x the matmul parameters of the layers (embedding lookups are not matmuls)
+ causal attention 2 x 2 x layers x hidden x its position (prompt tokens p / 2 on average, response
tokens p + r / 2; a shared prompt counts once per group), and the
LM head (2 x vocab x hidden) at response positions only (the actor runs it only there);
training is 3x the forward (forward + backward). Means per row stand in for each row's
lengths (attention's quadratic term is slightly under-counted when lengths vary).
A decode step's GEMMs are bandwidth-bound at a few rows and compute-bound at hundreds (a 0.5B
model at 512 rows: 0.25 ms to read the weights, 0.72 ms of FLOPs on an H200), so they count at
the slower of the two; `gen_bytes_only` keeps the earlier figure (every decode byte at the copy
rate, FLOPs ignored), which under-states generation at large batches.

Deliberately not here: running steps, reports (e2e_step.py).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


def _sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def layer_params(s: dict) -> int:
    """Matmul parameters of one transformer layer (QKV, output, SwiGLU MLP; biases left out)."""
    h, heads, kv = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"]
    d = h // heads
    return h * (heads + 2 * kv) * d + heads * d * h + 3 * h * s["intermediate_size"]


def weight_count(s: dict) -> int:
    emb = s["vocab_size"] * s["hidden_size"]
    return s["num_hidden_layers"] * layer_params(s) + emb * (1 if s.get("tie_word_embeddings") else 2)


def rates(s: dict, dev: str, dtype: torch.dtype, tokens: int = 8192) -> dict[str, float]:
    """{'matmul_flops': FLOP/s at the model's GEMMs, 'copy_bytes': bytes/s (read + write)}."""
    h, heads, kv, f = s["hidden_size"], s["num_attention_heads"], s["num_key_value_heads"], s["intermediate_size"]
    d = h // heads
    shapes = [(h, (heads + 2 * kv) * d), (heads * d, h), (h, 2 * f), (f, h), (h, s["vocab_size"])]
    mats = [(torch.randn(tokens, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype))
            for k, n in shapes]
    flops = sum(2 * tokens * k * n for k, n in shapes)
    times = []
    for i in range(6):
        _sync(dev)
        t0 = time.perf_counter()
        for a, b in mats:
            a @ b
        _sync(dev)
        if i:  # the first round warms up (cuBLAS handles, heuristics)
            times.append(time.perf_counter() - t0)
    del mats
    n = weight_count(s)
    src = torch.empty(n, device=dev, dtype=dtype)
    dst = torch.empty_like(src)
    copies = []
    for i in range(6):
        _sync(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(dev)
        if i:
            copies.append(time.perf_counter() - t0)
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    if dev == "cuda":
        torch.cuda.empty_cache()
    return {"matmul_flops": flops / statistics.median(times), "copy_bytes": nbytes / statistics.median(copies)}


@dataclass
class StepWork:
    train_flops: float  # one update over the batch (all epochs)
    logprob_flops: float  # one log-prob pass over the batch
    weight_bytes: float  # the weights, read once per decode step
    kv_bytes: float  # the KV cache of every row so far, read once per decode step
    decode_flops: float  # the decode steps' GEMMs (layers + LM head) over every generated token
    prefill_flops: float


def step_work(s: dict, m: dict, rows: int, epochs: int, bytes_per_value: int, shared: int = 1) -> StepWork:
    """m: one step's logged metrics (prompt_length/mean, response_length/mean, response_length/max).
    `shared`: rows per prompt computed once in the training and log-prob passes (actor.share_prompts:
    rollout.n; 1: every row computes its prompt)."""
    h, layers = s["hidden_size"], s["num_hidden_layers"]
    p, r = m["prompt_length/mean"], m["response_length/mean"]
    body = 2 * layers * layer_params(s)
    head = 2 * s["vocab_size"] * h
    # causal attention: a prompt token sees p / 2 keys on average, a response token p + r / 2
    prompt = p * (body + 2 * 2 * layers * h * p / 2)
    response = r * (body + 2 * 2 * layers * h * (p + r / 2) + head)
    forward = rows * response + rows / shared * prompt
    kv_per_token = 2 * layers * s["num_key_value_heads"] * (h // s["num_attention_heads"]) * bytes_per_value
    steps = int(m.get("response_length/max", r))
    weights = weight_count(s) * bytes_per_value
    # decode step t reads every weight once and the KV cache of every row so far (p + t tokens)
    kv = sum(rows * (p + t) * kv_per_token for t in range(steps))
    prefill = rows * p * (body + 2 * 2 * layers * h * p / 2) + rows * head
    decode_flops = rows * r * (body + head)
    return StepWork(3 * forward * epochs, forward, steps * weights, kv, decode_flops, prefill)


def roofline(w: StepWork, r: dict, logprob_passes: int) -> dict[str, float]:
    train = w.train_flops / r["matmul_flops"]
    logprob = logprob_passes * w.logprob_flops / r["matmul_flops"]
    bw, rate = r["copy_bytes"], r["matmul_flops"]
    prefill = w.prefill_flops / rate
    gen = w.kv_bytes / bw + max(w.weight_bytes / bw, w.decode_flops / rate) + prefill
    bytes_only = (w.kv_bytes + w.weight_bytes) / bw + prefill
    return {"train": train, "logprob": logprob, "gen": gen, "step": train + logprob + gen,
            "gen_bytes_only": bytes_only, "step_bytes_only": train + logprob + bytes_only}
