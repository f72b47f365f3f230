"""Does a compiled transformer layer come back from torch's on-disk caches in a second process?

    python bench/compile_cache_probe.py [--layers 2] [--hidden 256] [--fused] [--cache-dir DIR] [--profile DIR]

Runs the same work twice, each time in a fresh process on one cache directory (torch's inductor and
triton caches, as `services.compile_cache_dir` sets them): a megatron GPTModel whose layers are compiled
as the actor compiles them (tandem/models/compile.py), run through the actor's schedule
(tandem/train/schedule.py): forward-only at two packed lengths, then training at two lengths (bf16 on a
GPU, fp32 on CPU). Each run prints its compile
seconds (torch's split: frames, backends, inductor, code generation) and how the FX-graph and
AOT-autograd caches answered, then the second run's figures over the first's. A second run that still
compiles for long, or shows an AOT bypass, is what a service's first step pays on every restart.
--fused turns on megatron's fused activation (as the GPU build does) to show it is kept out of the graph.
Each run also says how many compile threads inductor chose and whether its worker pool was up at the
end; --compile-threads N sets TORCHINDUCTOR_COMPILE_THREADS to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def work(a) -> dict:
    import torch

    from tandem.data.batch import DataProto
    from tandem.models import compile as layer_compile
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.serving.call_observer import compile_pool, compile_times
    from tandem.train.losses import response_log_probs
    from tandem.train.schedule import reads_responses_only, run_schedule

    init_distributed(ParallelConfig(), 0, 1, f"tcp://127.0.0.1:{a.port}", seed=1)
    cuda = torch.cuda.is_available()
    shape = ModelShape(vocab_size=1024, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=2 * a.hidden, max_position_embeddings=512,
                       attention_bias=True)
    model = build_gpt_model(shape, params_dtype=torch.bfloat16 if cuda else torch.float32).train()
    if a.fused:
        model.config.bias_activation_fusion = True
    layer_compile.compile_layers(model)

    def rows(length: int) -> DataProto:  # 4 rows, one left-padded; the second half is the response
        ids = torch.randint(2, 1000, (4, length))
        mask = torch.ones(4, length, dtype=torch.long)
        mask[0, : length // 3] = 0
        return DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, length // 2:],
                                  "response_mask": mask[:, length // 2:]})

    @reads_responses_only
    def loss_fn(output, mb):  # as the actor's: log-probs, and the entropy when training
        training = torch.is_grad_enabled()
        lp, ent = response_log_probs(output, mb, 1.0, with_entropy=training, entropy_grad=training)
        mask = mb["response_mask"].to(lp.device)  # the rows stay on the host; log-probs come back on the GPU
        loss = (lp * mask).sum() - (0.01 * (ent * mask).sum() if training else 0)
        return loss, 1, {}

    t0 = time.time()  # the actor's schedule: forward-only at two lengths, then training at two lengths
    run_schedule(model, [rows(64), rows(80)], loss_fn, forward_only=True)
    run_schedule(model, [rows(64), rows(96)], loss_fn, forward_only=False)
    if cuda:
        torch.cuda.synchronize()
    return {"wall_s": time.time() - t0, "device": torch.cuda.get_device_name() if cuda else "cpu",
            **compile_pool(), **compile_times()}


def profiled(a) -> dict:
    """work(a) under cProfile; its 60 largest functions by cumulative and by own time to a.profile (a file)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    result = prof.runcall(work, a)
    text = io.StringIO()
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(60)
    os.makedirs(os.path.dirname(a.profile), exist_ok=True)
    with open(a.profile, "w") as f:
        f.write(text.getvalue())
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fused", action="store_true", help="megatron's fused activation on, as on GPUs")
    p.add_argument("--cache-dir", help="default: a new temporary directory (both runs share it)")
    p.add_argument("--compile-threads", type=int, help="TORCHINDUCTOR_COMPILE_THREADS for both runs")
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--profile", metavar="DIR", help="cProfile each run's work: DIR/run{1,2}.txt, by cumulative and own time")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(profiled(a) if a.profile else work(a)), flush=True)
        return 0
    cache = a.cache_dir or tempfile.mkdtemp(prefix="compile-cache-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
               TRITON_CACHE_DIR=os.path.join(cache, "triton"),
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    if a.compile_threads:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(a.compile_threads)
    args = [sys.executable, os.path.abspath(__file__), "--child", "--layers", str(a.layers), "--hidden", str(a.hidden),
            "--port", str(a.port), *(["--fused"] if a.fused else [])]
    runs = []
    for i in (1, 2):
        prof = ["--profile", os.path.join(os.path.abspath(a.profile), f"run{i}.txt")] if a.profile else []
        out = subprocess.run(args + prof, env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        r = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(r)
        caches = ", ".join(f"{k} {r[k]}" for k in r if "_cache_" in k)
        print(f"run {i} ({r['device']}, {r['compile_threads']} compile threads, worker pool "
              f"{'up' if r['compile_pool_up'] else 'not up'} at the end, cache {cache}): "
              f"wall {r['wall_s']:.1f} s, compile {r['total']:.1f} s "
              f"(tracing {r['frame_s'] - r['backend_s']:.1f}, backends {r['backend_s']:.1f}, inductor "
              f"{r['inductor_s']:.1f}, code gen {r['code_gen_s']:.1f}); {caches}", flush=True)
    print(f"second run / first: compile {runs[1]['total'] / max(runs[0]['total'], 1e-9):.2f}x, "
          f"wall {runs[1]['wall_s'] / max(runs[0]['wall_s'], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
