"""Loading a run's config: defaults <- YAML file <- dotted overrides, then validate().

The user's settings are flattened to dotted keys and classified at once (verl_compat.translate):
Tandem's keys and verl's keys of the same meaning are kept, verl keys Tandem covers otherwise are
mapped (a notice each), the rest are refused or unknown. Every problem of a config (unknown or
refused keys, values of the wrong type, failed value checks) is reported in one ConfigError, one
per line. `~` in path keys is expanded. to_yaml() writes the resolved file the services read.
"""
from __future__ import annotations

import os

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tandem.config.checks import problems_of
from tandem.config.errors import ConfigError
from tandem.config.schema import TandemConfig
from tandem.config.verl_compat import TandemKeys, Translation, flatten, translate

# keys holding local paths (a file, a directory, or a list of files): `~` is expanded
PATH_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "data.train_files",
             "data.val_files", "trainer.default_local_dir", "trainer.resume_from_path")


def _nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _user_settings(path: str | None, overrides: list[str], problems: list[str], text: str | None = None) -> dict:
    """The YAML file's (or YAML `text`'s) and the overrides' leaves, flat (an override wins)."""
    user: dict = {}
    if path:
        user.update(flatten(_resolved(OmegaConf.load(path))))
    if text and text.strip():
        try:
            layer = OmegaConf.create(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"the config is not valid YAML: {' '.join(str(e).split())}") from None
        if not OmegaConf.is_dict(layer):
            raise ConfigError("the config is not a YAML mapping of sections (actor_rollout_ref:, data:, ...)")
        user.update(flatten(_resolved(layer)))
    for o in overrides:
        if "=" not in o:
            problems.append(f"override {o!r} is not of the form key=value")
            continue
        try:
            user.update(flatten(_resolved(OmegaConf.from_dotlist([o]))))
        except OmegaConfBaseException as e:
            problems.append(f"override {o!r}: {str(e).splitlines()[0]}")
    return user


def _resolved(conf: DictConfig) -> DictConfig:
    """Interpolations resolved where they can be (a verl YAML refers to its own keys)."""
    try:
        return OmegaConf.create(OmegaConf.to_container(conf, resolve=True))
    except OmegaConfBaseException:
        return conf


def _merge(base: DictConfig, tandem: dict, problems: list[str]) -> DictConfig:
    """base <- the Tandem keys; a value of the wrong type is a problem naming its key (all of them)."""
    try:
        return OmegaConf.merge(base, _nested(tandem))
    except OmegaConfBaseException:
        pass
    good = {}
    for key, value in tandem.items():
        try:
            OmegaConf.merge(base, _nested({key: value}))
            good[key] = value
        except OmegaConfBaseException as e:
            problems.append(f"bad config value for {key!r}: {str(e).splitlines()[0]}")
    return OmegaConf.merge(base, _nested(good))


def _expand_home(merged: DictConfig) -> None:
    for key in PATH_KEYS:
        value = OmegaConf.select(merged, key)
        if isinstance(value, str):
            OmegaConf.update(merged, key, os.path.expanduser(value))
        elif value is not None and OmegaConf.is_list(value):
            OmegaConf.update(merged, key, [os.path.expanduser(str(v)) for v in value])


def load_config_with_notices(path: str | None = None, overrides: list[str] | None = None, *,
                             text: str | None = None) -> tuple[TandemConfig, Translation]:
    """Defaults <- YAML file (or YAML `text`, e.g. a config sent over gRPC) <- dotted overrides ->
    (validated TandemConfig, how each key was taken: its `notices` say what each mapped verl key
    became)."""
    base = OmegaConf.structured(TandemConfig)
    problems: list[str] = []
    user = _user_settings(path, list(overrides or []), problems, text)
    translation = translate(user, TandemKeys.of(base))
    problems += translation.problems
    tandem = dict(translation.tandem)
    if "trainer.total_epochs" in user and "trainer.total_training_steps" not in user:
        tandem["trainer.total_training_steps"] = None  # verl: epochs decide unless steps are set
    merged = _merge(base, tandem, problems)
    _expand_home(merged)
    cfg: TandemConfig = OmegaConf.to_object(merged)
    problems += problems_of(cfg)
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} config problems:\n" + "\n".join(f"- {p}" for p in problems))
    return cfg, translation


def load_config(path: str | None = None, overrides: list[str] | None = None, *,
                text: str | None = None) -> TandemConfig:
    """Defaults <- YAML file (or YAML `text`) <- dotted overrides; returns a validated TandemConfig."""
    return load_config_with_notices(path, overrides, text=text)[0]


def to_yaml(cfg: TandemConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
