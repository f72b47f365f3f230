"""Does a compiled transformer layer come back from torch's on-disk caches in a second process?

    python bench/compile_cache_probe.py [--layers 2] [--hidden 256] [--fused] [--cache-dir DIR]

Runs the same work twice, each time in a fresh process on one cache directory (torch's inductor and
triton caches, as `services.compile_cache_dir` sets them): a megatron GPTModel whose layers are compiled
as the actor compiles them (tandem/models/compile.py), a packed forward without grad at two lengths,
then forward and backward at two lengths (bf16 on a GPU, fp32 on CPU). Each run prints its compile
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
    from tandem.models.packing import PackedOutput, Packing, packed_rope, selected_outputs
    from tandem.models.spec import ModelShape
    from tandem.parallel.layout import ParallelConfig, init_distributed
    from tandem.serving.call_observer import compile_times
    from tandem.train.losses import response_log_probs

    init_distributed(ParallelConfig(), 0, 1, f"tcp://127.0.0.1:{a.port}", seed=1)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    shape = ModelShape(vocab_size=1024, hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=2 * a.hidden, max_position_embeddings=512,
                       attention_bias=True)
    model = build_gpt_model(shape, params_dtype=torch.bfloat16 if cuda else torch.float32).train()
    if a.fused:
        model.config.bias_activation_fusion = True
    layer_compile.compile_layers(model)

    def step(length: int, grad: bool) -> None:
        ids = torch.randint(2, 1000, (4, length), device=dev)
        mask = torch.ones(4, length, dtype=torch.long, device=dev)
        mask[0, : length // 3] = 0
        half = length // 2
        mb = DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, half:],
                                "response_mask": mask[:, half:]})
        p = Packing(mask)
        p.keep_responses(length - half)
        with torch.set_grad_enabled(grad), packed_rope(model, p, dev), selected_outputs(model, p, dev):
            out = model(p.pack(ids), None, None, packed_seq_params=p.params(dev))
            lp, ent = response_log_probs(PackedOutput(out, p), mb, 1.0, with_entropy=grad, entropy_grad=grad)
            if grad:
                ((lp - 0.01 * ent) * mb["response_mask"]).sum().backward()

    t0 = time.time()
    for length, grad in ((64, False), (80, False), (64, True), (96, True)):
        step(length, grad)
    if cuda:
        torch.cuda.synchronize()
    from torch._inductor import async_compile

    # inductor compiles kernels in a worker pool only once the pool is up: otherwise in this process,
    # one at a time (code generation then holds what the pool would have spread over its workers)
    return {"wall_s": time.time() - t0, "device": torch.cuda.get_device_name() if cuda else "cpu",
            "compile_threads": async_compile.get_compile_threads(),
            "pool_used": bool(async_compile.AsyncCompile.use_process_pool()), **compile_times()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--fused", action="store_true", help="megatron's fused activation on, as on GPUs")
    p.add_argument("--cache-dir", help="default: a new temporary directory (both runs share it)")
    p.add_argument("--compile-threads", type=int, help="TORCHINDUCTOR_COMPILE_THREADS for both runs")
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(work(a)), flush=True)
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
        out = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            print(out.stderr[-3000:], file=sys.stderr)
            return out.returncode
        r = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(r)
        caches = ", ".join(f"{k} {r[k]}" for k in r if "cache" in k)
        print(f"run {i} ({r['device']}, {r['compile_threads']} compile threads, worker pool "
              f"{'used' if r['pool_used'] else 'not used'}, cache {cache}): "
              f"wall {r['wall_s']:.1f} s, compile {r['total']:.1f} s "
              f"(tracing {r['frame_s'] - r['backend_s']:.1f}, backends {r['backend_s']:.1f}, inductor "
              f"{r['inductor_s']:.1f}, code gen {r['code_gen_s']:.1f}); {caches}", flush=True)
    print(f"second run / first: compile {runs[1]['total'] / max(runs[0]['total'], 1e-9):.2f}x, "
          f"wall {runs[1]['wall_s'] / max(runs[0]['wall_s'], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
