"""How much of the actor's update, log-prob pass and generation is the output layer (LM head),
in issue 22's small configuration, and what computing it everywhere would cost.

    python bench/lm_head_share.py [--threads 1] [--steps 8]

Rows of real steps (bench/profile_update_call.py: 16 prompts x 8 samples from the actor's own
rollout, the 2.9M Llama of bench/small_step.py). On the actor's model (megatron-core GPTModel,
rows packed as the actor packs them, its PPO loss), per step, alternating:

  kept   the LM head on the positions that predict response tokens (what the actor runs:
         tandem/models/packing.py `selected_outputs`)
  all    the LM head on every position (the same step without the selection)

for the update's forward + loss + backward and for the no-grad log-prob forward, with the
output layer's own time inside each (its forward timed around the call, its backward between
two autograd markers on its output and input: one thread runs autograd in order). Generation:
the rollout engine's whole `generate` against the time in ModelRunner._logits (the final norm
and the head, at the last position of each prefill and at each decode step).
Wall time (perf_counter), medians over the steps. Deliberately not here: the optimizer (the
head's share of the parameters is printed instead) and any change to what is measured.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), HERE]
from profile_update_call import build, step_rows  # noqa: E402

CLOCK = {"fwd": 0.0, "bwd": 0.0, "bwd_start": 0.0}


class _Mark(torch.autograd.Function):
    """Identity; its backward stamps the clock: at the head's output when the head's backward
    starts, at its input when it has finished."""

    @staticmethod
    def forward(ctx, x, where):
        ctx.where = where
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        now = time.perf_counter()
        if ctx.where == "out":
            CLOCK["bwd_start"] = now
        else:
            CLOCK["bwd"] += now - CLOCK["bwd_start"]
        return g, None


def time_head(head) -> None:
    """Wrap the output layer so that CLOCK accumulates its forward and backward seconds."""
    original = head.forward

    def forward(hidden, *args, **kwargs):
        grad = torch.is_grad_enabled() and hidden.requires_grad
        if grad:
            hidden = _Mark.apply(hidden, "in")
        t0 = time.perf_counter()
        out, bias = original(hidden, *args, **kwargs)
        CLOCK["fwd"] += time.perf_counter() - t0
        return (_Mark.apply(out, "out") if grad else out), bias

    head.forward = forward


def model_pass(model, loss_fn, batch, keep: bool, grad: bool) -> dict:
    """One packed forward (+ loss + backward with grad) -> seconds: total, head fwd, head bwd."""
    from tandem.models.packing import PackedOutput, Packing, packed_rope, selected_outputs

    dev = torch.device("cpu")
    CLOCK.update(fwd=0.0, bwd=0.0)
    t0 = time.perf_counter()
    packing = Packing(batch["attention_mask"])
    if keep:
        packing.keep_responses(batch["responses"].shape[1])
    with torch.set_grad_enabled(grad):
        with packed_rope(model, packing, dev), selected_outputs(model, packing, dev):
            out = model(packing.pack(batch["input_ids"]), None, None, packed_seq_params=packing.params(dev))
        loss, _, _ = loss_fn(PackedOutput(out, packing), batch, on_policy=True)
    if grad:
        model.zero_grad(set_to_none=True)
        loss.backward()
    return {"total": time.perf_counter() - t0, "head_fwd": CLOCK["fwd"], "head_bwd": CLOCK["bwd"],
            "positions": out.shape[1]}


def generation(actor, cfg, tok, seeds) -> tuple[list[dict], list]:
    """The steps' rows (step_rows) and, per step, seconds in RolloutWorker.generate_sequences and
    in ModelRunner._logits."""
    from tandem.generation import runner
    from tandem.rollout import worker

    spent = {"head": 0.0, "total": 0.0}

    def timer(cls, name, key):
        original = getattr(cls, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = original(*args, **kwargs)
            spent[key] += time.perf_counter() - t0
            return out
        setattr(cls, name, timed)
        return original

    saved = [(c, n, timer(c, n, k)) for c, n, k in ((runner.ModelRunner, "_logits", "head"),
                                                      (worker.RolloutWorker, "generate_sequences", "total"))]
    try:
        res, rows = [], []
        for s in seeds:
            spent.update(head=0.0, total=0.0)
            rows.append(step_rows(cfg, tok, actor, s))
            res.append(dict(spent))
        return res, rows
    finally:
        for c, n, original in saved:
            setattr(c, n, original)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    from small_step import ModulesUpdate

    from tandem.train import losses

    cfg, tok, actor = build(a.threads)
    mod = ModulesUpdate(cfg, cfg.actor_rollout_ref.model.path, len(tok))
    model, head = mod.model, mod.model.output_layer
    time_head(head)
    loss_fn = functools.partial(losses.ppo_actor_loss, cfg=cfg.actor_rollout_ref.actor, temperature=1.0)
    gen, rows = generation(actor, cfg, tok, range(1 + a.steps))
    gen = gen[1:]  # the first step warms up
    res = {(kind, keep): [] for kind in ("update", "log_prob") for keep in (True, False)}
    for i, (seq, adv) in enumerate(rows):
        batch = seq.union(adv)
        for kind in ("update", "log_prob"):
            for keep in ((True, False) if i % 2 else (False, True)):
                r = model_pass(model, loss_fn, batch, keep, grad=kind == "update")
                if i:  # the first step warms up
                    res[(kind, keep)].append(r)
    med = lambda xs, k: statistics.median(x[k] for x in xs) * 1e3  # noqa: E731
    n_head = sum(q.numel() for q in head.parameters())
    n_all = sum(q.numel() for q in model.parameters())
    tokens = statistics.mean(int(s["attention_mask"].sum()) for s, _ in rows)
    print(f"torch threads {a.threads}, {len(rows[0][0])} rows, {tokens:.0f} real tokens per step (mean), "
          f"vocab {head.weight.shape[0]} x hidden {head.weight.shape[1]}: the head holds {n_head} of "
          f"{n_all} parameters ({n_head / n_all:.2%}); medians of {a.steps} steps, ms\n")
    print("| phase | head on | positions | phase ms | head fwd ms | head bwd ms | head share |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for (kind, keep), xs in res.items():
        head_ms = med(xs, "head_fwd") + med(xs, "head_bwd")
        print(f"| {kind} (fwd+loss{'+bwd' if kind == 'update' else ''}) | {'responses' if keep else 'all'} | "
              f"{statistics.median(x['positions'] for x in xs):.0f} | {med(xs, 'total'):.1f} | "
              f"{med(xs, 'head_fwd'):.2f} | {med(xs, 'head_bwd'):.2f} | {head_ms / med(xs, 'total'):.2%} |")
    print(f"| generation (prefill + 6 decode steps) | last position | | {med(gen, 'total'):.1f} | "
          f"{med(gen, 'head'):.2f} (norm + head) | | {med(gen, 'head') / med(gen, 'total'):.2%} |")
    for kind in ("update", "log_prob"):
        print(f"- {kind}: head on every position / on response positions = "
              f"{med(res[(kind, False)], 'total') / med(res[(kind, True)], 'total'):.3f}x of the phase")


if __name__ == "__main__":
    main()
