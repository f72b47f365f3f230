"""Bad inputs that appear while a run goes, each a clear error naming the file or key: NaN / inf
in loaded weights (a Hugging Face checkpoint, a Tandem checkpoint) and in a step's advantages;
a checkpoint of another model shape or another role (which no layout change can reshard); a
data row whose prompt tokenizes to nothing (skipped and counted, not a failed step).
(The reward service's answer with the wrong number of scores: tests/wire/test_reward_answers.py;
NaN weights sent to a rollout: tests/services/test_bad_weights.py.)"""
import dataclasses
import json

import pytest
import torch
from hf_test_files import hf_tensors
from safetensors.torch import save_file
from tiny_hf import tiny_llama

from tandem.data.batch import DataProto


def test_nan_in_a_hugging_face_checkpoint_names_the_file_and_key(megatron_dist, tmp_path):
    from hf_test_files import import_hf

    src = tiny_llama(tmp_path / "llama")
    tensors = hf_tensors(src)
    key = "model.layers.1.mlp.up_proj.weight"
    tensors[key][3, 5] = float("inf")
    save_file(tensors, str(src / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor '{key}' contains NaN or inf"):
        import_hf(src)


def _model(hidden: int = 64, layers: int = 2):
    from tandem.models.build import build_gpt_model
    from tandem.models.spec import ModelShape

    shape = ModelShape(vocab_size=32, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=128,
                       max_position_embeddings=32)
    return build_gpt_model(shape)


def _save_load_template(model, prefix):
    return {prefix: model.sharded_state_dict(prefix=f"{prefix}.")}


def test_nan_in_a_checkpoint_names_the_checkpoint_and_tensor(megatron_dist, tmp_path):
    from tandem import checkpoint
    from tandem.config import OptimConfig
    from tandem.train.optim import Optimizer, wrap_ddp

    def policy_and_optimizer():
        model = _model()
        return model, Optimizer(wrap_ddp(model), OptimConfig())

    model, opt = policy_and_optimizer()
    with torch.no_grad():
        model.decoder.layers[1].mlp.linear_fc2.weight[0, 0] = float("nan")
    path = str(tmp_path / "ck")
    checkpoint.save_models(path, {"policy": model}, opt, {})
    fresh, fresh_opt = policy_and_optimizer()
    before = {k: v.clone() for k, v in fresh.state_dict().items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match=rf"checkpoint '{path}': tensor 'policy\.decoder\.layers\.1\.mlp\."
                                         r"linear_fc2\.weight' contains NaN or inf"):
        checkpoint.load_models(path, {"policy": fresh}, fresh_opt)
    after = fresh.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())  # nothing was loaded


@pytest.mark.parametrize("case", ["hidden_size", "layers", "another_role"])
def test_a_checkpoint_that_cannot_be_resharded_names_the_tensor(megatron_dist, tmp_path, case):
    from tandem import checkpoint

    path = str(tmp_path / "ck")
    checkpoint.save_sharded(_save_load_template(_model(), "policy"), path)
    model, prefix = {"hidden_size": (_model(hidden=32), "policy"), "layers": (_model(layers=3), "policy"),
                     "another_role": (_model(), "critic")}[case]
    expected = {"hidden_size": r"another model shape: 'policy\.embedding\.word_embeddings\.weight' is \[32, 64\] "
                               r"there, \[32, 32\] here",
                "layers": r"another model shape: 'policy\.decoder\.layers\.[a-z_.]+' is \[2, ",
                "another_role": r"has no 'critic\.[a-z_.]+'.*another role's"}[case]
    with pytest.raises(ValueError, match=rf"checkpoint '{path}' .*{expected}"):
        checkpoint.load_sharded(_save_load_template(model, prefix), path)


def _step_context(estimator: str):
    from tandem.algos.kl import get_kl_controller
    from tandem.config import load_config
    from tandem.controller.step import StepContext

    cfg = load_config(None, [f"algorithm.adv_estimator={estimator}", "actor_rollout_ref.rollout.n=2"])
    return StepContext(roles=None, cfg=cfg, tokenizer=None, kl_ctrl=get_kl_controller("fixed", 0.0, 0.1, 100))


@pytest.mark.parametrize("where", ["seq_reward", "values"])
def test_nan_reaching_the_advantages_names_its_source(where):
    from tandem.controller.step import LogProbs, compute_advantages

    mask = torch.ones(4, 3, dtype=torch.long)
    gen = DataProto(tensors={"response_mask": mask, "seq_reward": torch.tensor([1.0, 0.0, 1.0, 1.0])})
    values = torch.zeros(4, 3)
    lp = LogProbs(old=DataProto(tensors={"old_log_probs": torch.zeros(4, 3)}), ref=None,
                  values=DataProto(tensors={"values": values}))
    compute_advantages(_step_context("gae"), gen, lp)  # finite: fine
    if where == "seq_reward":
        gen.tensors["seq_reward"][2] = float("nan")
    else:
        values[1, 2] = float("inf")
    row = 2 if where == "seq_reward" else 1
    with pytest.raises(ValueError, match=rf"advantages: not computed: '{where} \(.*\)' has NaN or inf in rows \[{row}\]"):
        compute_advantages(_step_context("gae"), gen, lp)


def test_a_prompt_that_tokenizes_to_nothing_is_skipped_and_counted(tmp_path, arithmetic_tokenizer):
    from tandem.controller.data import load_examples

    rows = [{"prompt": [{"role": "user", "content": c}], "reward_model": {"ground_truth": g},
             "data_source": "tandem/arithmetic"} for c, g in [("1+2=", "3"), ("", "0"), ("4+4=", "8"), ("", "1")]]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    skipped: dict = {}
    examples = load_examples(str(path), arithmetic_tokenizer, 16, skipped=skipped)
    assert [e.ground_truth for e in examples] == ["3", "8"] and skipped == {"overlong": 0, "empty_prompt": 2}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["reward_model"]["ground_truth"] in ("0", "1")))
    with pytest.raises(ValueError, match=rf"{path}.*: no usable rows .*2 whose prompt tokenizes to nothing"):
        load_examples(str(path), arithmetic_tokenizer, 16)


def test_run_counts_skipped_rows_in_its_summary(tmp_path, arithmetic_tokenizer):
    """The count reaches summary.json (a Run opened on data with an empty prompt; no services)."""
    from tandem.config import load_config
    from tandem.controller.run import Run

    tok_dir = tmp_path / "tok"
    arithmetic_tokenizer.save_pretrained(tok_dir)
    rows = [{"prompt": [{"role": "user", "content": c}], "reward_model": {"ground_truth": "1"}} for c in ("1+0=", "")]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"data.train_files={tmp_path / 'd.jsonl'}", f"data.val_files={tmp_path / 'd.jsonl'}",
                             f"actor_rollout_ref.model.tokenizer_path={tok_dir}",
                             "trainer.sft.stop_at_accuracy=null"])  # no dev split (create_run_dir resolves auto)
    run = Run(cfg, str(tmp_path / "run"))
    assert run.summary.get("data_rows_skipped") == {"train": {"overlong": 0, "empty_prompt": 1},
                                                    "val": {"overlong": 0, "empty_prompt": 1}}
    assert len(run.train) == 1 and dataclasses.is_dataclass(run.train[0])

