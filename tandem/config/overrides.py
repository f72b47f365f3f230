"""Command-line overrides in Hydra's own grammar (hydra-core's OverridesParser), as verl reads them.

- `key=value`, `+key=value`, `++key=value` set a key: Tandem's config is one schema, so adding a key
  (verl's `+` for keys its YAML lacks) and changing one are the same;
- `~key` (and `~key=value`) drops what was set for the key before, so the default applies again;
- values follow Hydra: `1e-6` is a float, `[a,b]` a list, `{a: 1}` a dict, `null` None, `'x y'` a
  string; an empty value (`key=`, an unset shell variable) is the empty string; `a,b` (Hydra's
  sweep) is the string "a,b", as Tandem's comma-separated keys take it: a run is one job.

A value starting with `~` is a path under $HOME (Tandem's rule; Hydra's grammar would need it quoted).
Every override that cannot be taken is a problem naming it; nothing here knows what keys mean
(verl_compat.py classifies them).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"


@dataclass(frozen=True)
class Override:
    key: str
    value: Any = None
    delete: bool = False  # `~key`: forget the key's earlier settings


@dataclass
class ParsedOverrides:
    overrides: list[Override] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def _home_paths_quoted(text: str) -> str:
    """`key=~/x` -> `key='~/x'`: Hydra's grammar reserves a leading `~` for deletions."""
    key, eq, value = text.partition("=")
    if not eq or not value.startswith("~"):
        return text
    for quote in ("'", '"'):
        if quote not in value:
            return f"{key}={quote}{value}{quote}"
    return text


def _syntax_error(text: str, error: Exception) -> str:
    lines = [x.strip() for x in str(error).splitlines() if x.strip()]
    reason = next((x for x in lines if not x.startswith(("Error parsing override", "See "))), "not understood")
    hint = " (an override is key=value)" if "=" not in text and not text.startswith("~") else \
        " (quote a value holding spaces or brackets: key='value')"
    return f"override {text!r} is not valid override syntax: {reason}{hint}; the grammar: {GRAMMAR}"


def parse_overrides(texts: list[str]) -> ParsedOverrides:
    """Each override as an Override; a problem for each one that cannot be taken (all of them)."""
    out = ParsedOverrides()
    for text in texts:
        try:
            parsed = _parser().parse_override(_home_paths_quoted(text))
        except Exception as e:  # hydra's OverrideParseException, and antlr's errors under it
            out.problems.append(_syntax_error(text, e))
            continue
        key = parsed.key_or_group
        if parsed.package is not None:
            out.problems.append(f"override {text!r}: package overrides (key@package) choose where verl's config "
                                "groups land; Tandem's config has no groups: set the dotted key")
        elif "/" in key:
            out.problems.append(f"override {text!r}: config-group overrides (group/name=option) pick one of verl's "
                                "YAML files; Tandem's config has no groups: set the dotted keys you need")
        elif parsed.is_sweep_override() and getattr(parsed.value(), "simple_form", False):
            # `a,b`: Hydra's sweep, Tandem's comma-separated string (services.<role>.devices=0,1)
            out.overrides.append(Override(key, text.partition("=")[2]))
        elif parsed.is_sweep_override():
            out.problems.append(f"override {text!r} is a sweep (Hydra's choice, range, interval or glob) and "
                                "tandem run runs one job: give one value")
        elif key == "hydra" or key.startswith("hydra."):
            out.notices.append(f"{text}: Hydra's own settings (its output and log directories) are not used; "
                               "a run writes under trainer.default_local_dir")
        elif parsed.is_delete():
            out.overrides.append(Override(key, delete=True))
        else:
            out.overrides.append(Override(key, parsed.value()))
    return out
