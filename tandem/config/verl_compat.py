"""A user's settings (YAML file + dotted overrides, flattened) -> Tandem keys, with every key classified.

Each dotted leaf key the user set is honoured (Tandem's key, or a verl key whose value is what Tandem
does), mapped (verl_keys.RULES: to Tandem keys, or to a Tandem mechanism, with a notice), refused
("verl key X is not supported by Tandem (why)") or unknown (neither Tandem's nor verl's: the nearest
names as a hint). translate() classifies every key at once, so one pass reports every problem.

Deliberately not here: the table of verl keys (verl_keys.py), merging into the schema and value
checks (load.py, checks/).
"""
from __future__ import annotations

import difflib
import fnmatch
import functools
import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from tandem.config.schema import TandemConfig
from tandem.config.verl_keys import HONOURED, MAPPED, REFUSED, RULES, Rule
from tandem.config.verl_values import BadValue

UNKNOWN = "unknown"
VERL_DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "verl_defaults.yaml")


@functools.cache
def verl_defaults() -> dict[str, Any]:
    """verl's Megatron trainer keys and their defaults (verl_defaults.yaml), flat."""
    return dict(OmegaConf.to_container(OmegaConf.load(VERL_DEFAULTS_FILE)))


def overlaps(a: str, b: str) -> bool:
    """The same dotted key, or one inside the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaf keys of a nested dict/DictConfig; lists and empty dicts are leaves."""
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=False)
    out: dict[str, Any] = {}
    for k, v in node.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@dataclass(frozen=True)
class TandemKeys:
    """What the schema offers: leaf keys with their defaults, dict-valued (free-form) keys, and
    the leaves that take null."""
    defaults: dict[str, Any]
    free_form: frozenset[str]
    optional: frozenset[str]

    @classmethod
    def of(cls, base: DictConfig) -> TandemKeys:
        defaults, free, optional = {}, set(), set()

        def walk(node: DictConfig, prefix: str) -> None:
            for k in node.keys():
                child, key = node._get_node(k), f"{prefix}{k}"
                if isinstance(child, DictConfig) and child._metadata.object_type in (None, dict):
                    free.add(key)
                    defaults[key] = OmegaConf.to_container(child)
                elif isinstance(child, DictConfig):
                    walk(child, key + ".")
                else:
                    defaults[key] = OmegaConf.to_container(child) if isinstance(child, ListConfig) else child._value()
                    if child._is_optional():
                        optional.add(key)
        walk(base, "")
        return cls(defaults, frozenset(free), frozenset(optional))

    @classmethod
    def of_schema(cls) -> TandemKeys:
        return _schema_keys()

    def has(self, key: str) -> bool:
        return key in self.defaults or self.under_free_form(key)

    def under_free_form(self, key: str) -> bool:
        return any(key.startswith(f + ".") for f in self.free_form)


@functools.cache
def schema() -> DictConfig:
    """TandemConfig as an OmegaConf node, built once (building it takes seconds); copy it to change it."""
    return OmegaConf.structured(TandemConfig)


@functools.cache
def _schema_keys() -> TandemKeys:
    return TandemKeys.of(schema())


@dataclass
class Outcome:
    key: str
    value: Any
    kind: str  # HONOURED, MAPPED, REFUSED or UNKNOWN
    message: str = ""  # mapped: the notice; refused / unknown: the problem
    updates: dict = field(default_factory=dict)  # Tandem keys to set
    verl_default: bool = False  # verl's default, and nothing to set: a mapped key then needs no notice


@dataclass
class Translation:
    tandem: dict[str, Any]  # Tandem dotted key -> value
    outcomes: list[Outcome]
    notes: list[str] = field(default_factory=list)  # notices not tied to one key (Hydra sections, verl's defaults)

    def of_kind(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    @property
    def problems(self) -> list[str]:
        return [o.message for o in self.outcomes if o.kind in (REFUSED, UNKNOWN)]

    @property
    def notices(self) -> list[str]:
        return [o.message for o in self.of_kind(MAPPED) if not o.verl_default] + self.notes


def rule_for(key: str, value: Any, tandem_key: bool) -> Rule | None:
    """The first rule matching `key` (on a key Tandem has, only a rule for that value)."""
    for rule in RULES:
        if not fnmatch.fnmatchcase(key, rule.pattern):
            continue
        if rule.when is not None and not rule.when(value):
            continue
        if tandem_key and rule.when is None:
            continue
        return rule
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal, and not a bool against a number (True is not 1 here)."""
    return a == b and isinstance(a, bool) == isinstance(b, bool)


def classify(key: str, value: Any, keys: TandemKeys, get) -> Outcome:
    """What one user setting becomes (`get(key)`: a key's effective value, for cross-key rules)."""
    tandem_key = keys.has(key)
    rule = rule_for(key, value, tandem_key and not keys.under_free_form(key))
    if rule is None and tandem_key:
        if value is None and key in keys.defaults and key not in keys.optional and key in verl_defaults():
            # a verl YAML's null (unset) on a key verl also has; null on a Tandem-only key stays an error
            return Outcome(key, value, MAPPED, f"{key}=null (verl: unset) -> Tandem's default "
                                               f"{keys.defaults[key]!r}", verl_default=verl_defaults().get(key) is None)
        return Outcome(key, value, HONOURED, updates={key: value})
    if rule is None:
        return Outcome(key, value, UNKNOWN, unknown_key_message(key, keys))
    if rule.kind == REFUSED:
        accepted = (verl_defaults().get(key, _NOTHING), *rule.accept)
        if any(_same(value, a) for a in accepted):
            return Outcome(key, value, HONOURED)
        return Outcome(key, value, REFUSED, refusal(key, value, rule.why))
    try:
        updates = rule.apply(value, get) if rule.apply else {}
    except BadValue as e:  # an empty, null or list count: the key is fine, its value is not
        return Outcome(key, value, REFUSED, f"{key}: {e}")
    except (ValueError, TypeError) as e:
        return Outcome(key, value, REFUSED, refusal(key, value, str(e)))
    return Outcome(key, value, MAPPED, f"verl key {key}={value!r} -> {rule.why}", updates,
                   verl_default=not updates and _same(value, verl_defaults().get(key, _NOTHING)))


_NOTHING = object()


def refusal(key: str, value: Any, why: str) -> str:
    return f"verl key {key!r} is not supported by Tandem ({key}={value!r}: {why})"


def translate(user: dict[str, Any], keys: TandemKeys, verl_first: bool = False) -> Translation:
    """Classify every user setting; Tandem keys set directly win over those a mapping sets.
    verl_first: a key the user did not set has verl's default before Tandem's (a run started from
    verl's defaults), as the rules that read other keys must see."""
    def get(key: str) -> Any:
        if key in user:
            return user[key]
        if verl_first and key in verl_defaults():
            return verl_defaults()[key]
        return keys.defaults[key] if key in keys.defaults else verl_defaults().get(key)

    outcomes = [classify(k, v, keys, get) for k, v in user.items()]
    tandem: dict[str, Any] = {}
    for o in outcomes:
        if o.kind == MAPPED:
            for k, v in o.updates.items():
                tandem.setdefault(k, v)
    for o in outcomes:
        if o.kind == HONOURED:
            tandem.update(o.updates)
    return Translation(tandem, outcomes)


# ---- unknown keys -------------------------------------------------------------------------------

def nearest_keys(key: str, candidates: list[str], n: int = 3) -> list[str]:
    """Close names for a key: siblings with a similar last name, else keys ending in the same name,
    else whole keys that are nearly the same."""
    parent, _, leaf = key.rpartition(".")
    joined = f"{parent.rpartition('.')[0]}.{parent.rpartition('.')[2]}_{leaf}".lstrip(".")
    if joined in candidates:  # verl's older nested names: actor.kl_loss.coef -> actor.kl_loss_coef
        return [joined]
    siblings = {c.rpartition(".")[2]: c for c in candidates if c.rpartition(".")[0] == parent}
    near = difflib.get_close_matches(leaf, list(siblings), n=n, cutoff=0.6)
    if near:
        return [siblings[s] for s in near]
    same_leaf = [c for c in candidates if c.rpartition(".")[2] == leaf]
    if same_leaf:
        return sorted(same_leaf)[:n]
    return difflib.get_close_matches(key, candidates, n=n, cutoff=0.8)


def unknown_key_message(key: str, keys: TandemKeys) -> str:
    candidates = sorted(set(keys.defaults) | set(verl_defaults()))
    near = nearest_keys(key, candidates)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return f"unknown config key {key!r} (neither Tandem's nor verl's){hint}"


# ---- docs/coming-from-verl.md's lists ---------------------------------------------------------------

def rules_markdown() -> str:
    """docs/coming-from-verl.md's three groups: verl keys Tandem has (honoured), mapped, refused (python -m
    prints them)."""
    keys = TandemKeys.of_schema()
    same = sorted(k for k in verl_defaults() if k in keys.defaults or
                  (keys.under_free_form(k) and rule_for(k, _NOTHING, False) is None))
    lines = ["Honoured (Tandem's key, verl's meaning):", "", *(f"- `{k}`" for k in same), "",
             "| verl key | mapped to |", "| --- | --- |"]
    lines += [f"| `{r.pattern}`{' (' + _when_text(r) + ')' if r.when else ''} | {_cell(r.why)} |"
              for r in RULES if r.kind == MAPPED]
    lines += ["", "| verl key | refused (verl's default, and any value listed, is accepted: Tandem does that) |",
              "| --- | --- |"]
    lines += [f"| `{r.pattern}` | {_cell(r.why)}{'; accepted: ' + ', '.join(map(repr, r.accept)) if r.accept else ''} |"
              for r in RULES if r.kind == REFUSED]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _when_text(rule: Rule) -> str:
    return {"trainer.save_freq": "-1", "trainer.test_freq": "-1", "actor_rollout_ref.rollout.mode": "sync, async",
            "algorithm.rollout_correction.rollout_is": "set", "trainer.logger": "a string",
            "actor_rollout_ref.rollout.tensor_model_parallel_size": "> 1",
            "async_training.staleness_threshold": "a fraction"}.get(rule.pattern, "some values")


if __name__ == "__main__":
    print(rules_markdown(), end="")
