"""SFT's stop on dev accuracy (controller/sft.py): the dev split held out of the training data,
the stop at the first evaluation at or above the threshold, and the config keys' errors.

The actor here is a recorder of train_sft calls and the dev accuracy a scripted sequence: what
is tested is when the loop evaluates and stops (the service's SFT step is tested in
tests/unit/test_actor_worker.py and end to end in tests/e2e/test_tandem_run.py)."""
import asyncio

import pytest

from tandem.config import ConfigError, SftConfig, load_config
from tandem.controller.data import Example
from tandem.controller.sft import BUILTIN_STOP_AT_ACCURACY, resolve_stop, run_sft, split_dev


def examples(n: int) -> list[Example]:
    return [Example([1, 3 + i % 10, 13], f"{i}+0=", str(i), "tandem/arithmetic", {}) for i in range(n)]


def test_dev_split_is_held_out_deterministically_and_keeps_the_training_order():
    data = examples(50)
    sft = SftConfig(stop_at_accuracy=0.5, dev_size=8)
    train, dev = split_dev(data, sft, seed=3)
    assert len(dev) == 8 and len(train) == 42
    assert {e.prompt_text for e in train}.isdisjoint(e.prompt_text for e in dev)
    assert [e.prompt_text for e in train] == [e.prompt_text for e in data if e not in dev]  # order kept
    again, dev_again = split_dev(data, sft, seed=3)
    assert dev_again == dev and again == train
    assert split_dev(data, sft, seed=4)[1] != dev  # the seed picks the rows


def test_no_dev_split_without_the_stop_or_without_sft():
    data = examples(20)
    for sft in (SftConfig(stop_at_accuracy=None, dev_size=8), SftConfig(total_steps=0, dev_size=30)):
        train, dev = split_dev(data, sft, seed=1)
        assert train is data and dev == []


def test_a_dev_split_that_leaves_no_training_data_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        split_dev(examples(10), SftConfig(stop_at_accuracy=0.5, dev_size=10), seed=1)
    assert str(e.value).startswith("trainer.sft.dev_size: 10 dev prompts")


class RecordingActor:
    def __init__(self):
        self.batches = []

    async def train_sft(self, batch):
        self.batches.append(batch)
        return {"sft/loss": 1.0 / len(self.batches)}


def run(sft: SftConfig, accuracies: list[float], tokenizer, n_examples: int = 40):
    actor, asked = RecordingActor(), []

    async def dev_accuracy():
        asked.append(len(actor.batches))
        return accuracies[len(asked) - 1]

    out = asyncio.run(run_sft(actor, examples(n_examples), tokenizer, sft, dev_accuracy=dev_accuracy))
    return out, actor, asked


def test_stops_at_the_first_evaluation_at_or_above_the_threshold(arithmetic_tokenizer):
    sft = SftConfig(total_steps=100, batch_size=4, stop_at_accuracy=0.5, eval_freq=5)
    out, actor, asked = run(sft, [0.1, 0.3, 0.5, 0.9], arithmetic_tokenizer)
    assert asked == [5, 10, 15]  # evaluated after every 5th step, stopped at the first >= 0.5
    assert out["steps"] == 15 and len(actor.batches) == 15
    assert out["dev_accuracy"] == [[5, 0.1], [10, 0.3], [15, 0.5]]
    assert out["metrics"] == {"sft/loss": 1.0 / 15}


def test_runs_total_steps_when_the_threshold_is_not_reached_and_evaluates_the_last_step(arithmetic_tokenizer):
    sft = SftConfig(total_steps=12, batch_size=4, stop_at_accuracy=0.8, eval_freq=5)
    out, actor, asked = run(sft, [0.1, 0.2, 0.3], arithmetic_tokenizer)
    assert asked == [5, 10, 12] and out["steps"] == 12 and len(actor.batches) == 12
    assert out["dev_accuracy"][-1] == [12, 0.3]


def test_without_the_stop_no_evaluation_and_the_fixed_step_count(arithmetic_tokenizer):
    sft = SftConfig(total_steps=7, batch_size=4, stop_at_accuracy=None, eval_freq=2)
    out, actor, asked = run(sft, [], arithmetic_tokenizer)
    assert asked == [] and out["steps"] == 7 and out["dev_accuracy"] == []
    # the batches are the cursor's (data_seed), as before the stop existed
    first = [b["input_ids"][:, 1].tolist() for b in actor.batches]
    again = [b["input_ids"][:, 1].tolist() for b in run(sft, [], arithmetic_tokenizer)[1].batches]
    assert first == again


@pytest.mark.parametrize("override,text", [
    ("trainer.sft.stop_at_accuracy=0", "must be a greedy accuracy in (0, 1]"),
    ("trainer.sft.stop_at_accuracy=1.5", "must be a greedy accuracy in (0, 1]"),
    ("trainer.sft.stop_at_accuracy=often", "must be a greedy accuracy in (0, 1]"),
    ("trainer.sft.stop_at_accuracy=true", "must be a greedy accuracy in (0, 1]"),
    ("trainer.sft.eval_freq=0", "must be >= 1"),
    ("trainer.sft.dev_size=0", "must be >= 1"),
    ("trainer.sft.total_steps=-1", "must be >= 0"),
])
def test_bad_values_name_the_key(override, text):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    key = override.split("=")[0]
    assert str(e.value).startswith(f"{key}:") and text in str(e.value)


def test_with_the_stop_off_its_other_keys_are_not_checked():
    cfg = load_config(None, ["trainer.sft.stop_at_accuracy=null", "trainer.sft.eval_freq=0"])
    assert cfg.trainer.sft.stop_at_accuracy is None


def test_auto_is_the_builtin_threshold_on_the_builtin_task_and_off_on_your_data(tmp_path):
    from tandem.controller.run_dir import create_run_dir

    assert load_config(None, []).trainer.sft.stop_at_accuracy == "auto"  # the default
    assert resolve_stop(SftConfig(), builtin_task=True).stop_at_accuracy == BUILTIN_STOP_AT_ACCURACY
    assert resolve_stop(SftConfig(), builtin_task=False).stop_at_accuracy is None
    assert resolve_stop(SftConfig(stop_at_accuracy=0.7), builtin_task=False).stop_at_accuracy == 0.7
    assert resolve_stop(SftConfig(stop_at_accuracy=None), builtin_task=True).stop_at_accuracy is None
    # the run directory's config.yaml holds the resolved value (a resumed run reads it back)
    cfg, run_dir = create_run_dir(load_config(None, [f"trainer.default_local_dir={tmp_path}",
                                                     "data.builtin_train_size=20", "data.builtin_val_size=4"]))
    assert cfg.trainer.sft.stop_at_accuracy == BUILTIN_STOP_AT_ACCURACY
    assert load_config(str(tmp_path / run_dir / "config.yaml")).trainer.sft.stop_at_accuracy == BUILTIN_STOP_AT_ACCURACY
    with pytest.raises(ValueError):  # unresolved: a programming error, not a silent default
        split_dev(examples(10), SftConfig(), seed=1)
