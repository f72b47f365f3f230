"""Model families by Hugging Face architecture name: config.json <-> ModelShape, and weight tables.

A family is one module in tandem/models/families/ that defines `FAMILY = Family(...)`: its
config.json -> ModelShape rules, the shapes it can express, its config.json fields, and its
HF <-> megatron name table. This registry finds those modules by listing the package (modules
named `_*` hold what families share and are not families), so adding a family is adding one
file. They are imported on the first lookup, not when this module is: each family module
imports this one (for `Family` and `refuse`), and loading them here at import time would be a
circular import. Registration rules (STYLE.md habit 11): a duplicate architecture raises, and
an unknown one raises naming the known ones.

Every refusal is a ValueError in one format, `unsupported HF config: FIELD=VALUE (WHY); known
architectures: [...]`, from `refuse`.

Deliberately not here: reading safetensors, TP/EP gathers and the megatron model (tandem/convert,
tandem/models/build.py); which megatron parameters exist is the layer spec's, the tables only
name them.
"""
from __future__ import annotations

import importlib
import json
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from tandem.models import families
from tandem.models.mapping import Mapping
from tandem.models.spec import ModelShape


@dataclass(frozen=True)
class Family:
    """What Tandem knows about one HF architecture.

    shape_from_config(config dict) -> ModelShape, refusing what the megatron spec cannot express;
    check_shape(shape) refuses a shape this architecture cannot express (export, default table);
    config_from_shape(shape, dtype) -> config.json dict (after check_shape);
    mappings(shape, ep_rank, ep_size) -> every concrete mapping that expert-parallel rank holds.
    head: "lm" (a causal LM) or "scalar" (a sequence-classification model: one score per token,
    tandem/models/scalar_head.py).
    """
    architecture: str  # config.json "architectures", e.g. "LlamaForCausalLM"
    shape_from_config: Callable[[dict], ModelShape]
    check_shape: Callable[[ModelShape], None]
    config_from_shape: Callable[[ModelShape, str], dict]
    mappings: Callable[[ModelShape, int, int], list[Mapping]]
    head: str = "lm"


_FAMILIES: dict[str, Family] | None = None  # None until the first lookup loads families/


def _families() -> dict[str, Family]:
    global _FAMILIES
    if _FAMILIES is None:
        loaded: dict[str, Family] = {}  # built whole, then published: two first lookups cannot collide
        for info in pkgutil.iter_modules(families.__path__):
            if not info.name.startswith("_"):
                _add(loaded, importlib.import_module(f"{families.__name__}.{info.name}").FAMILY)
        _FAMILIES = loaded
    return _FAMILIES


def _add(into: dict[str, Family], family: Family) -> None:
    if family.architecture in into:
        raise ValueError(f"model family {family.architecture!r} is registered twice")
    into[family.architecture] = family


def register(family: Family) -> None:
    """Add a family (the built-in ones register themselves from families/); a duplicate raises."""
    _add(_families(), family)


def architectures() -> list[str]:
    """The registered architecture names, sorted."""
    return sorted(_families())


def refuse(field: str, value, why: str) -> NoReturn:
    """Raise the one ValueError format for a config.json field (or shape) Tandem cannot load."""
    raise ValueError(f"unsupported HF config: {field}={value!r} ({why}); "
                     f"known architectures: {architectures()}")


def family(architecture: str, why: str = "unknown architecture") -> Family:
    found = _families().get(architecture)
    if found is None:
        refuse("architecture", architecture, why)
    return found


def _as_dict(config) -> dict:
    return dict(config) if isinstance(config, dict) else config.to_dict()


def architecture_of(config) -> str:
    """The one registered architecture a config.json (dict or PretrainedConfig) names."""
    archs = _as_dict(config).get("architectures") or []
    if len(archs) != 1 or archs[0] not in _families():
        refuse("architectures", archs, "exactly one known architecture expected")
    return archs[0]


def shape_from_hf_config(config) -> ModelShape:
    """dict or transformers.PretrainedConfig -> ModelShape, by its architecture's rules."""
    c = _as_dict(config)
    return family(architecture_of(c)).shape_from_config(c)


def hf_config_from_shape(shape: ModelShape, architecture: str, dtype: str = "float32") -> dict:
    """ModelShape -> a config.json dict that transformers loads as `architecture`."""
    fam = family(architecture, why="cannot export")
    fam.check_shape(shape)
    return fam.config_from_shape(shape, dtype)


def default_architecture(shape: ModelShape) -> str:
    """The first registered family (families/ in name order) that can express `shape`: for the
    built-in ones, Qwen3-MoE for experts, else Qwen2 with a qkv bias, else Llama."""
    for fam in _families().values():
        try:
            fam.check_shape(shape)
        except ValueError:
            continue
        return fam.architecture
    refuse("shape", shape, "no registered architecture expresses it")


def weight_mappings(shape: ModelShape, ep_rank: int = 0, ep_size: int = 1,
                    architecture: str | None = None) -> list[Mapping]:
    """Every concrete HF <-> megatron mapping of `shape` (the family's table order, layers
    expanded) that expert-parallel rank `ep_rank` of `ep_size` holds; the family is
    `architecture`'s, or by default `default_architecture(shape)`'s."""
    fam = family(architecture if architecture is not None else default_architecture(shape))
    return fam.mappings(shape, ep_rank, ep_size)


def read_hf_config(model_dir: str) -> dict:
    """The config.json of a Hugging Face model directory, as a dict."""
    with open(os.path.join(model_dir, "config.json")) as f:
        return json.load(f)
