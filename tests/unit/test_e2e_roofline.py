"""bench/e2e_roofline.py's counts: the weights it counts are the Qwen2.5 checkpoints' matmul weights
(transformers' own model, on the meta device), and a step's work grows as it must with its lengths."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import e2e_roofline as roof  # noqa: E402
from weight_sync_transports import SHAPES  # noqa: E402


@pytest.mark.parametrize("name", ["0.5b", "1.5b"])
def test_weight_count_is_the_checkpoints_matmul_weights(name):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPES[name]))
    matmul = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2)
    assert roof.weight_count(SHAPES[name]) == matmul  # biases and norms (< 0.1%) are not matmuls


def test_step_work_scales_with_rows_and_lengths():
    s = SHAPES["0.5b"]
    m = {"prompt_length/mean": 192, "response_length/mean": 512, "response_length/max": 512}
    one, two = roof.step_work(s, m, 256, 1, 2), roof.step_work(s, m, 512, 1, 2)
    assert two.train_flops == pytest.approx(2 * one.train_flops)
    assert one.train_flops == pytest.approx(3 * one.logprob_flops)
    # the forward is at least 2 x the layers' weights per token plus the head at response positions
    body = 2 * s["num_hidden_layers"] * roof.layer_params(s) * 256 * (192 + 512)
    assert one.logprob_flops > body + 2 * s["vocab_size"] * s["hidden_size"] * 256 * 512
    # 512 decode steps each read the weights once, and a KV cache that grows
    assert one.weight_bytes == 512 * roof.weight_count(s) * 2
    assert two.kv_bytes == pytest.approx(2 * one.kv_bytes) and one.kv_bytes > 0
    r = {"matmul_flops": 1e15, "copy_bytes": 4e12}
    t = roof.roofline(one, r, 2)
    assert t["step"] == pytest.approx(t["train"] + t["logprob"] + t["gen"])
    assert t["logprob"] == pytest.approx(2 * one.logprob_flops / 1e15)


def test_decode_gemms_count_at_the_slower_of_bytes_and_flops():
    s = SHAPES["0.5b"]
    m = {"prompt_length/mean": 192, "response_length/mean": 512, "response_length/max": 512}
    r = {"matmul_flops": 7e14, "copy_bytes": 4e12}
    few, many = roof.step_work(s, m, 8, 1, 2), roof.step_work(s, m, 512, 1, 2)
    # 8 rows: reading the weights dominates, and FLOPs change nothing
    t = roof.roofline(few, r, 2)
    assert few.decode_flops / 7e14 < few.weight_bytes / 4e12
    assert t["gen"] == pytest.approx(t["gen_bytes_only"])
    # 512 rows: a decode step's GEMMs are 0.5 TFLOP, slower than reading 1 GB of weights
    t = roof.roofline(many, r, 2)
    per_step = many.decode_flops / 512
    assert per_step == pytest.approx(512 * 2 * roof.weight_count(s), rel=0.01)
    assert t["gen"] == pytest.approx((many.kv_bytes / 4e12) + many.decode_flops / 7e14
                                     + many.prefill_flops / 7e14)
    assert t["gen"] > t["gen_bytes_only"] and t["step_bytes_only"] < t["step"]


def test_shared_prompts_count_each_prompt_once_per_group():
    """share_prompts: the training and log-prob passes compute a prompt once for its n rows, attention
    included; generation's work is unchanged. The causal attention split (prompt / response tokens)
    adds up to the unshared count's context^2 / 2."""
    s = SHAPES["0.5b"]
    p, r, rows, n = 192, 512, 512, 8
    m = {"prompt_length/mean": p, "response_length/mean": r, "response_length/max": r}
    plain, shared = roof.step_work(s, m, rows, 1, 2), roof.step_work(s, m, rows, 1, 2, shared=n)
    layers, h = s["num_hidden_layers"], s["hidden_size"]
    body, head = 2 * layers * roof.layer_params(s), 2 * s["vocab_size"] * h
    ctx = p + r
    assert plain.logprob_flops == pytest.approx(rows * (ctx * (body + 2 * layers * h * ctx) + r * head))
    prompt = p * body + 2 * layers * h * p * p  # one prompt's layer and attention FLOPs
    assert plain.logprob_flops - shared.logprob_flops == pytest.approx(rows * (1 - 1 / n) * prompt)
    assert shared.train_flops == pytest.approx(3 * shared.logprob_flops)
    assert (shared.kv_bytes, shared.decode_flops, shared.prefill_flops) == (
        plain.kv_bytes, plain.decode_flops, plain.prefill_flops)
