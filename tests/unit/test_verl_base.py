"""Defaults a verl user expects (tandem/config/verl_base.py): a run named by verl's config starts from
verl's defaults (verl's interpolations followed, Tandem's own choices where it cannot take verl's),
every default of Tandem's that differs from verl's says why, and docs/coming-from-verl.md's table is the code's."""
import pathlib

from tandem.config import load_config_with_notices
from tandem.config.verl_base import DIFFERENCES, NOT_TAKEN, SAME, defaults_markdown, differing_keys
from tandem.config.verl_compat import TandemKeys, verl_defaults

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILT_IN_SHAPE = ["actor_rollout_ref.model.path=null", "actor_rollout_ref.model.max_position_embeddings=2048"]


def test_every_differing_default_says_why_and_the_docs_show_them():
    keys = TandemKeys.of_schema()
    differing = differing_keys()
    assert set(DIFFERENCES) == set(differing), set(DIFFERENCES) ^ set(differing)
    assert all(keys.defaults[k] == v for k, v in verl_defaults().items()
               if k in keys.defaults and k not in differing and k not in SAME)  # control: the rest are equal
    assert set(NOT_TAKEN) <= set(differing) and all(DIFFERENCES[k] for k in differing)
    assert defaults_markdown() in (ROOT / "docs" / "coming-from-verl.md").read_text(), \
        "regenerate docs/coming-from-verl.md's table of defaults: python -m tandem.config.verl_base"


def test_a_run_named_by_verls_config_starts_from_verls_defaults():
    plain, _ = load_config_with_notices(None, BUILT_IN_SHAPE)
    cfg, taken = load_config_with_notices(None, [*BUILT_IN_SHAPE, "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                                                 "data.max_prompt_length=100", "algorithm.adv_estimator=grpo",
                                                 "actor_rollout_ref.rollout.n=4", "~trainer.logger"],
                                          verl_config="ppo_megatron_trainer")
    a, c, t = cfg.actor_rollout_ref.actor, cfg.critic, cfg.trainer
    # verl's where unset, the user's where set
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, cfg.data.train_batch_size) == (100, 512, 1024)
    assert (a.optim.lr, a.optim.weight_decay, a.megatron.seed, a.megatron.use_distributed_optimizer) == \
        (1e-6, 0.01, 42, True)
    assert (t.total_epochs, t.total_training_steps, t.save_freq, t.test_freq) == (30, None, -1, 0)
    assert cfg.services.actor.world_size == 8 and not cfg.data.filter_overlong_prompts
    # verl's interpolations follow the user's value; a deleted key is Tandem's default again
    assert (c.ppo_mini_batch_size, c.forward_max_token_len_per_gpu) == (32, c.ppo_max_token_len_per_gpu)
    assert t.logger == plain.trainer.logger
    # what Tandem does not take from verl: its dtype choice, generation at the actor's TP
    assert a.megatron.dtype == "auto" and cfg.actor_rollout_ref.rollout.tensor_model_parallel_size is None
    assert plain.data.max_prompt_length == 16 and plain.trainer.total_training_steps == 120  # control
    assert any(n.startswith("started from verl's defaults") for n in taken.notices)
