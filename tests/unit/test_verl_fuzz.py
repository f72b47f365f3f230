"""verl's keys with values of every kind (empty, null, lists, wrong types) through `tandem run`'s loader:
a config error naming what is wrong, never a traceback (hypothesis; a modest example count)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.config import ConfigError, load_config_with_notices
from tandem.config.verl_compat import TandemKeys, verl_defaults

KEYS = sorted(set(verl_defaults()) | set(TandemKeys.of_schema().defaults))
# what shells, scripts and YAML hand over: empty (an unset variable), null, lists, numbers, words, paths
VALUES = ["", "null", "0", "-1", "1", "8", "0.5", "1e-6", "true", "False", "abc", "[]", "[1,2]", "[a,b]", "{}",
          "{a: 1}", "'x y'", "a,b", "~/x", "${data.seed}", "inf", "[null]", "'[console,wandb]'"]
FORMS = ["{k}={v}", "+{k}={v}", "++{k}={v}", "~{k}", "{k}"]

override = st.builds(lambda form, key, value: form.format(k=key, v=value),
                     st.sampled_from(FORMS), st.sampled_from(KEYS), st.sampled_from(VALUES))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(override, min_size=1, max_size=6), st.booleans())
def test_any_verl_key_with_any_value_is_a_config_error_or_a_config(overrides, verl_base):
    try:
        load_config_with_notices(None, overrides, verl_config="ppo_megatron_trainer" if verl_base else None,
                                 files=True)
    except ConfigError as e:
        assert str(e).strip(), overrides
