"""Host work of the actor's log-prob and update passes at bench/e2e_step.py's batch shape, on the CPU.

    python bench/host_prep.py [--rows 512] [--micro 16 | --max-tokens N] [--repeats 5]
    TANDEM_BENCH_TREE=/tmp/main python bench/host_prep.py      # another checkout's code (before / after)

On a GPU the model's kernels run asynchronously, so what the host does before a call's first
forward leaves the GPU idle (issue 23's trace: a 249 ms gap at the start of the first log-prob
call). This measures, with a CPU-time clock (time.thread_time, torch at 1 thread: figures do not
grow when other jobs take the cores), on e2e_step's rows (64 prompts x 8 samples, prompts of
128-256 tokens left-padded to 264, responses of 200-512 tokens right-padded to 512) through
tandem.train.schedule.run_schedule with a one-layer model of hidden size 16 (the model's time is
not the point; its packing and loss-side index work per row and micro-batch are):

- packing: the packed layouts of one call's micro-batches (Packing + keep_responses);
- to first forward: host time from the call's start to its first model forward, with
  actor.overlap_host_work off (all packings first) and on (the first micro-batch's only);
- the whole forward-only call (the model included), off and on.

Prints ms per call (median of --repeats), and each "on" figure as a ratio of the "off" one.
Deliberately not here: the GPU (bench/e2e_step.py measures the step there).
"""
from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.abspath(os.environ.get("TANDEM_BENCH_TREE") or os.path.join(HERE, ".."))]

VOCAB, PROMPT_W, RESPONSE_W, N = 64, 264, 512, 8


def batch(rows: int):
    from tandem.data.batch import DataProto

    g = torch.Generator().manual_seed(0)
    plen = torch.randint(128, 257, (rows // N,), generator=g).repeat_interleave(N)
    rlen = torch.randint(200, RESPONSE_W + 1, (rows,), generator=g)
    ids = torch.randint(2, VOCAB, (rows, PROMPT_W + RESPONSE_W), generator=g)
    ids[:, :PROMPT_W] = ids[::N, :PROMPT_W].repeat_interleave(N, 0)  # a group's rows share the prompt
    cols = torch.arange(PROMPT_W + RESPONSE_W)[None]
    mask = ((cols >= PROMPT_W - plen[:, None]) & (cols < PROMPT_W + rlen[:, None])).long()
    ids = ids * mask
    return DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, PROMPT_W:],
                              "response_mask": mask[:, PROMPT_W:]})


def model():
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.parallel.layout import ParallelConfig, init_distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed(ParallelConfig(), 0, 1, f"tcp://127.0.0.1:{port}", seed=1)
    shape = ModelShape(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=1, intermediate_size=32, max_position_embeddings=1024, init_std=0.3)
    return build_gpt_model(shape).eval()


def loss_fn(lazy: bool):
    from tandem.train import losses, schedule

    @schedule.reads_responses_only
    def fn(output, mb):
        lp, _ = losses.response_log_probs(output, mb, 1.0, with_entropy=False)
        return output.new_zeros(()), 0, {"log_probs": lp.float()}

    if lazy and hasattr(schedule, "overlaps_host_work"):
        schedule.overlaps_host_work(fn, True)
    return fn


def packing_ms(micro) -> float:
    from tandem.models.packing import Packing

    t = time.thread_time()
    for mb in micro:
        Packing(mb["attention_mask"]).keep_responses(mb["responses"].shape[1])
    return (time.thread_time() - t) * 1e3


def call_ms(m, micro, lazy: bool) -> tuple[float, float]:
    """(host ms to the first forward, host ms of the whole call)."""
    from tandem.train.schedule import run_schedule

    first = []
    hook = m.register_forward_pre_hook(lambda *_: first.append(time.thread_time()) if not first else None)
    try:
        t = time.thread_time()
        with torch.no_grad():
            run_schedule(m, micro, loss_fn(lazy), forward_only=True)
        return (first[0] - t) * 1e3, (time.thread_time() - t) * 1e3
    finally:
        hook.remove()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=0, help="micro-batches of up to N tokens instead (use_dynamic_bsz)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    from tandem.train.microbatch import MicroBatching, micro_batches

    split = MicroBatching(a.max_tokens) if a.max_tokens else a.micro
    rows = batch(a.rows)
    m, micro = model(), micro_batches(rows, split)
    by_rows = micro_batches(rows, a.micro)  # --max-tokens: the packing at --micro rows too, same run
    has_lazy = hasattr(__import__("tandem.train.schedule", fromlist=["x"]), "overlaps_host_work")
    call_ms(m, micro, False)  # warm-up
    res = {"packing": [], "packing_rows": [], "first_off": [], "first_on": [], "call_off": [], "call_on": []}
    for _ in range(a.repeats):
        res["packing"].append(packing_ms(micro))
        res["packing_rows"].append(packing_ms(by_rows) if a.max_tokens else 0.0)
        for mode in ("off", "on"):
            f, c = call_ms(m, micro, mode == "on")
            res[f"first_{mode}"].append(f)
            res[f"call_{mode}"].append(c)
    med = {k: statistics.median(v) for k, v in res.items()}
    what = f"{a.max_tokens} tokens" if a.max_tokens else f"{a.micro}"
    print(f"# host work of one log-prob call: {a.rows} rows, micro-batches of {what} ({len(micro)}), "
          f"prompt width {PROMPT_W}, response width {RESPONSE_W}; CPU time, torch 1 thread; "
          f"{platform.processor() or platform.machine()}, load {os.getloadavg()[0]:.2f}; "
          f"tree {os.environ.get('TANDEM_BENCH_TREE') or 'this checkout'}"
          + ("" if has_lazy else " (no overlap_host_work: 'on' = 'off')"))
    print(f"packing (all micro-batches)      {med['packing']:8.1f} ms"
          + (f"   ({med['packing'] / med['packing_rows']:.3f}x of {med['packing_rows']:.1f} ms at {a.micro} rows, "
             f"{len(by_rows)} micro-batches)" if a.max_tokens else ""))
    print(f"to first forward, packing ahead  {med['first_off']:8.1f} ms")
    print(f"to first forward, per micro-batch {med['first_on']:7.1f} ms   ({med['first_on'] / med['first_off']:.3f}x)")
    print(f"whole call, packing ahead        {med['call_off']:8.1f} ms")
    print(f"whole call, per micro-batch      {med['call_on']:8.1f} ms   ({med['call_on'] / med['call_off']:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
