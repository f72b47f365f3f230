"""torch.compile of the transformer layers (tandem/models/compile.py): the compiled layers give
the eager log-probs and gradients on the packed training path, one compiled graph serves all
layers, and generation calls and compiler failures run eagerly."""
import pytest
import torch

from tandem.models import compile as layer_compile
from tandem.models.packing import PackedOutput, Packing, packed_rope, selected_outputs


def _model():
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=32, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                       attention_bias=True, init_std=0.1)
    return build_gpt_model(shape).train()


def _batch(drop_last: bool = False):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 32, (3, 9), generator=g)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for i, (p, r) in enumerate([(5, 4), (2, 3), (4, 1)]):
        mask[i, 5 - p: 5 + r] = 1
    if drop_last:  # another packed length: dynamic shapes, no recompile per length
        mask[0, 8] = 0
    return ids, mask


def _loss_and_grads(model, drop_last: bool = False):
    model.zero_grad(set_to_none=True)
    lp = _backward(model, drop_last)
    return lp, {n: q.grad.clone() for n, q in model.named_parameters()}


def _backward(model, drop_last: bool = False):
    """One packed micro-batch's forward and backward -> its log-probs."""
    from tandem.data.batch import DataProto
    from tandem.train.losses import response_log_probs

    ids, mask = _batch(drop_last)
    mb = DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, 5:],
                            "response_mask": mask[:, 5:]})
    p = Packing(mask)
    p.keep_responses(4)
    dev = next(model.parameters()).device  # CPU in CI; the GPU's where there is one
    with packed_rope(model, p, dev), selected_outputs(model, p, dev):
        out = model(p.pack(ids).to(dev), None, None, packed_seq_params=p.params(dev))
    lp, ent = response_log_probs(PackedOutput(out, p), mb, 1.0, with_entropy=True, entropy_grad=True)
    ((lp - 0.1 * ent) * mb["response_mask"].to(dev)).sum().backward()
    return lp.detach()


def test_compiled_layers_match_eager(megatron_dist):
    from torch._dynamo.utils import counters

    model = _model()
    eager = [_loss_and_grads(model, drop) for drop in (False, True)]
    captured = counters["stats"]["calls_captured"]
    assert layer_compile.compile_layers(model) == 3
    for drop, (lp_eager, g_eager) in zip((False, True), eager):  # then another packed length
        lp, grads = _loss_and_grads(model, drop)
        assert (lp - lp_eager).abs().max() < 1e-5
        for name, g in g_eager.items():
            scale = g.abs().max().clamp(min=1e-3)
            assert (grads[name] - g).abs().max() / scale < 1e-4, name
    assert counters["stats"]["calls_captured"] > captured  # the layers ran through dynamo
    assert not layer_compile._CompiledCall.failed  # compiled, not fallen back to eager


def test_generation_calls_and_compiler_failures_run_eagerly(megatron_dist, monkeypatch):
    model = _model()
    layer_compile.compile_layers(model)
    layer = model.decoder.layers[0]
    call = layer._compiled_call_impl
    ran = []
    monkeypatch.setattr(call, "eager", lambda *a, **k: ran.append("eager") or "eager")

    def failing(*a, **k):
        raise torch._dynamo.exc.InternalTorchDynamoError("inductor bug")
    monkeypatch.setattr(call, "compiled", failing)
    assert layer(hidden_states=None, inference_context=object()) == "eager"  # generation: never compiled
    assert not layer_compile._CompiledCall.failed
    monkeypatch.setattr(layer_compile._CompiledCall, "failed", False)
    assert layer(hidden_states=None) == "eager"  # the compile failed: eager, and from now on
    assert layer_compile._CompiledCall.failed
    assert ran == ["eager", "eager"]


def test_megatron_warnings_outside_compiled_regions_still_warn():
    layer_compile._quiet_megatron_warnings()
    from megatron.core import utils

    with pytest.warns(DeprecationWarning, match="tp_group"):
        utils.warnings.warn("tp_group is None", DeprecationWarning, stacklevel=2)


def test_one_training_graph_for_all_layers_and_it_can_be_cached(megatron_dist):
    """The first layer's input (the embedding's transposed output) is made canonical, so it shares the
    other layers' graph; the linears' plain forward and the unfused activation keep autograd.Functions
    out of it, so AOTAutograd may store it on disk (no bypass): a second run of a service loads it
    instead of tracing and partitioning it again."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = _model()
    model.config.bias_activation_fusion = True  # as on GPUs (megatron's fused SwiGLU: an autograd.Function)
    layer_compile.compile_layers(model)
    assert all(not layer.mlp.config.bias_activation_fusion for layer in model.decoder.layers)
    assert model.config.bias_activation_fusion  # the model's own config is left as it was
    breaks, bypass = sum(counters["graph_break"].values()), counters["aot_autograd"]["autograd_cache_bypass"]
    for drop in (False, True):
        _loss_and_grads(model, drop)
    # three layers, two lengths: one graph, counted on the layers' own code (on GPUs the log-prob loss
    # is compiled too: all graphs of the process are not the layers')
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list  # dynamo starts at the layer's forward
    codes = (torch.nn.Module._call_impl, type(model.decoder.layers[0]).forward)
    assert sum(len(entries(c.__code__)) for c in codes) == 1
    assert sum(counters["graph_break"].values()) == breaks
    assert counters["aot_autograd"]["autograd_cache_bypass"] == bypass


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_gradients_go_straight_into_megatrons_main_grad(megatron_dist, dtype):
    """Under megatron DDP the compiled layers' linears add each micro-batch's weight gradient into the
    fp32 main_grad themselves and DDP's hook adds nothing more: two micro-batches give the eager
    model's main_grad, and the layers are still one graph. (bf16 weights: on a GPU the GEMM's fp32
    output path, on the CPU a bf16 product added in fp32, as the eager path does.)"""
    from torch._dynamo.utils import counters

    from tandem.train.optim import wrap_ddp

    torch._dynamo.reset()
    eager, compiled = _model().to(dtype), _model().to(dtype)
    ddps = [wrap_ddp(m) for m in (eager, compiled)]
    layer_compile.compile_layers(compiled)
    breaks = sum(counters["graph_break"].values())
    for model, ddp in zip((eager, compiled), ddps):
        ddp.zero_grad_buffer()
        for drop in (False, True):
            _backward(model, drop)
    assert sum(counters["graph_break"].values()) == breaks
    linears = [n for n, _ in compiled.decoder.named_parameters() if "linear" in n and n.endswith("weight")]
    assert len(linears) == 3 * 4
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        assert p.grad is None, name  # DDP's hook took every gradient
        scale = q.main_grad.abs().max().clamp(min=1e-3)
        assert (p.main_grad - q.main_grad).abs().max() / scale < (1e-4 if dtype == torch.float32 else 3e-2), name
        assert p.grad_added_to_main_grad == (name.removeprefix("decoder.") in linears), name
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list
    codes = (torch.nn.Module._call_impl, type(compiled.decoder.layers[0]).forward)
    assert sum(len(entries(c.__code__)) for c in codes) == 1


def test_plain_linears_give_megatrons_outputs_and_gradients(megatron_dist):
    model, plain = _model(), _model()  # the same seed: the same weights
    lin = plain.decoder.layers[2].mlp.linear_fc1
    lin.sequence_parallel = True  # something to communicate: megatron's own forward stays
    assert sum(layer_compile.plain_linears(layer) for layer in plain.decoder.layers) == 3 * 4 - 1
    assert "forward" not in vars(lin) and "forward" in vars(plain.decoder.layers[2].mlp.linear_fc2)
    lin.sequence_parallel = False
    (lp, grads), (lp_plain, grads_plain) = _loss_and_grads(model), _loss_and_grads(plain)
    assert torch.equal(lp, lp_plain)
    for name, g in grads.items():
        assert torch.allclose(grads_plain[name], g, rtol=1e-6, atol=1e-7), name


def test_no_grad_and_training_forwards_agree_bitwise(megatron_dist):
    """The old log-prob pass (no grad) and the update's forward (grad) run different compiled graphs;
    in bf16 they must give identical log-probs, or an on-policy update's ppo_kl is not 0. (RoPE's
    cos / sin rounded inside the graphs broke this: tandem/models/rope_table.py rows.)"""
    from tandem.data.batch import DataProto
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape
    from tandem.train.losses import response_log_probs

    torch.manual_seed(0)
    shape = ModelShape(vocab_size=64, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=256, max_position_embeddings=512,
                       attention_bias=True, init_std=0.05)
    model = build_gpt_model(shape).train().to(torch.bfloat16)
    layer_compile.compile_layers(model)
    g = torch.Generator().manual_seed(0)
    b, p_len, r_len = 6, 40, 30
    ids = torch.randint(2, 64, (b, p_len + r_len), generator=g)
    mask = torch.ones(b, p_len + r_len, dtype=torch.long)
    for i in range(b):
        mask[i, : (i * 5) % p_len] = 0
        mask[i, p_len + 10 + i:] = 0
    mb = DataProto(tensors={"input_ids": ids, "attention_mask": mask, "responses": ids[:, p_len:],
                            "response_mask": mask[:, p_len:]})
    dev = next(model.parameters()).device

    def log_probs(grad: bool):
        p = Packing(mask)
        p.keep_responses(r_len)
        with torch.set_grad_enabled(grad), packed_rope(model, p, dev), selected_outputs(model, p, dev):
            out = model(p.pack(ids).to(dev), None, None, packed_seq_params=p.params(dev))
            return response_log_probs(PackedOutput(out, p), mb, 1.0, with_entropy=False)[0].detach()

    assert torch.equal(log_probs(False), log_probs(True))
    assert not layer_compile._CompiledCall.failed


def test_floats_are_constants_not_cpu_tensor_inputs(megatron_dist, monkeypatch):
    """torch's default makes each Python float a layer reads (layernorm eps, softmax scale, dropout rate)
    a 0-d CPU tensor input; on a GPU the arithmetic on them became C++ CPU kernels, and loading those
    from the cache made inductor check the host's vector ISA in subprocesses (~24 s of a warm process's
    first compile on an H200). They must be constants."""
    inputs = []

    def recording(gm, example_inputs):
        inputs.extend(n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder")
        return gm.forward

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **{**kw, "backend": recording}))
    monkeypatch.setattr(torch._dynamo.config, "specialize_float", False)  # torch's default; compile_layers sets it
    torch._dynamo.reset()
    model = _model()
    layer_compile.compile_layers(model)
    try:
        _loss_and_grads(model)
    finally:
        torch._dynamo.reset()  # no graph of the recording backend is left for later tests
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    assert tensors and all(x.dim() > 0 for x in tensors), [tuple(x.shape) for x in tensors]
