"""The actor on several GPUs: TP=2, PP=2 and DP=2 against one GPU, in bf16 over NCCL.

    python bench/actor_parallel.py [--layouts tp1,tp2,pp2,dp2] [--steps 5] [--hang-s 240]
    python bench/actor_parallel.py --moe [--layouts tp1,ep2,tp2sp]   # a Qwen3-MoE: expert parallel 2,
                                                                   # TP=2 with sequence parallelism

With --moe the model is a random Qwen3-MoE built locally with transformers (bench/moe_ep.py's
shape) and trained with the router load-balancing loss (coefficient 0.001); ep2 puts half the
experts on each GPU (DP=2 for the dense weights).

Each layout starts its ranks as processes (one GPU each) that build the actor exactly as
the service does (ActorWorker + RankGroup + ActorFront; bf16 parameters, fp32 main
weights, megatron DDP / optimizer / schedules; PP through megatron's pipeline schedule).
tp1 runs first and saves its initial weights; every other layout loads them (a random
init differs across pipeline stages, as each stage draws only its own layers). Rank 0
drives: log-probs of a fixed batch, one PPO update (2 mini-batches), log-probs after, a
dist checkpoint; then `--steps` timed updates of a per-GPU-constant batch (DP=2 sees
twice the rows) for throughput. A final one-GPU process loads every layout's checkpoint
at TP=1 / PP=1 and compares the updated weights with the one-GPU run's. A rank that
hangs longer than --hang-s prints every thread's stack and exits.
Prints a markdown section (machine, tolerances, scaling efficiency).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = {"tp1": (1, 1, 1, 1), "tp2": (2, 2, 1, 1), "pp2": (2, 1, 2, 1), "dp2": (2, 1, 1, 1),
           "ep2": (2, 1, 1, 2), "tp2sp": (2, 2, 1, 1)}  # world, tp, pp, ep (names ending in sp: SP on)
MOE_SETTINGS = ["actor_rollout_ref.rollout.mode=standalone",
                "actor_rollout_ref.actor.megatron.override_transformer_config.moe_aux_loss_coeff=0.001"]
SHAPE = ["actor_rollout_ref.model.hidden_size=2048", "actor_rollout_ref.model.num_hidden_layers=8",
         "actor_rollout_ref.model.num_attention_heads=16", "actor_rollout_ref.model.num_key_value_heads=4",
         "actor_rollout_ref.model.intermediate_size=8192", "actor_rollout_ref.model.max_position_embeddings=2048"]
ROWS, PROMPT, RESPONSE = 16, 256, 768  # per DP rank in the timed steps
if os.environ.get("TANDEM_BENCH_TINY"):  # a CPU smoke run of this script (layouts without PP)
    SHAPE = ["actor_rollout_ref.model.hidden_size=64", "actor_rollout_ref.model.num_hidden_layers=2",
             "actor_rollout_ref.model.num_attention_heads=4", "actor_rollout_ref.model.num_key_value_heads=2",
             "actor_rollout_ref.model.intermediate_size=128", "actor_rollout_ref.model.max_position_embeddings=64"]
    ROWS, PROMPT, RESPONSE = 8, 8, 8
DTYPE = "float32" if os.environ.get("TANDEM_BENCH_TINY") else "bfloat16"  # megatron's bf16 optimizer needs CUDA


def _unchecked(tok, name: str, hf: str | None):
    """The run-level check refuses PP > 1 (no generation at PP > 1); the actor alone runs it."""
    from omegaconf import OmegaConf

    from tandem.config import TandemConfig

    world, tp, pp, ep = LAYOUTS[name]
    base = OmegaConf.structured(TandemConfig)
    model = [f"actor_rollout_ref.model.path={hf}", *MOE_SETTINGS] if hf else SHAPE
    over = OmegaConf.from_dotlist(model + [
        f"actor_rollout_ref.model.tokenizer_path={tok}", f"actor_rollout_ref.actor.megatron.dtype={DTYPE}",
        f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}",
        f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={pp}",
        f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={ep}",
        f"actor_rollout_ref.actor.megatron.sequence_parallel={name.endswith('sp')}",
        f"services.actor.world_size={world}", "actor_rollout_ref.rollout.n=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={ROWS // 2}",  # fixed batch: 2 optimizer steps
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={ROWS // 4}",
        "actor_rollout_ref.actor.optim.lr=1e-5", "actor_rollout_ref.actor.optim.lr_warmup_steps=0"])
    return OmegaConf.to_object(OmegaConf.merge(base, over))


def make_batch(vocab: int, pad: int, rows: int, seed: int):
    from tandem.data.batch import DataProto

    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(PROMPT // 2, PROMPT + 1, (rows,), generator=g)
    r_len = torch.randint(RESPONSE // 4, RESPONSE + 1, (rows,), generator=g)
    ids = torch.randint(4, vocab, (rows, PROMPT + RESPONSE), generator=g)
    mask = torch.zeros_like(ids)
    for i in range(rows):
        mask[i, PROMPT - p_len[i]: PROMPT + r_len[i]] = 1
    ids = torch.where(mask.bool(), ids, pad)
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT:].clone(),
                              "response_mask": mask[:, PROMPT:].clone(),
                              "advantages": torch.randn(rows, RESPONSE, generator=g)},
                     meta={"temperature": 1.0, "rollout_n": 1})


def build_moe(path: str) -> str:
    """bench/moe_ep.py's Qwen3-MoE shape, random, saved with transformers (nothing downloaded)."""
    from moe_ep import CONFIG
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(**dict(CONFIG, max_position_embeddings=2 * (PROMPT + RESPONSE)))
                        ).save_pretrained(path, safe_serialization=True)
    return path


def rank_main(rank: int, name: str, rdzv: str, out: str, tok: str, steps: int, load_from: str | None,
              init_from: str | None, hf: str | None) -> None:
    world, tp, pp, _ = LAYOUTS[name]
    from transformers import AutoTokenizer

    from tandem.parallel import device
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.services.actor.front import ActorFront
    from tandem.services.actor.worker import ActorWorker
    from tandem.serving.rank_group import RankGroup

    os.environ["LOCAL_RANK"] = str(rank)
    tokenizer = AutoTokenizer.from_pretrained(tok)
    dp = world // (tp * pp)
    cfg = _unchecked(tok, name, hf)
    init_distributed(ParallelConfig.of(cfg.actor_rollout_ref.actor.megatron), rank, world, rdzv, seed=1)
    worker = ActorWorker(cfg, len(tokenizer))
    group = RankGroup({"actor": worker})
    if not group.is_front:
        group.follow()
        return
    actor = ActorFront(group, worker)
    res = {}
    try:
        fixed = make_batch(len(tokenizer), tokenizer.pad_token_id, ROWS, seed=0)
        if load_from:  # every layout's checkpoint, one after the other, at TP=1 / PP=1
            for ckpt in load_from.split(","):
                actor.load(ckpt)
                res[ckpt] = {k: v.float() for k, v in actor.export_weights().items()}
        else:
            if init_from:
                actor.load(init_from)
            else:
                res["init"] = {k: v.float() for k, v in actor.export_weights().items()}
                actor.save(os.path.join(out, "init"))
            seq = fixed.select(tensor_keys=["input_ids", "attention_mask", "responses", "response_mask"])
            old = actor.compute_log_prob(seq)
            res["before"] = old["old_log_probs"]
            res["mask"] = fixed["response_mask"].bool()
            res["metrics"] = actor.update_actor(fixed.union(old)).metrics
            res["after"] = actor.compute_log_prob(seq)["old_log_probs"]
            actor.save(os.path.join(out, "ckpt"))
            big = make_batch(len(tokenizer), tokenizer.pad_token_id, ROWS * dp, seed=1)
            big = big.union(actor.compute_log_prob(big.select(tensor_keys=["input_ids", "attention_mask",
                                                                            "responses", "response_mask"])))
            actor.actor_cfg.ppo_mini_batch_size = ROWS * dp  # timed: one step of ROWS rows per GPU
            actor.update_actor(big)  # warm-up
            device.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                actor.update_actor(big)
            device.synchronize()
            res["step_s"] = (time.perf_counter() - t0) / steps
            res["tokens"] = int(big["attention_mask"].sum())
    finally:
        group.stop()
    torch.save(res, os.path.join(out, "result.pt"))


def launch(name: str, tmp: str, tok: str, steps: int, hang_s: int, load_from: str | None = None,
           init_from: str | None = None, hf: str | None = None) -> dict:
    world = 1 if load_from else LAYOUTS[name][0]
    layout = "tp1" if load_from else name
    out = os.path.join(tmp, name + ("_loaded" if load_from else ""))
    os.makedirs(out, exist_ok=True)
    from tandem.parallel.layout import local_tcp_rendezvous

    rdzv = local_tcp_rendezvous()
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--layout", layout, "--rdzv", rdzv,
                               "--out", out, "--tok", tok, "--steps", str(steps), "--hang-s", str(hang_s)]
                              + (["--load-from", load_from] if load_from else [])
                              + (["--init-from", init_from] if init_from else [])
                              + (["--hf", hf] if hf else []),
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])))
             for r in range(world)]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit(f"layout {name}: a rank exited with {p.returncode}")
    print(f"layout {name}{' (loaded)' if load_from else ''}: done", flush=True)
    return torch.load(os.path.join(out, "result.pt"))


def _describe(hf: str | None) -> str:
    if hf:
        from moe_ep import CONFIG

        return "Qwen3-MoE " + ", ".join(f"{k}={v}" for k, v in CONFIG.items() if k != "max_position_embeddings")
    return " ".join(k.split(".")[-1] + "=" + v for k, v in (x.split("=") for x in SHAPE))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", help="default: tp1,tp2,pp2,dp2 (--moe: tp1,ep2,tp2sp)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rank", type=int)
    p.add_argument("--layout")
    p.add_argument("--rdzv")
    p.add_argument("--out")
    p.add_argument("--tok")
    p.add_argument("--load-from")
    p.add_argument("--init-from")
    p.add_argument("--hang-s", type=int, default=240)
    p.add_argument("--moe", action="store_true", help="a Qwen3-MoE (layouts tp1, ep2, tp2sp)")
    p.add_argument("--hf", help=argparse.SUPPRESS)  # the MoE checkpoint, for the ranks
    a = p.parse_args()
    if a.rank is not None:
        import faulthandler

        faulthandler.dump_traceback_later(a.hang_s, exit=True)  # a hung collective shows where
        return rank_main(a.rank, a.layout, a.rdzv, a.out, a.tok, a.steps, a.load_from, a.init_from, a.hf)
    from tandem.tasks.arithmetic import build_tokenizer

    tmp = tempfile.mkdtemp(prefix="tandem-parallel-")
    tok = build_tokenizer(os.path.join(tmp, "tokenizer"))
    hf = build_moe(os.path.join(tmp, "moe")) if a.moe else None
    names = (a.layouts or ("tp1,ep2,tp2sp" if a.moe else "tp1,tp2,pp2,dp2")).split(",")
    if names[0] != "tp1":
        raise SystemExit("--layouts must start with tp1 (the baseline; its initial weights seed the others)")
    res = {}
    for n in names:  # each layout's figures as soon as it is done (the reload phase comes after)
        init = None if n == "tp1" else os.path.join(tmp, "tp1", "init")
        res[n] = r = launch(n, tmp, tok, a.steps, a.hang_s, init_from=init, hf=hf)
        vs = {k: (r[k] - res["tp1"][k]).abs().max().item() for k in ("before", "after")} if "tp1" in res else {}
        print(f"  {n}: log-prob diff vs tp1 {vs}, pg_loss {r['metrics']['actor/pg_loss']:.5f}, grad_norm "
              f"{r['metrics']['actor/grad_norm']:.4f}, step {r['step_s']:.3f} s, {r['tokens'] / r['step_s']:,.0f} tokens/s",
              flush=True)
    ckpts = [os.path.join(tmp, n, "ckpt") for n in names]
    reloaded = launch("all", tmp, tok, 0, a.hang_s, load_from=",".join(ckpts), hf=hf)
    loaded = {n: reloaded[c] for n, c in zip(names, ckpts)}
    ref, ref_w = res["tp1"], loaded["tp1"]
    import megatron.core

    gpus = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "CPU"
    print(f"\n- machine: {gpus}, torch {torch.__version__}, "
          f"megatron-core {megatron.core.__version__}; model {_describe(hf)}, {DTYPE} params")
    mask = ref["mask"]

    def diff(a, b):  # "mean / max" |a - b| over the response tokens
        d = (a - b).abs()[mask]
        return f"{d.mean().item():.2g} / {d.max().item():.2g}"

    update = max((ref_w[k] - v).abs().max().item() for k, v in ref["init"].items())
    print(f"\n- the update itself (tp1): log-probs moved {diff(ref['after'], ref['before'])} (mean / max), "
          f"weights by at most {update:.3g}")
    print("\n| layout | log-prob diff vs tp1 before update, mean / max | after update | weights: max abs diff "
          "vs tp1, share of elements that differ | pg_loss | grad_norm | step s | tokens/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in names:
        r, w = res[n], loaded[n]
        dw = max((w[k] - ref_w[k]).abs().max().item() for k in ref_w)
        share = sum(int((w[k] != ref_w[k]).sum()) for k in ref_w) / sum(v.numel() for v in ref_w.values())
        print(f"| {n} | {diff(r['before'], ref['before'])} | {diff(r['after'], ref['after'])} | {dw:.3g}, {share:.2%} | "
              f"{r['metrics']['actor/pg_loss']:.5f} | {r['metrics']['actor/grad_norm']:.4f} | {r['step_s']:.3f} | "
              f"{r['tokens'] / r['step_s']:,.0f} |")
    if "dp2" in res:
        eff = (res["dp2"]["tokens"] / res["dp2"]["step_s"]) / (2 * ref["tokens"] / ref["step_s"])
        print(f"\n- DP=2 scaling efficiency (tokens/s at DP=2 / (2 x DP=1), same rows per GPU): {eff:.2f}")


if __name__ == "__main__":
    main()
