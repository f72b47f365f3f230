"""services.actor.generation_torch_threads: the colocated rollout generates at that many torch
threads and gives the actor its own count back; bad values are ConfigErrors naming the key."""
import pytest
import torch
from test_actor_offload import make_actor, prompts

from tandem.config import ConfigError, load_config
from tandem.generation.sampling import SamplingParams

KEY = "services.actor.generation_torch_threads"


@pytest.mark.parametrize("value,text", [("0", ">= 1"), ("-2", ">= 1"), ("two", "two")])
def test_bad_values_name_the_key(value, text):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{KEY}={value}"])
    assert KEY in str(e.value) and text in str(e.value), str(e.value)


def test_a_standalone_rollout_has_its_own_threads():
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{KEY}=1", "actor_rollout_ref.rollout.mode=standalone"])
    assert str(e.value).startswith(f"{KEY}:") and "services.rollout.torch_threads" in str(e.value)


def test_default_is_the_actors_own_count():
    cfg = load_config(None, [])
    assert cfg.services.actor.generation_torch_threads is None and cfg.services.actor.torch_threads == 2
    assert load_config(None, [f"{KEY}=1"]).services.actor.generation_torch_threads == 1


@pytest.mark.parametrize("setting,during", [(None, 2), (1, 1), (3, 3)])
def test_generation_runs_at_its_threads_and_restores_the_actors(megatron_dist, arithmetic_tokenizer, setting, during):
    _, rollout = make_actor(arithmetic_tokenizer, *([] if setting is None else [f"{KEY}={setting}"]))
    seen, generate = [], rollout.engine.generate_sequences

    def recording(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return generate(*args, **kwargs)

    rollout.engine.generate_sequences = recording
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the actor's count (services.actor.torch_threads)
    try:
        gen = rollout.generate_sequences(prompts(arithmetic_tokenizer), SamplingParams(max_new_tokens=4, n=2, seed=0))
        assert seen == [during] and torch.get_num_threads() == 2
        assert gen["responses"].shape == (8, 4)
    finally:
        torch.set_num_threads(before)
