"""Tokens/s and MFU of the actor's own update path, beside a plain megatron-core LM step.

    python bench/actor_update_mfu.py [--shapes 0.5b,1.5b] [--steps 4] [--micro-batches 1,8]

One GPU, bf16 parameters with fp32 main weights (megatron's optimizer), megatron DDP,
SDPA attention, transformer layers torch.compile'd as the service does on GPUs (variant
`default`; `eager` without; both paths of a variant share the model). For each model
shape (Qwen2.5-0.5B / 1.5B: GQA, tied embeddings, vocab 151936, random weights) and the
same token budget:

  actor   what the actor service runs for UpdateActor: tandem.train.step.train_steps over
          tandem.train.losses.ppo_actor_loss (clipped PPO on variable-length responses,
          fp32 vocab-parallel log-probs and entropy; the batch comes in verl's padded
          [prompt | response] layout and each micro-batch runs packed without padding,
          tandem/models/packing.py), megatron's schedule, DDP and optimizer step;
  plain   a plain megatron-core language-model step on the same model: GPTModel's own
          loss (labels), full causal rows without padding, same optimizer step.

MFU = model FLOPs of the real (non-pad) tokens / step time / the bf16 matmul rate
measured in this run (8192^3 GEMMs). FLOPs per token: 6 x (matmul params incl. the LM
head) + causal attention 6 x layers x hidden x context (the usual count, verl's too).
The actor needs the LM head only where it predicts a response token and runs it only
there, so a second, stricter column counts the head's FLOPs at those positions alone
(for the plain step both counts are equal). `--micro-batches K`: each optimizer step
covers K micro-batches of that batch size (gradients accumulated, as UpdateActor runs a
PPO mini-batch of ppo_mini_batch_size rows in micro-batches of
ppo_micro_batch_size_per_gpu): the optimizer's fixed cost per step is spread over K
micro-batches, as in real runs, where K is tens to hundreds. K = 1 (one optimizer step
per micro-batch) is the worst case. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import platform
import time

import torch

SHAPES = {  # Qwen2.5 configs; batch x sequence as in the reference numbers
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, batch=8),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, batch=4),
}
VOCAB, SEQ, PROMPT = 151936, 2048, 1024


def matmul_rate() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 20
    for _ in range(n):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192 ** 3 * n / (time.perf_counter() - t0)


def build(name: str, compiled: bool = True):
    """The shape's model, DDP and optimizer; transformer layers torch.compile'd when `compiled`
    (the service's default on GPUs, actor.use_torch_compile)."""
    from tandem.config import OptimConfig
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.train.optim import Optimizer, wrap_ddp

    s = {k: v for k, v in SHAPES[name].items() if k != "batch"}
    shape = ModelShape(vocab_size=VOCAB, max_position_embeddings=32768, rope_theta=1e6,
                       attention_bias=True, tie_word_embeddings=True, **s)
    model = build_gpt_model(shape, params_dtype=torch.bfloat16)
    if compiled:
        from tandem.models.compile import compile_layers
        compile_layers(model)
    ddp = wrap_ddp(model)
    return shape, model, ddp, Optimizer(ddp, OptimConfig(lr=1e-7, clip_grad=1.0))


def actor_batch(batch: int, seed: int = 0):
    """[left-padded prompt | right-padded response]: prompts 512..1024, responses 256..1024."""
    from tandem.data.batch import DataProto

    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(PROMPT // 2, PROMPT + 1, (batch,), generator=g)
    r_len = torch.randint((SEQ - PROMPT) // 4, SEQ - PROMPT + 1, (batch,), generator=g)
    ids = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    mask = torch.zeros(batch, SEQ, dtype=torch.long)
    for i in range(batch):
        mask[i, PROMPT - p_len[i]: PROMPT + r_len[i]] = 1
    resp_mask = mask[:, PROMPT:].clone()
    b = DataProto(tensors={
        "input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:].clone(),
        "response_mask": resp_mask,
        "old_log_probs": -torch.rand(batch, SEQ - PROMPT, generator=g) * 5,
        "advantages": torch.randn(batch, SEQ - PROMPT, generator=g)}, meta={"temperature": 1.0})
    b.meta["loss_units"] = int(resp_mask.sum())
    return b, [int(x) for x in (p_len + r_len)], int(r_len.sum())


def flops(shape, lengths: list[int], head_tokens: int | None = None) -> float:
    """Training FLOPs (forward + backward); the LM head counted on head_tokens positions
    (default: every token)."""
    h, L, f = shape.hidden_size, shape.num_hidden_layers, shape.intermediate_size
    kv = shape.num_key_value_heads * h // shape.num_attention_heads
    trunk_params = L * (h * (h + 2 * kv) + h * h + 3 * h * f)
    head = h * shape.vocab_size * (sum(lengths) if head_tokens is None else head_tokens)
    attention = sum(6 * L * h * n * n for n in lengths)  # fwd QK^T + AV (2 x 2 n^2 h / 2 causal) x 3
    return 6 * trunk_params * sum(lengths) + 6 * head + attention


def timed(fn, steps: int) -> float:
    fn()  # warm-up (allocations, autotuning)
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def actor_step_fn(ddp, opt, batch, rows: int):
    import functools

    from tandem.config import ActorConfig
    from tandem.train import losses
    from tandem.train.step import train_steps

    loss_fn = functools.partial(losses.ppo_actor_loss, cfg=ActorConfig(entropy_coeff=0.0), temperature=1.0)
    return lambda: train_steps(ddp, opt, [batch], rows, loss_fn, "grad_norm", "lr")


def plain_step_fn(ddp, opt, rows: int, micro: int = 1):
    """GPTModel's own LM loss on full causal rows, megatron's schedule, same optimizer step;
    `micro` micro-batches of `rows` rows per step."""
    ids = [torch.randint(0, VOCAB, (rows, SEQ), device="cuda") for _ in range(micro)]

    def plain_step():
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, model):
            tokens = next(data_iterator)
            per_token = model(tokens[:, :-1], None, None, labels=tokens[:, 1:])  # [b, s] fp32 CE

            def loss_func(out):
                return out.sum(), torch.tensor(out.numel(), dtype=torch.int, device="cuda"), {}
            return per_token, loss_func

        ddp.train()
        opt.zero_grad()
        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter(ids), model=ddp,
                                    num_microbatches=micro, seq_length=SEQ - 1, micro_batch_size=rows)
        opt.step()
    return plain_step


def run_shape(name: str, steps: int, peak: float, variant: str, micros: list[int]) -> list[dict]:
    from tandem.models import build as model_build

    model_build.FUSE_ON_GPU = variant != "unfused"
    torch.cuda.empty_cache()  # the previous variant's model is gone
    shape, model, ddp, opt = build(name, compiled=variant != "eager")
    rows = SHAPES[name]["batch"]
    out = []
    for micro in micros:
        batch, lengths, response_tokens = actor_batch(rows * micro)  # `micro` micro-batches of `rows`
        actor_step = actor_step_fn(ddp, opt, batch, rows)
        plain_step = plain_step_fn(ddp, opt, rows, micro)
        out += [measure(name, variant, kind, fn, steps, peak, shape, micro, rows, lens, head)
                for kind, fn, lens, head in (("plain", plain_step, [SEQ - 1] * rows * micro, None),
                                             ("actor", actor_step, lengths, response_tokens))]
    return out


def measure(name, variant, kind, fn, steps, peak, shape, micro, rows, lens, head) -> dict:
    torch.cuda.reset_peak_memory_stats()
    dt = timed(fn, steps)
    toks = sum(lens)
    return dict(shape=name, kind=kind, variant=variant, micro=micro,
                batch=f"{micro} x {rows} x {SEQ}" if micro > 1 else f"{rows} x {SEQ}", tokens=toks,
                step_s=dt, tok_s=toks / dt, mfu=flops(shape, lens) / dt / peak,
                mfu_needed=flops(shape, lens, head) / dt / peak,
                padded_share=1 - toks / (micro * rows * SEQ) if kind == "actor" else 0.0,
                peak_gib=torch.cuda.max_memory_allocated() / 2 ** 30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--variants", default="default",
                   help="comma list: default (as the service runs: transformer layers torch.compile'd, "
                        "tandem/models/compile.py), eager (not compiled), unfused (compiled, without "
                        "megatron's SwiGLU/bias-dropout-add fusions)")
    p.add_argument("--micro-batches", default="1",
                   help="comma list: micro-batches per optimizer step (one row each in the table)")
    args = p.parse_args()
    from tandem.parallel.layout import ParallelConfig, init_distributed

    micros = [int(m) for m in args.micro_batches.split(",")]
    init_distributed(ParallelConfig(), 0, 1, seed=1)
    peak = matmul_rate()
    rows = [r for name in args.shapes.split(",") for v in args.variants.split(",")
            for r in run_shape(name, args.steps, peak, v, micros)]
    import megatron.core

    print(f"\n- machine: {torch.cuda.get_device_name()}, torch {torch.__version__}, megatron-core "
          f"{megatron.core.__version__}, {platform.python_version()}")
    print(f"- bf16 matmul rate measured (8192^3): {peak / 1e12:.0f} TFLOP/s")
    if set(args.variants.split(",")) - {"eager"}:
        from torch._dynamo.utils import counters
        print(f"- compiled layers: {counters['stats']['unique_graphs']} graphs, "
              f"{sum(counters['graph_break'].values())} graph breaks {dict(counters['graph_break'])}")
    print("\n| shape | variant | path | batch | real tokens | step s | tokens/s | MFU | MFU, LM head where needed | pad share of the padded input | peak GiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['shape']} | {r['variant']} | {r['kind']} | {r['batch']} | {r['tokens']} | {r['step_s']:.3f} | "
              f"{r['tok_s']:,.0f} | {r['mfu']:.3f} | {r['mfu_needed']:.3f} | {r['padded_share']:.2f} | {r['peak_gib']:.1f} |")
    for name in args.shapes.split(","):
        for v in args.variants.split(","):
            for m in micros:
                a, b = (next(r for r in rows if r["shape"] == name and r["kind"] == kind and r["variant"] == v
                             and r["micro"] == m) for kind in ("actor", "plain"))
                print(f"- {name} {v} {m} micro-batch(es) per step: actor/plain MFU ratio {a['mfu'] / b['mfu']:.2f}")


if __name__ == "__main__":
    main()
