"""async_training's keys: each bad value is a ConfigError naming its key; a colocated rollout
stays synchronous; one_step_off's fixed bounds."""
import pytest

from tandem.config import ConfigError, load_config
from tandem.controller.async_train import bounds_of

STANDALONE = "actor_rollout_ref.rollout.mode=standalone"


@pytest.mark.parametrize("override,key", [
    ("async_training.mode=overlap", "async_training.mode"),
    ("async_training.on_stale=skip", "async_training.on_stale"),
    ("async_training.staleness_threshold=-1", "async_training.staleness_threshold"),
    ("async_training.max_inflight_batches=0", "async_training.max_inflight_batches"),
])
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [STANDALONE, override])


@pytest.mark.parametrize("mode", ["one_step_off", "fully_async"])
def test_colocated_rollout_stays_synchronous(mode):
    with pytest.raises(ConfigError, match=r"async_training\.mode: .*standalone"):
        load_config(None, ["actor_rollout_ref.rollout.mode=colocated", f"async_training.mode={mode}"])
    assert load_config(None, [STANDALONE, f"async_training.mode={mode}"]).async_training.mode == mode


def test_bounds():
    one = bounds_of(load_config(None, [STANDALONE, "async_training.mode=one_step_off",
                                       "async_training.staleness_threshold=4"]))
    assert (one.staleness, one.max_ahead, one.on_stale) == (1, 1, "wait")  # verl's recipe, whatever the keys say
    full = bounds_of(load_config(None, [STANDALONE, "async_training.mode=fully_async", "async_training.staleness_threshold=3",
                                        "async_training.max_inflight_batches=4", "async_training.on_stale=drop"]))
    assert (full.staleness, full.max_ahead, full.on_stale) == (3, 4, "drop")
