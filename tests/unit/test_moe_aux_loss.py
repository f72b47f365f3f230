"""The MoE router load-balancing loss in training (tandem/train/moe_aux_loss.py), one rank, fp32.

With a main loss of exactly zero the gradient is the load-balancing term alone. It is there;
it equals megatron-core's own aux_loss gradient where megatron's scaling is right (TP=1, loss
units = routed tokens); it is the same whatever the loss units (response tokens or rows) and,
when every micro-batch routes alike, whatever the micro-batch split; the metric is the loss.
"""
import dataclasses
import json
from contextlib import nullcontext

import pytest
import torch
from tiny_hf import tiny_qwen3_moe

COEFF = 0.1


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    return tiny_qwen3_moe(tmp_path_factory.mktemp("moe") / "hf", head_dim=32, norm_topk_prob=True,
                          mlp_only_layers=[0], num_hidden_layers=3)  # layer 0 dense: MoE layers 1, 2


def build(moe_dir, megatron_aux: bool = False):
    """DDP-wrapped tiny Qwen3-MoE; megatron_aux: megatron's own aux_loss on its routers (the reference)."""
    from tandem.convert.hf_load import load_hf_weights
    from tandem.models.build import build_gpt_model
    from tandem.models.registry import shape_from_hf_config
    from tandem.train.optim import wrap_ddp

    shape = shape_from_hf_config(json.loads((moe_dir / "config.json").read_text()))
    model = build_gpt_model(shape)
    load_hf_weights(model, str(moe_dir), shape, tp_rank=0, tp_size=1)
    if megatron_aux:  # the config is shared by every module; routers cache their type at init
        model.config.moe_router_load_balancing_type, model.config.moe_aux_loss_coeff = "aux_loss", COEFF
        for m in model.modules():
            if hasattr(m, "routing_type"):
                m.routing_type = "aux_loss"
    return wrap_ddp(model), shape


def mini_batch(rows: int, units, same_rows: bool = False):
    """One mini-batch of `rows` rows ([left-padded prompt | right-padded response]) with the
    meta the front door sets (its loss units by `units`, its tokens)."""
    from tandem.data.batch import DataProto
    from tandem.serving.dispatch import train_layout

    g = torch.Generator().manual_seed(0)
    lp, r = 5, 4
    ids = torch.randint(0, 128, (1 if same_rows else rows, lp + r), generator=g).expand(rows, -1).clone()
    mask = torch.ones(rows, lp + r, dtype=torch.long)
    if not same_rows:
        for i in range(rows):
            mask[i, : i % 3] = 0  # left padding
            mask[i, lp + 1 + i % 3:] = 0  # right padding
    batch = DataProto(tensors={"input_ids": ids * mask, "attention_mask": mask, "responses": ids[:, lp:] * mask[:, lp:],
                               "response_mask": mask[:, lp:].clone()})
    return train_layout(batch, rows, 1, epochs=1, shuffle=False, seed=0, units=units).shards[0]


def zero_loss(units):
    def loss_fn(output, mb):
        return output.output.sum() * 0.0, units(mb), {}
    return loss_fn


def gradients(ddp, minis, micro_rows, units, balancing=None):
    """Gradients of one mini-batch (the main loss is 0; `units` as its meta's) and the balancing metrics."""
    from tandem.train.microbatch import micro_batches
    from tandem.train.schedule import run_schedule

    ddp.train()
    ddp.zero_grad_buffer()
    with (balancing.update(minis, micro_rows, "lb") if balancing else nullcontext({})) as metrics:
        run_schedule(ddp, micro_batches(minis[0], micro_rows), zero_loss(units), forward_only=False)
    return {n: p.main_grad.detach().clone() for n, p in ddp.module.named_parameters()}, metrics


def response_tokens(mb):
    from tandem.train.losses import loss_units

    return loss_units(mb["response_mask"], "token-mean")


def rows(mb):
    return len(mb)


def all_tokens(mb):
    return int(mb["attention_mask"].sum())


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-7, msg=k)  # fp32 sum order


def test_gradient_present_and_equal_to_megatron_aux_loss(megatron_dist, moe_dir):
    from tandem.train.moe_aux_loss import RouterLoadBalancing

    ddp, shape = build(moe_dir)
    balancing = RouterLoadBalancing(ddp.module, COEFF, len(shape.moe.moe_layers))
    minis = mini_batch(5, response_tokens)
    ours, metrics = gradients(ddp, minis, 2, response_tokens, balancing)  # micro-batches of 2, 2, 1 rows
    routers = [k for k in ours if k.endswith("router.weight")]
    assert len(routers) == 2 and all(ours[k].abs().max() > 1e-6 for k in routers)
    assert ours["decoder.layers.0.self_attention.linear_qkv.weight"].abs().max() > 0  # through the hidden states
    off, _ = gradients(ddp, minis, 2, response_tokens)  # hooks inactive outside update()
    assert all(float(v.abs().max()) == 0.0 for v in off.values())

    ref_ddp, _ = build(moe_dir, megatron_aux=True)
    ref, _ = gradients(ref_ddp, mini_batch(5, all_tokens), 2, all_tokens)  # megatron's scale is right here
    assert_same(ours, ref)
    assert 1.0 <= metrics["lb"] < 2.0  # 1.0 = perfectly balanced; the routers are peaked at random


def test_independent_of_loss_units_and_split(megatron_dist, moe_dir):
    from tandem.train.moe_aux_loss import RouterLoadBalancing

    ddp, shape = build(moe_dir)
    balancing = RouterLoadBalancing(ddp.module, COEFF, len(shape.moe.moe_layers))
    by_tokens, m1 = gradients(ddp, mini_batch(5, response_tokens), 2, response_tokens, balancing)
    by_rows, m2 = gradients(ddp, mini_batch(5, rows), 2, rows, balancing)  # the seq-mean modes' units
    assert_same(by_tokens, by_rows)
    assert m1 == m2
    same = mini_batch(4, response_tokens, same_rows=True)  # every micro-batch routes alike: any split, same gradient
    whole, m_whole = gradients(ddp, same, 4, response_tokens, balancing)
    for micro_rows in (1, 3):
        split, m_split = gradients(ddp, same, micro_rows, response_tokens, balancing)
        assert_same(split, whole)
        assert m_split["lb"] == pytest.approx(m_whole["lb"], rel=1e-6)


def test_metric_is_megatrons_loss_per_layer(megatron_dist, moe_dir):
    """One micro-batch: the metric equals megatron's tracked aux_loss, averaged over MoE layers."""
    from megatron.core.transformer.moe import moe_utils

    from tandem.train.moe_aux_loss import RouterLoadBalancing

    ddp, shape = build(moe_dir)
    _, metrics = gradients(ddp, mini_batch(3, response_tokens), 3, response_tokens,
                           RouterLoadBalancing(ddp.module, COEFF, len(shape.moe.moe_layers)))
    ref_ddp, _ = build(moe_dir, megatron_aux=True)
    moe_utils.clear_aux_losses_tracker()
    gradients(ref_ddp, mini_batch(3, all_tokens), 3, all_tokens)
    tracked = moe_utils.get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"]
    assert float(tracked[0]) == 0.0  # the dense layer
    assert metrics["lb"] == pytest.approx(float(tracked.sum()) / 2, rel=1e-6)


def test_coefficient_from_config(tmp_path):
    from tandem.config import MegatronConfig, ModelConfig, router_aux_loss_coeff

    quiet = tiny_qwen3_moe(tmp_path / "quiet", router_aux_loss_coef=0.02)  # output_router_logits: false
    loud = tiny_qwen3_moe(tmp_path / "loud", router_aux_loss_coef=0.02, output_router_logits=True)
    m = MegatronConfig()
    assert router_aux_loss_coeff(m, ModelConfig(path=str(quiet))) == 0.0  # as transformers trains it
    assert router_aux_loss_coeff(m, ModelConfig(path=str(loud))) == 0.02
    assert router_aux_loss_coeff(m, ModelConfig()) == 0.0  # dense built-in model
    on = dataclasses.replace(m, override_transformer_config={"moe_aux_loss_coeff": 0.5})
    assert router_aux_loss_coeff(on, ModelConfig(path=str(quiet))) == 0.5
    typed = dataclasses.replace(m, override_transformer_config={"moe_router_load_balancing_type": "aux_loss"})
    assert router_aux_loss_coeff(typed, ModelConfig(path=str(quiet))) == 0.02
    off = dataclasses.replace(m, override_transformer_config={"moe_router_load_balancing_type": "none"})
    assert router_aux_loss_coeff(off, ModelConfig(path=str(loud))) == 0.0
