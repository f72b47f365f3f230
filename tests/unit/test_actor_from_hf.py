"""`actor_rollout_ref.model.path`: the actor starts from a Hugging Face checkpoint.

A tiny random Llama is built locally with transformers (nothing downloaded), saved beside
the built-in character tokenizer, and used as the run's model.
"""
import json
import subprocess
import sys

import pytest
import torch


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tandem.tasks.arithmetic import build_tokenizer

    d = tmp_path_factory.mktemp("hf_llama")
    tok_dir = build_tokenizer(str(d / "tok"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.2))
    out = d / "model"
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(out)
    return out, model.eval()


def test_actor_log_probs_equal_transformers(megatron_dist, hf_llama_dir):
    from tandem.config import load_config
    from tandem.data.batch import DataProto
    from tandem.services.actor.front import ActorFront

    path, hf_model = hf_llama_dir
    cfg = load_config(None, [f"actor_rollout_ref.model.path={path}"])
    worker = ActorFront.in_process(cfg, tokenizer_len=15)
    ids = torch.tensor([[1, 4, 5, 13, 6, 14, 7, 8, 2], [1, 9, 13, 3, 14, 12, 11, 2, 2]])
    resp = ids[:, -4:]
    batch = DataProto(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                               "responses": resp, "response_mask": torch.ones_like(resp)},
                      meta={"temperature": 1.0})
    ours = worker.compute_log_prob(batch)["old_log_probs"]
    with torch.no_grad():
        logp = torch.log_softmax(hf_model(ids).logits.float(), -1)
    theirs = logp[:, -5:-1].gather(-1, resp[..., None]).squeeze(-1)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)
    # the reference starts as the same checkpoint
    torch.testing.assert_close(worker.compute_ref_log_prob(batch)["ref_log_prob"], ours, atol=0, rtol=0)


def test_tandem_run_from_hf_checkpoint(hf_llama_dir, tmp_path):
    path, _ = hf_llama_dir
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.controller", "run", f"actor_rollout_ref.model.path={path}",
         "trainer.sft.total_steps=2", "trainer.sft.batch_size=8", "trainer.sft.stop_at_accuracy=null",
         "trainer.total_training_steps=1",
         "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", "data.builtin_train_size=100",
         "data.builtin_val_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
         "services.actor.torch_threads=1", "trainer.logger=[jsonl]", f"trainer.default_local_dir={tmp_path}"],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["val_size"] == 8 and summary["val_accuracy_final"] is not None
    config = (run_dir / "config.yaml").read_text()
    assert f"tokenizer_path: {path}" in config  # the tokenizer came from the model directory
