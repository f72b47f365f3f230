"""Loading a run's config: defaults <- YAML file <- dotted overrides, then validate().

Unknown keys are errors that name the whole dotted key and the nearest known keys; a value
OmegaConf cannot convert names its key. to_yaml() writes the resolved file the services read.
"""
from __future__ import annotations

import difflib

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from tandem.config.checks import validate
from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig


def _known_keys(node, prefix="") -> list[str]:
    keys = []
    for k, v in node.items():
        path = f"{prefix}{k}"
        keys.append(path)
        if OmegaConf.is_dict(v):
            keys.extend(_known_keys(v, path + "."))
    return keys


FREE_FORM = ("override_transformer_config", "override_optimizer_config", "reward_kwargs")  # dict-valued: any key inside


def _under_free_form(key: str, known: list[str]) -> bool:
    """A key inside a dict-valued section (verl's override_*_config: checked by validate();
    custom_reward_function.reward_kwargs: the user's function's keyword arguments)."""
    for name in FREE_FORM:
        head, _, rest = key.rpartition(f".{name}.")
        if rest and f"{head}.{name}" in known:
            return True
    return False


def _unknown_key(key: str, known: list[str]) -> ConfigError:
    near = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def load_config(path: str | None = None, overrides: list[str] | None = None) -> TandemConfig:
    """Defaults <- YAML file <- dotted overrides; returns a validated TandemConfig."""
    base = OmegaConf.structured(TandemConfig)
    try:
        layers = [base]
        if path:
            layers.append(OmegaConf.load(path))
        if overrides:
            bad = [o for o in overrides if "=" not in o]
            if bad:
                raise ConfigError(f"override {bad[0]!r} is not of the form key=value")
            known = _known_keys(base)
            for o in overrides:  # name the whole dotted key (OmegaConf names only its first unknown part)
                key = o.split("=", 1)[0].strip()
                if key not in known and not _under_free_form(key, known):
                    raise _unknown_key(key, known)
            layers.append(OmegaConf.from_dotlist(overrides))
        merged = OmegaConf.merge(*layers)
    except ConfigKeyError as e:  # an unknown key in the YAML file
        raise _unknown_key(str(getattr(e, "full_key", None) or e), _known_keys(base)) from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        raise ConfigError(f"bad config value for {key!r}: {str(e).splitlines()[0]}") from None
    cfg: TandemConfig = OmegaConf.to_object(merged)
    validate(cfg)
    return cfg


def to_yaml(cfg: TandemConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
