"""token_stats on a GPU: torch.compile of the old formulas against the Triton kernels of
tandem/models/token_stats_kernel.py, over [rows, vocab] bf16 logits.

    python bench/token_stats_bench.py                      # 8192 x 151936 (Qwen2's vocabulary)
    python bench/token_stats_bench.py --rows 4096 --repeats 50

Cases: the log-prob pass (no grad, no entropy), log-probs + entropy without their gradient,
forward + backward of the log-probs (the update without an entropy bonus: its entropy is a
no-grad metric) and of both. Times are medians of --repeats CUDA-event timings. GB/s counts
the bytes each case must move at least (each read of the logits, each write of their gradient)
over its time, against the device-to-device copy bandwidth measured here (read + write).
Max |diff| is against the old path (log-probs, entropy, gradient: bf16, so one of its ulps).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generation_bench import copy_rate  # noqa: E402


def _log_probs(logits, labels, inv_t):  # tandem/models/logprobs.py's formulas before the kernels
    z = logits.float() * inv_t
    return z.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(z, -1)


def _entropy(logits, inv_t):
    z = logits.float() * inv_t
    lse = torch.logsumexp(z, -1)
    return lse - (torch.exp(z - lse[:, None]) * z).sum(-1)


def _both(logits, labels, inv_t):
    return _log_probs(logits, labels, inv_t), _entropy(logits, inv_t)


def old_path(compiled):
    """What token_stats ran: compiled functions; the entropy separately when it had no gradient."""
    def run(logits, labels, inv_t, entropy, entropy_grad):
        if entropy and entropy_grad:
            return compiled["both"](logits, labels, inv_t)
        lp = compiled["log_probs"](logits, labels, inv_t)
        if not entropy:
            return lp, None
        with torch.no_grad():
            return lp, compiled["entropy"](logits, inv_t)
    return run


def timed(fn, repeats: int, inner: int = 5) -> float:
    """Median ms of one call, each timing over `inner` calls back to back (no host gaps between)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def case(fn, logits, labels, inv_t, entropy, grad, entropy_grad, w):
    """-> a closure running one call (+ its backward when grad) -> its outputs, for comparison."""
    x = logits.detach().requires_grad_(grad)

    def once():
        x.grad = None
        with torch.set_grad_enabled(grad):
            lp, ent = fn(x, labels, inv_t, entropy, entropy_grad)
            if grad:
                loss = (lp * w).sum() + ((ent * w).sum() if entropy else 0)
                loss.backward()
        return lp.detach(), None if ent is None else ent.detach(), x.grad

    return once


def diff(a, b) -> str:
    """max |new - old| of log-probs / entropy / gradient ('-' where the case has none)."""
    return " / ".join("-" if x is None else f"{(x.float() - y.float()).abs().max().item():.1e}" for x, y in zip(a, b))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--temperature", type=float, default=0.7)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("token_stats_bench: needs a CUDA GPU (none here); nothing measured")
        return 0
    from tandem.models.compile import specialize_floats
    from tandem.models.token_stats_kernel import token_stats_triton

    specialize_floats()  # as the old path: 1 / temperature a constant
    compiled = {name: torch.compile(f, dynamic=True)
                for name, f in {"log_probs": _log_probs, "entropy": _entropy, "both": _both}.items()}
    old, new = old_path(compiled), token_stats_triton
    n, v = args.rows, args.vocab
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(n, v, device="cuda", generator=g) * 4).bfloat16()
    labels = torch.randint(0, v, (n,), device="cuda", generator=g)
    w = torch.randn(n, device="cuda", generator=g)
    inv_t = 1.0 / args.temperature
    one = n * v * logits.element_size()
    ceiling = copy_rate() / 1e9  # GB/s read + written: the ceiling for the GB/s columns
    print(f"{torch.cuda.get_device_name()}: logits [{n}, {v}] bf16 = {one / 1e9:.2f} GB, "
          f"copy bandwidth {ceiling:.0f} GB/s (read + write)")
    print(f"{'case':34} {'old ms':>8} {'new ms':>8} {'new/old':>8} {'old GB/s':>9} {'new GB/s':>9} "
          f"{'new/ceil':>9} {'bound ms':>9}  max|diff| lp / ent / grad")
    cases = [("log-probs (no grad)", False, False, False, 1),  # (name, entropy, grad, entropy grad, passes)
             ("log-probs + entropy (no grad)", True, False, False, 1),
             ("fwd+bwd log-probs (entropy metric)", True, True, False, 3),
             ("fwd+bwd log-probs, entropy grad", True, True, True, 3)]
    for name, entropy, grad, entropy_grad, passes in cases:
        fns = [case(fn, logits, labels, inv_t, entropy, grad, entropy_grad, w) for fn in (old, new)]
        outs = [f() for f in fns]
        t_old, t_new = (timed(f, args.repeats) for f in fns)
        nbytes = passes * one
        print(f"{name:34} {t_old:8.3f} {t_new:8.3f} {t_new / t_old:8.2f} {nbytes / t_old / 1e6:9.0f} "
              f"{nbytes / t_new / 1e6:9.0f} {nbytes / t_new / 1e6 / ceiling:9.2f} {nbytes / ceiling / 1e6:9.3f} "
              f" {diff(outs[0], outs[1])}")
        del outs, fns
    return 0


if __name__ == "__main__":
    sys.exit(main())
