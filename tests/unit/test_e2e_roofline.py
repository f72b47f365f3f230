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
    assert one.decode_bytes > 512 * roof.weight_count(s) * 2
    r = {"matmul_flops": 1e15, "copy_bytes": 4e12}
    t = roof.roofline(one, r, 2)
    assert t["step"] == pytest.approx(t["train"] + t["logprob"] + t["gen"])
    assert t["logprob"] == pytest.approx(2 * one.logprob_flops / 1e15)
