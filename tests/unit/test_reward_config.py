"""Config checks of the reward keys and of each endpoint's TLS and token: every bad value is a
ConfigError naming the dotted key (and never the token)."""
import pytest
from tiny_hf import tiny_llama, tiny_reward_model

from tandem.config import ConfigError, load_config

FN = "tests/helpers/verl_reward_fn.py"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"rm": tiny_reward_model(root / "rm"), "lm": tiny_llama(root / "lm")}


def _error(overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    return str(e.value)


def test_reward_keys(models):
    assert load_config(None, ["reward_model.enable=true", f"reward_model.model.path={models['rm']}"]).reward_model.enable
    cases = [
        (["reward_model.on_failure=ignore"], "reward_model.on_failure: 'ignore'; known: ['fail', 'drop']"),
        (["reward_model.timeout_s=0"], "reward_model.timeout_s: must be > 0"),
        (["reward_model.max_retries=-1"], "reward_model.max_retries: must be >= 0"),
        (["reward_model.enable=true"], "reward_model.model.path: must be set when reward_model.enable=true"),
        (["reward_model.enable=true", f"reward_model.model.path={models['lm']}"],
         "reward_model.model.path: LlamaForCausalLM is not a sequence-classification model (known: "
         "['LlamaForSequenceClassification', 'Qwen2ForSequenceClassification'])"),
        (["reward_model.enable=true", f"reward_model.model.path={models['rm']}", "services.reward.endpoint=h:1"],
         "services.reward.endpoint: reward_model.enable hosts the reward model"),
        (["custom_reward_function.path=/no/such.py"], "custom_reward_function.path: '/no/such.py' is not a Python file"),
        ([f"custom_reward_function.path={FN}", "custom_reward_function.name=not a name"],
         "custom_reward_function.name: 'not a name' is not a Python name"),
        ([f"custom_reward_function.path={FN}", "custom_reward_function.timeout_s=0"],
         "custom_reward_function.timeout_s: must be > 0"),
    ]
    for overrides, message in cases:
        assert _error(overrides).startswith(message), overrides


def test_endpoint_security_keys(tmp_path, monkeypatch):
    token = tmp_path / "t"
    token.write_text("s3cret")
    monkeypatch.delenv("TANDEM_NO_SUCH_TOKEN", raising=False)
    cases = [
        (["services.reward.tls.enable=true"], "services.reward.tls.cert_file: must be set (the service is started here"),
        (["services.actor.tls.client_auth=true"], "services.actor.tls.client_auth: needs tls.enable=true"),
        (["services.critic.auth.token_env=TANDEM_NO_SUCH_TOKEN"],
         "services.critic.auth.token_env: environment variable TANDEM_NO_SUCH_TOKEN is not set or empty"),
        ([f"services.rollout.auth.token_file={token}", "services.rollout.auth.token_env=X"],
         "services.rollout.auth: set token_file or token_env, not both"),
        ([f"services.actor.auth.token_file={tmp_path / 'missing'}"], "services.actor.auth.token_file: "),
        (["services.reward.auth.health_without_token=true"], "services.reward.auth.health_without_token: needs a token"),
        (["services.reward.host="], "2 config problems:\n- services.reward.host: must not be empty"),
        (["services.reward.tls.enable=true", f"services.reward.tls.cert_file={token}",
          f"services.reward.tls.key_file={token}", "services.reward.tls.client_auth=true"],
         "services.reward.tls.ca_file: must be set for tls.client_auth"),
    ]
    for overrides, message in cases:
        msg = _error(overrides)
        assert msg.startswith(message), (overrides, msg)
        assert "s3cret" not in msg
    # an attached service needs no certificate of its own here, only what the caller checks it with
    cfg = load_config(None, ["services.reward.endpoint=h:1", "services.reward.tls.enable=true",
                             f"services.reward.auth.token_file={token}"])
    assert cfg.services.reward.tls.cert_file is None and "s3cret" not in repr(cfg)
