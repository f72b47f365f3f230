"""Loading a run's config: defaults [<- verl's defaults] <- YAML file <- overrides, then validate().

The user's settings are flattened to dotted keys and classified at once (verl_compat.translate):
Tandem's keys and verl's keys of the same meaning are kept, verl keys Tandem covers otherwise are
mapped (a notice each), the rest are refused or unknown. Overrides follow Hydra's grammar
(overrides.py); a run named by verl's config starts from verl's defaults (verl_base.py). Every
problem of a config (bad overrides, unknown or refused keys, values of the wrong type, failed value
checks, and with `files` the data, model and tokenizer files) is reported in one ConfigError, one
per line. `~` in path keys is expanded. to_yaml() writes the resolved file the services read.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tandem.config.checks import problems_of
from tandem.config.errors import ConfigError, raise_all
from tandem.config.overrides import parse_overrides
from tandem.config.paths import path_problems
from tandem.config.resolve import resolve
from tandem.config.schema import TandemConfig
from tandem.config.verl_base import VERL_CONFIG_NAMES, base_settings
from tandem.config.verl_compat import TandemKeys, Translation, flatten, overlaps, schema, translate
from tandem.config.yaml_file import check_yaml_file

# keys holding local paths (a file, a directory, or a list of files): `~` is expanded
PATH_KEYS = ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path", "data.train_files",
             "data.val_files", "trainer.default_local_dir", "trainer.resume_from_path")


def _nested(flat: dict) -> dict:
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[leaf] = copy.deepcopy(value)  # children may be added into it: never into a caller's dict
    return out


@dataclass
class _Settings:
    """What the user set, flat (a later setting wins), and what they deleted (`~key`)."""
    user: dict = field(default_factory=dict)
    deleted: set = field(default_factory=set)
    verl_base: bool = False  # the YAML's Hydra `defaults:` name verl's config
    notices: list = field(default_factory=list)

    def set(self, flat: dict) -> None:
        for key in flat:  # a later setting replaces what was set above or below it (`a={x: 1}` then `a=2`)
            self.deleted.discard(key)
            for k in [k for k in self.user if overlaps(k, key)]:
                del self.user[k]
        self.user.update(flat)

    def delete(self, key: str) -> None:
        for k in [k for k in self.user if k == key or k.startswith(key + ".")]:
            del self.user[k]
        self.deleted.add(key)


def _hydra_sections(layer: DictConfig, settings: _Settings, problems: list[str]) -> DictConfig:
    """A Hydra-style YAML's `defaults:` (verl's config as the base) and `hydra:` (not used) taken out."""
    if "defaults" in layer:
        entries = OmegaConf.to_container(layer.defaults)
        for entry in entries if isinstance(entries, list) else [entries]:
            if entry in VERL_CONFIG_NAMES:
                settings.verl_base = True
            elif entry != "_self_":
                problems.append(f"defaults entry {entry!r}: Tandem reads one YAML file; of Hydra's config "
                                f"composition it takes verl's own config ({', '.join(VERL_CONFIG_NAMES)}) only")
        layer = OmegaConf.masked_copy(layer, [k for k in layer if k != "defaults"])
    if "hydra" in layer:
        settings.notices.append("the YAML's hydra: section (Hydra's own output and log directories) is not used")
        layer = OmegaConf.masked_copy(layer, [k for k in layer if k != "hydra"])
    return layer


def _user_settings(path: str | None, overrides: list[str], problems: list[str], text: str | None = None) -> _Settings:
    """The YAML file's (or YAML `text`'s) and the overrides' settings, in order."""
    settings = _Settings()
    for source, read in ((path, lambda: OmegaConf.load(path)), (text, lambda: OmegaConf.create(text))):
        if not source or not source.strip():
            continue
        if source is path:  # as YAML first: file, line and column, and a mapping of sections
            try:
                check_yaml_file(path)
            except ConfigError as e:
                problems.append(str(e))
                continue
        try:
            layer = read()
        except yaml.YAMLError as e:
            raise ConfigError(f"the config is not valid YAML: {' '.join(str(e).split())}") from None
        if not OmegaConf.is_dict(layer):
            raise ConfigError("the config is not a YAML mapping of sections (actor_rollout_ref:, data:, ...)")
        settings.set(flatten(_resolved(_hydra_sections(layer, settings, problems))))
    parsed = parse_overrides(overrides)
    problems += parsed.problems
    settings.notices += parsed.notices
    for o in parsed.overrides:
        if o.delete:
            settings.delete(o.key)
            continue
        try:
            settings.set(flatten(_resolved(OmegaConf.create(_nested({o.key: o.value})))))
        except OmegaConfBaseException as e:
            problems.append(f"override {o.key}={o.value!r}: {str(e).splitlines()[0]}")
    return settings


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
    merged = copy.deepcopy(base)
    for key, value in tandem.items():  # one at a time: a refused value leaves the node as it was
        try:
            OmegaConf.update(merged, key, copy.deepcopy(value), merge=True)
        except OmegaConfBaseException as e:
            problems.append(f"bad config value for {key!r}: {str(e).splitlines()[0]}")
    return merged


def _expand_home(merged: DictConfig) -> None:
    for key in PATH_KEYS:
        value = OmegaConf.select(merged, key)
        if isinstance(value, str):
            OmegaConf.update(merged, key, os.path.expanduser(value))
        elif value is not None and OmegaConf.is_list(value):
            OmegaConf.update(merged, key, [os.path.expanduser(str(v)) for v in value])


def load_config_with_notices(path: str | None = None, overrides: list[str] | None = None, *,
                             text: str | None = None, verl_config: str | None = None, files: bool = False,
                             problems: list[str] | None = None) -> tuple[TandemConfig, Translation]:
    """Defaults <- YAML file (or YAML `text`, e.g. a config sent over gRPC) <- overrides ->
    (validated TandemConfig, how each key was taken: its `notices` say what each mapped verl key
    became). verl_config: one of verl's config names (verl_base.VERL_CONFIG_NAMES): start from
    verl's defaults. files: check the files the config names too (where the controller runs).
    problems: ones found before (the command line), reported with the rest."""
    base = schema()
    problems = list(problems or [])
    settings = _user_settings(path, list(overrides or []), problems, text)
    user = settings.user
    keys = TandemKeys.of_schema()
    translation = translate(user, keys, verl_first=bool(verl_config or settings.verl_base))
    translation.notes += settings.notices
    problems += translation.problems
    tandem = dict(translation.tandem)
    if verl_config or settings.verl_base:
        tandem = {**base_settings(user, settings.deleted, keys), **tandem}
        translation.notes.append(f"started from verl's defaults ({verl_config or 'named by the YAML'}) for every "
                                 "key not set; see docs/coming-from-verl.md")
    if "trainer.total_epochs" in user and "trainer.total_training_steps" not in user:
        tandem["trainer.total_training_steps"] = None  # verl: epochs decide unless steps are set
    merged = _merge(base, tandem, problems)
    _expand_home(merged)
    cfg: TandemConfig = OmegaConf.to_object(merged)
    resolve(cfg)
    problems += problems_of(cfg)
    if files:
        problems += path_problems(cfg)
    raise_all(problems)
    return cfg, translation


def load_config(path: str | None = None, overrides: list[str] | None = None, *,
                text: str | None = None) -> TandemConfig:
    """Defaults <- YAML file (or YAML `text`) <- dotted overrides; returns a validated TandemConfig."""
    return load_config_with_notices(path, overrides, text=text)[0]


def to_yaml(cfg: TandemConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
