"""Reward rules by name, and which rule a dataset row's ``data_source`` selects.

A registry is a dict with rules (STYLE 9.2 habit 11): ``register_rule`` refuses
duplicates, ``get_rule`` names the known rules when asked for an unknown one.
The built-in rules are stdlib-only modules, so they are imported eagerly;
there is nothing heavy to defer.

``rule_for_data_source`` maps verl's ``data_source`` strings (as written by
verl's ``examples/data_preprocess`` scripts) to rule names. It does not
reproduce every verl scorer: verl's ``math_dapo`` ("Answer:" line, +-1 reward)
and ``prime_math`` (sympy) sources are scored here with the boxed-string rule.
"""

from __future__ import annotations

from collections.abc import Callable

from tandem.services.reward.rules.arithmetic import score_exact_match, score_final_answer
from tandem.services.reward.rules.gsm8k import score_gsm8k
from tandem.services.reward.rules.math_boxed import score_math_boxed

RewardRule = Callable[..., list[float | None]]
"""``fn(responses: list[str], ground_truths: list[str], **columns) -> list[float | None]``."""

REWARD_RULES: dict[str, RewardRule] = {}

# verl data_source -> rule name. Exact matches; see rule_for_data_source for prefixes.
DATA_SOURCE_RULES: dict[str, str] = {
    "tandem/arithmetic": "arithmetic",
    "tandem/arithmetic_tool": "arithmetic_tool",
    "openai/gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math_dapo": "math",
    "math": "math",
    "numina_aops_forum": "math",
    "numina_synthetic_math": "math",
    "numina_amc_aime": "math",
    "numina_synthetic_amc": "math",
    "numina_cn_k12": "math",
    "numina_olympiads": "math",
}
# verl routes every "aime*" source (aime2024, aime_2025, ...) to its math scorer.
_PREFIX_RULES: tuple[tuple[str, str], ...] = (("aime", "math"),)


def register_rule(name: str, fn: RewardRule) -> None:
    """Register ``fn`` under ``name``; raises ValueError if the name is taken."""
    if not name or not isinstance(name, str):
        raise ValueError(f"reward rule name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"reward rule {name!r} must be callable, got {type(fn).__name__}")
    if name in REWARD_RULES:
        raise ValueError(f"reward rule {name!r} is already registered (to {REWARD_RULES[name].__qualname__})")
    REWARD_RULES[name] = fn


def get_rule(name: str) -> RewardRule:
    """The rule registered as ``name``; ValueError listing the known names otherwise."""
    try:
        return REWARD_RULES[name]
    except KeyError:
        raise ValueError(f"unknown reward rule {name!r}; known rules: {sorted(REWARD_RULES)}") from None


def rule_for_data_source(data_source: str | None, default: str) -> str:
    """Rule name for a verl ``data_source``; unknown or empty sources get ``default``.

    Lookup order: the exact table above, then known prefixes ("aime"), then a
    ``data_source`` that is itself a registered rule name (so a plug-in rule
    registered as "my_rule" is selected by rows with ``data_source="my_rule"``),
    then ``default``. ``default`` must be a registered rule.
    """
    get_rule(default)
    if not data_source:
        return default
    if data_source in DATA_SOURCE_RULES:
        return DATA_SOURCE_RULES[data_source]
    for prefix, name in _PREFIX_RULES:
        if data_source.startswith(prefix):
            return name
    if data_source in REWARD_RULES:
        return data_source
    return default


def _register_builtins() -> None:
    builtins: dict[str, RewardRule] = {
        "arithmetic": score_exact_match,
        "arithmetic_tool": score_final_answer,
        "gsm8k": score_gsm8k,
        "math": score_math_boxed,
    }
    for name, fn in builtins.items():
        register_rule(name, fn)


_register_builtins()
