"""The actor at TP=2 and DP=2 (two gloo processes) against TP=1, through the service's
own front door and rank group: same log-probs, same weights after one PPO update
(two mini-batches), and checkpoints that reshard between TP=2 and TP=1."""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = {"tp1": (1, 1), "tp2": (2, 2), "dp2": (2, 1), "tp2sp": (2, 2)}  # name: (world size, TP)


def run_layout(run_ranks, tmp, name, tokenizer_dir, world, tp, load_from=None):
    out = tmp / name
    out.mkdir()
    args = [str(world), str(tp), str(tmp / f"{name}.rdzv"), str(out), tokenizer_dir] + ([load_from] if load_from else [])
    run_ranks([[sys.executable, os.path.join(HERE, "actor_rank.py"), str(r), *args] for r in range(world)], timeout=600)
    return torch.load(out / "result.pt"), out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arithmetic_tokenizer_dir, run_ranks):
    tmp = tmp_path_factory.mktemp("parallel")
    return tmp, {name: run_layout(run_ranks, tmp, name, arithmetic_tokenizer_dir, *wt) for name, wt in LAYOUTS.items()}


def hf_weights(d):
    from safetensors.torch import load_file

    return load_file(os.path.join(d, "hf", "model.safetensors"))


@pytest.mark.parametrize("name", ["tp2", "dp2", "tp2sp"])
def test_same_update_as_tp1(runs, name):
    _, results = runs
    (ref, ref_dir), (got, got_dir) = results["tp1"], results[name]
    torch.testing.assert_close(got["before"], ref["before"], atol=1e-5, rtol=0)
    w_ref, w_got = hf_weights(ref_dir), hf_weights(got_dir)
    assert w_ref.keys() == w_got.keys()
    for k in w_ref:
        torch.testing.assert_close(w_got[k], w_ref[k], atol=1e-5, rtol=0, msg=k)
    torch.testing.assert_close(got["log_probs"], ref["log_probs"], atol=1e-5, rtol=0)
    for k, v in ref["metrics"].items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    # the update really moved the policy (Adam at lr 1e-4 keeps first-step noise on
    # near-zero gradients below the 1e-5 tolerance; a wrong gradient would not be)
    assert (ref["log_probs"] - ref["before"]).abs().max() > 1e-1
    assert ref["metrics"]["actor/ppo_kl"] != 0.0  # averaged over 2 mini-batches: the 2nd is off-policy


@pytest.mark.parametrize("saved,loaded", [("tp2", "tp1"), ("tp1", "tp2")])
def test_checkpoint_reshards(runs, arithmetic_tokenizer_dir, run_ranks, saved, loaded):
    tmp, results = runs
    world, tp = LAYOUTS[loaded]
    got, _ = run_layout(run_ranks, tmp, f"load_{saved}_at_{loaded}", arithmetic_tokenizer_dir, world, tp,
                        load_from=str(results[saved][1] / "ckpt"))
    torch.testing.assert_close(got["log_probs"], results[saved][0]["log_probs"], atol=1e-5, rtol=0)
