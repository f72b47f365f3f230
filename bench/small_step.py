"""The small configuration of issue 22 for bench/step_overhead.py, and its pure compute.

    SMALL_OVERRIDES    16 prompts x 8 samples of the built-in task (unpadded), 6 new tokens, lr 1e-5 (no
                       warmup), no KL, token-mean, from `build_small_llama`'s checkpoint
    build_small_llama  a 2.9M-parameter Llama (4 layers x 256, 8 heads / 4 KV heads, SwiGLU 688)
                       with the built-in character tokenizer's vocabulary, random weights, saved
                       as a Hugging Face directory with that tokenizer (nothing downloaded)
    ModulesUpdate      the update's arithmetic alone, in this process: the actor's own model
                       (megatron-core GPTModel from the same checkpoint, the rows packed as the
                       actor packs them, the LM head on response positions, the actor's PPO loss)
                       in a plain torch loop: forward, backward, clip_grad_norm_ 1.0,
                       torch.optim.AdamW. No DDP buffers, megatron optimizer, schedule, rank
                       group, worker thread, servicer, codec or gRPC: what the UpdateActor call
                       adds to the math is the difference.
    HFUpdate           the same update as a single-process trainer runs it: transformers'
                       LlamaForCausalLM on the same checkpoint and rows, padded (it computes the
                       padding positions too), the same PPO loss (token-mean, clip 0.2, old
                       log-probs = this forward's when the batch has none).

Deliberately not here: timing policy and reports (step_overhead.py).
"""
from __future__ import annotations

import os

import torch

SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             intermediate_size=688, max_position_embeddings=32, rms_norm_eps=1e-5)
# the task as it was written: unpadded `12+345=` (the default is now fixed width)
SMALL_OVERRIDES = ["data.builtin_fixed_width=false",
                   "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                   "actor_rollout_ref.rollout.n=8", "data.max_response_length=6",
                   "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
                   "actor_rollout_ref.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false",
                   "actor_rollout_ref.actor.loss_agg_mode=token-mean"]


def build_small_llama(out_dir: str, seed: int = 0) -> tuple[str, int]:
    """-> (the checkpoint directory, its parameter count)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tandem.tasks.arithmetic import build_tokenizer

    tok = AutoTokenizer.from_pretrained(build_tokenizer(os.path.join(out_dir, "tokenizer")))
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **SHAPE))
    path = os.path.join(out_dir, "llama-2.9m")
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path, sum(p.numel() for p in model.parameters())


class HFUpdate:
    """One PPO update per `step(batch)` on the Hugging Face model, in this process."""

    def __init__(self, path: str, lr: float, clip_ratio: float = 0.2, temperature: float = 1.0):
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        self.clip, self.temperature = clip_ratio, temperature

    def step(self, batch) -> float:
        """-> the PPO loss. Rows: [left-padded prompt | right-padded response] as the actor gets them."""
        ids, mask, mask_r = batch["input_ids"], batch["attention_mask"], batch["response_mask"].float()
        r = batch["responses"].shape[1]
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        logp = torch.log_softmax(logits[:, -r - 1:-1].float() / self.temperature, -1)
        logp = logp.gather(-1, batch["responses"][..., None]).squeeze(-1)
        old = batch["old_log_probs"] if "old_log_probs" in batch.tensors else logp.detach()
        ratio = torch.exp(logp - old)
        adv = batch["advantages"]
        per_token = -torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        loss = (per_token * mask_r).sum() / mask_r.sum().clamp(min=1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return float(loss.detach())


class ModulesUpdate:
    """One PPO update per `step(batch)` on the actor's model, plain torch loop, in this process
    (megatron's parallel state must be initialised: one rank)."""

    def __init__(self, cfg, path: str, tokenizer_len: int):
        import functools

        from tandem.convert.hf_load import load_hf_weights
        from tandem.models.build import build_gpt_model
        from tandem.models.shape_from_config import model_shape
        from tandem.train import losses

        actor = cfg.actor_rollout_ref.actor
        shape = model_shape(cfg.actor_rollout_ref.model, tokenizer_len)
        self.model = build_gpt_model(shape)
        load_hf_weights(self.model, path, shape, 0, 1)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=actor.optim.lr, betas=tuple(actor.optim.betas),
                                     eps=1e-8, weight_decay=actor.optim.weight_decay)
        self.loss_fn = functools.partial(losses.ppo_actor_loss, cfg=actor, temperature=1.0)

    def step(self, batch) -> float:
        from tandem.models.packing import PackedOutput, Packing, packed_rope, selected_outputs

        dev = torch.device("cpu")
        packing = Packing(batch["attention_mask"])
        packing.keep_responses(batch["responses"].shape[1])
        with packed_rope(self.model, packing, dev), selected_outputs(self.model, packing, dev):
            out = self.model(packing.pack(batch["input_ids"]), None, None, packed_seq_params=packing.params(dev))
        loss, _, _ = self.loss_fn(PackedOutput(out, packing), batch, on_policy="old_log_probs" not in batch.tensors)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return float(loss.detach())
