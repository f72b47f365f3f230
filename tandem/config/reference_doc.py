"""docs/config-reference.md, generated from the schema: every key, its default and its meaning.

The meaning of a key is the comment written with its field in schema.py or services_schema.py: the
comment lines right above the field and the comment after it on its own line. A section's line of
prose is the comment on its class line, else on the field that holds it. A dataclass used at several
places (the optimizer under the actor and the critic, a service's endpoint under every role) is one
section: where its paths differ in one part only that part is `*`, else the others are listed, with
any default that differs there.

    python -m tandem.config.reference_doc --write    # regenerate the page
    python -m tandem.config.reference_doc --check    # exit 1 when the page differs (tests do this too)
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import io
import json
import pathlib
import sys
import textwrap
import tokenize
from typing import Any

from tandem.config import schema, services_schema
from tandem.config.schema import TandemConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config-reference.md"
SOURCES = (schema, services_schema)


@dataclasses.dataclass
class Comments:
    classes: dict[str, str]  # class name -> the comment on its `class` line
    fields: dict[tuple[str, str], str]  # (class name, field name) -> the comment above and after the field


def read_comments() -> Comments:
    classes: dict[str, str] = {}
    fields: dict[tuple[str, str], str] = {}
    for module in SOURCES:
        source = pathlib.Path(module.__file__).read_text()
        by_line: dict[int, str] = {}
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                by_line[tok.start[0]] = _comment_text(tok.string)
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            classes[node.name] = by_line.get(node.lineno, "")
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    above = []
                    n = stmt.lineno - 1
                    while n >= 1 and lines[n - 1].strip().startswith("#"):
                        above.insert(0, by_line[n])
                        n -= 1
                    after = [by_line[n] for n in range(stmt.lineno, stmt.end_lineno + 1) if n in by_line]
                    fields[(node.name, stmt.target.id)] = " ".join(t for t in above + after if t)
    return Comments(classes, fields)


def _comment_text(comment: str) -> str:
    text = comment.lstrip("#").strip()
    return "" if text.startswith("noqa") else text.split("  # noqa")[0]


@dataclasses.dataclass
class Section:
    cls: type
    paths: list[str]
    values: list[Any]  # the dataclass instance at each path
    intro: str = ""


def sections() -> list[Section]:
    """Every dataclass of the schema with the paths it is used at, in the order a walk first meets it."""
    comments = read_comments()
    found: dict[type, Section] = {}

    def walk(value: Any, path: str, holder_comment: str) -> None:
        cls = type(value)
        section = found.get(cls)
        if section is None:
            intro = comments.classes.get(cls.__name__) or holder_comment
            section = found[cls] = Section(cls, [], [], intro)
        section.paths.append(path)
        section.values.append(value)
        for f in dataclasses.fields(value):
            child = getattr(value, f.name)
            if dataclasses.is_dataclass(child):
                walk(child, f"{path}.{f.name}" if path else f.name, comments.fields.get((cls.__name__, f.name), ""))

    walk(TandemConfig(), "", "")
    return [s for s in found.values() if s.paths != [""]]


def missing_meanings() -> list[str]:
    """Keys whose field has no comment: the page would show them without a meaning."""
    comments = read_comments()
    return [f"{s.cls.__name__}.{f.name}" for s in sections() for f in dataclasses.fields(s.cls)
            if not dataclasses.is_dataclass(getattr(s.values[0], f.name))
            and not comments.fields.get((s.cls.__name__, f.name))]


def reference_markdown() -> str:
    comments = read_comments()
    out = [
        "# Configuration reference",
        "",
        "Every key of a run's config, its default and what it means. This page is generated from the schema",
        "(`tandem/config/schema.py`, `tandem/config/services_schema.py`): each meaning is the comment next to",
        "its field. Regenerate it with `python -m tandem.config.reference_doc --write`;",
        "`tests/unit/test_config_reference.py` fails when it differs from the schema.",
        "",
        "How configs load, override and are checked: [configuration.md](configuration.md). verl's keys and how",
        "each maps: [coming-from-verl.md](coming-from-verl.md). Values the loader resolves (`auto`, `null`",
        "meaning another key's value) are explained in the key's meaning.",
        "",
    ]
    for s in sections():
        leaves = [f for f in dataclasses.fields(s.cls) if not dataclasses.is_dataclass(getattr(s.values[0], f.name))]
        if not leaves:
            continue
        name, others, star = _section_name(s.paths)
        out += [f"## `{name}`", ""]
        if s.intro:
            out += [_wrapped(_sentence(s.intro)), ""]
        if star:
            out += [_wrapped(f"`*` is one of: {', '.join(f'`{v}`' for v in star)}."), ""]
        elif others:
            out += [_wrapped(f"The same keys under {', '.join(f'`{p}`' for p in others)}."), ""]
        shown = s.cls() if star else s.values[0]  # `*`: the class's defaults, and every path that differs
        differ = _differing_defaults(s, shown, skip_first=not star)
        if differ:
            out += ["Where a default differs:", ""] + [f"- `{k}`: `{v}`" for k, v in differ] + [""]
        out += ["| key | default | meaning |", "| --- | --- | --- |"]
        for f in leaves:
            value = getattr(shown, f.name)
            meaning = comments.fields.get((s.cls.__name__, f.name), "").replace("|", "\\|")
            out.append(f"| `{name}.{f.name}` | `{_shown(value)}` | {meaning} |")
        out.append("")
    return "\n".join(out)


def _section_name(paths: list[str]) -> tuple[str, list[str], list[str]]:
    """(the name shown, the other paths, the values of the part shown as `*`)."""
    if len(paths) == 1:
        return paths[0], [], []
    parts = [p.split(".") for p in paths]
    if len({len(p) for p in parts}) == 1:
        differing = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
        if len(differing) == 1:
            i = differing[0]
            return ".".join(parts[0][:i] + ["*"] + parts[0][i + 1:]), [], [p[i] for p in parts]
    return paths[0], paths[1:], []


def _differing_defaults(s: Section, shown: Any, skip_first: bool) -> list[tuple[str, str]]:
    out = []
    for path, value in list(zip(s.paths, s.values))[skip_first:]:
        for f in dataclasses.fields(s.cls):
            mine, first = getattr(value, f.name), getattr(shown, f.name)
            if not dataclasses.is_dataclass(mine) and mine != first:
                out.append((f"{path}.{f.name}", _shown(mine)))
    return out


def _shown(value: Any) -> str:
    return json.dumps(value)


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=110, break_long_words=False, break_on_hyphens=False)


def _sentence(text: str) -> str:
    first = text if text.startswith("verl") else text[0].upper() + text[1:]
    return first + ("" if text.endswith(".") else ".")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)}")
    g.add_argument("--check", action="store_true", help="exit 1 when the page is not what the schema gives")
    a = p.parse_args(argv)
    text = reference_markdown()
    if a.write:
        PAGE.parent.mkdir(exist_ok=True)
        PAGE.write_text(text)
        return 0
    if not PAGE.exists() or PAGE.read_text() != text:
        print(f"{PAGE.relative_to(ROOT)} is stale: python -m tandem.config.reference_doc --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
